"""Base config: model, mesh and the built-in default (tiny model, synthetic video).

Use: `paravt-jax forward --config=configs/base.py:tiny --config.model.dtype=bfloat16`.
The argument after ':' picks a model preset (tiny, small125m, 2b, 4b, 8b, 32b).
"""
import ml_collections


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict()
    c.model.preset = arg or "tiny"
    c.model.checkpoint = ""  # an HF checkpoint directory; empty = random init of the preset
    c.model.param_dtype = "float32"
    c.model.dtype = "float32"
    c.model.remat = False
    c.model.scan_layers = True
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
    # The built-in demo prompt: a short synthetic video.
    c.demo = ml_collections.ConfigDict(dict(frames=8, height=64, width=96, fps=2.0, repeats=5))
    return c
