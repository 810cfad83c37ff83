"""pipeplan api package."""
