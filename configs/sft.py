"""Cold-start SFT only (RL steps 0)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paragrpo  # noqa: E402


def get_config(arg: str = "tiny"):
    c = paragrpo.get_config(arg)
    c.rl.steps = 0
    return c
