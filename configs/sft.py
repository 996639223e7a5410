"""Cold-start SFT only (RL steps 0)."""

from paravt_jax.configs import paragrpo


def get_config(arg: str = "tiny"):
    c = paragrpo.get_config(arg)
    c.rl.steps = 0
    return c
