"""pipeplan's profiler: measures per-layer times and sizes (-> planner.profile.ModelProfile) and links."""
