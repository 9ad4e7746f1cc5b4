"""agenttest client: the CLI, input expansion, enqueueing, progress and the exit code."""
