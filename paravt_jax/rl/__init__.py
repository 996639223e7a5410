"""Reinforcement learning (PARA-GRPO): the step's shapes, advantages, the policy loss and the
trainer. The rewards it learns from are paravt_jax/episodes'; nFrames gating is paravt_jax/data/gating.py."""
