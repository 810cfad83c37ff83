"""pipeplan's executor: torch models and (later) the pipeline runtime."""
