"""Finished episodes, scored and recorded: rewards (with the LLM judge and the answer metrics),
tool-use statistics, the episode logs. Below both the RL trainer (paravt_jax/rl), which learns
from the rewards, and the evaluations (paravt_jax/eval), which report them."""
