"""Vanilla GRPO baseline: PARA-GRPO with both parts off (anchor 0, gating off, no think
prefix), as the reference's baseline recipe."""

from paravt_jax.configs import paragrpo


def get_config(arg: str = "tiny"):
    c = paragrpo.get_config(arg)
    c.rl.advantage.anchor_weight = 0.0
    c.rl.advantage.anchor_mode = "sequence"
    c.rl.nframes_gating = False
    c.rl.rollout.prompt.think_prefix = False
    c.rl.reward.answer_suffix = False
    return c
