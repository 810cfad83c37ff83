"""pipeplan db package."""
