"""Tools (parsing, validation), the parallel crop dispatcher and the agent rollout."""
