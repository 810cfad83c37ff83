"""pipeplan: the command line that ties planner, profiler, executor and service together."""
