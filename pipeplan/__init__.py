"""pipeplan: the command-line front end of the planner."""
