"""Vanilla GRPO baseline: PARA-GRPO with both parts off (anchor 0, gating off, no think
prefix), as the reference's baseline recipe."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paragrpo  # noqa: E402


def get_config(arg: str = "tiny"):
    c = paragrpo.get_config(arg)
    c.rl.anchor_weight = 0.0
    c.rl.anchor_mode = "sequence"
    c.rl.nframes_gating = False
    c.rl.think_prefix = False
    c.rl.answer_suffix = False
    return c
