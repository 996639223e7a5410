"""Reinforcement learning (PARA-GRPO): rewards, metrics, nFrames gating, LLM judge, trainer."""
