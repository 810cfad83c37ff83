"""pipeplan's planner: schedule IR, simulator, cost model, partitioner and search (pure Python + numpy)."""
