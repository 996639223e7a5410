"""Attention's slow check: the tiny model's forward and gradients with blockwise attention equal
dense (the ops themselves: tests/unit/test_attention.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paravt_jax.models.qwen3_vl import init_model, preset


@pytest.mark.parametrize("attention", ["blockwise"])
def test_model_forward_and_gradient_independent_of_attention(attention):
    """The text decoder (a padded row) and the vision tower give the same logits and parameter
    gradients with `attention` as with dense."""
    from flax import nnx

    from paravt_jax.models.qwen3_vl.model import device_args, prepare_inputs

    rng = np.random.default_rng(6)
    dense_model = init_model(preset("tiny", attention="dense", attention_block=16), seed=0)
    other = init_model(preset("tiny", attention=attention, attention_block=16), seed=0)
    cfg = dense_model.config
    ids = rng.integers(0, 900, (2, 40)).astype(np.int32)
    ids[:, 5:9] = cfg.image_token_id  # 4 merged tokens = one 4x4-patch image per row
    mask = np.ones_like(ids)
    mask[1, 33:] = 0
    grid = np.array([[1, 4, 4], [1, 4, 4]])
    pixels = rng.standard_normal((32, cfg.vision.patch_dim)).astype(np.float32)
    args = device_args(prepare_inputs(cfg, ids, mask, pixel_values=pixels, image_grid_thw=grid))

    def run(model):
        graphdef, params = nnx.split(model)

        def loss(params):
            out = nnx.merge(graphdef, params).forward(*args)
            return jnp.sum(jnp.where(mask[..., None] > 0, out, 0) ** 2) * 1e-3, out

        (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
        return np.asarray(logits), grads

    (ld, gd), (lo, go) = run(dense_model), run(other)
    np.testing.assert_allclose(lo[mask > 0], ld[mask > 0], atol=1e-5)
    for a, b in zip(jax.tree.leaves(go), jax.tree.leaves(gd)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)
