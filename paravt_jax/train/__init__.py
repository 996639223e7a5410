"""The task-agnostic training engine: batches, the jitted step, the loop."""
