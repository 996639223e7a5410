"""The attention op (models/qwen3_vl/attention.py, blockwise.py, fused_attention.py): blockwise == dense for outputs and
gradients over every mask the codebase builds, no [T, T] array in the blockwise program, block
skipping, the cuDNN and splash argument mapping, and the per-backend choice."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paravt_jax.models.qwen3_vl import attention as A
from paravt_jax.models.qwen3_vl import blockwise as B
from paravt_jax.models.qwen3_vl import fused_attention as F
from paravt_jax.models.qwen3_vl import preset
from paravt_jax.models.qwen3_vl.attention_mask import AttentionMask
from paravt_jax.models.qwen3_vl.config import ConfigError


def segments_for(case: str, batch: int, length: int) -> np.ndarray:
    """Segment ids [B, L] (0 = padding) for a named mask case."""
    seg = np.ones((batch, length), np.int32)
    if case == "padded":
        seg[0, length - 7:] = 0
        seg[-1, length // 2:] = 0
    elif case == "packed":  # three sequences in row 0, two and padding in the last row
        seg[0, 11:25] = 2
        seg[0, 25:] = 3
        seg[-1, 20:] = 2
        seg[-1, length - 5:] = 0
    return seg


def inputs(seed, batch, length, heads, kv_heads, head_dim, dtype, key_length=None):
    rng = np.random.default_rng(seed)
    key_length = key_length or length
    q = jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), dtype)
    k = jnp.asarray(rng.standard_normal((batch, key_length, kv_heads, head_dim)), dtype)
    v = jnp.asarray(rng.standard_normal((batch, key_length, kv_heads, head_dim)), dtype)
    weight = jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), jnp.float32)
    return q, k, v, weight


def loss_and_grads(fn, q, k, v, weight, seen):
    """sum(out * weight) over queries that see a key (dense averages the values of the others,
    the memory-efficient kernels give zeros), its output and its q/k/v gradients."""
    def loss(q, k, v):
        out = fn(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * weight * seen[..., None, None]), out

    (value, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return value, np.where(seen[..., None, None], np.asarray(out, np.float32), 0), grads


CASES = [  # (mask case, length, heads, kv heads, block)
    ("causal", 64, 4, 4, 16),
    ("padded", 64, 4, 2, 16),
    ("packed", 64, 4, 2, 16),
    ("causal", 64, 8, 1, 32),  # GQA 8:1
    ("padded", 37, 4, 2, 16),  # odd length: 3 blocks, the last one partly padding
    ("packed", 45, 6, 2, 8),
]


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("case,length,heads,kv_heads,block", CASES)
def test_blockwise_equals_dense(case, length, heads, kv_heads, block, dtype, tol):
    batch, head_dim = 2, 16
    q, k, v, weight = inputs(0, batch, length, heads, kv_heads, head_dim, dtype)
    mask = AttentionMask.causal_segments(segments_for(case, batch, length), packed=case == "packed")
    seen = np.asarray(mask.query_segments > 0)
    dense = loss_and_grads(lambda q, k, v: A.dense_attention(q, k, v, mask.dense()), q, k, v, weight, seen)
    blockwise = loss_and_grads(lambda q, k, v: B.blockwise_attention(q, k, v, mask, block=block),
                               q, k, v, weight, seen)
    np.testing.assert_allclose(blockwise[1], dense[1], atol=tol, rtol=tol)
    for a, b in zip(blockwise[2], dense[2]):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tol, rtol=tol)


@pytest.mark.parametrize("cache_layout", [False, True])
def test_blockwise_cache_mask_equals_dense(cache_layout):
    """The sampler's mask: 24 queries at slots 16..39 over 40 cache slots, some empty."""
    batch, lq, lk, heads, kv_heads, head_dim = 3, 24, 40, 4, 2, 8
    q, k, v, _ = inputs(1, batch, lq, heads, kv_heads, head_dim, jnp.float32, key_length=lk)
    valid = np.random.default_rng(1).random((batch, lk)) < 0.7
    valid[:, 0] = True
    mask = AttentionMask.cache(jnp.asarray(valid), (lk - lq) + jnp.arange(lq))
    if cache_layout:  # k [B, KV, hd, S], v [B, KV, S, hd]
        k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
    dense = A.dense_attention(q, k, v, mask.dense(), cache_layout)
    blockwise = B.blockwise_attention(q, k, v, mask, cache_layout, block=8)
    np.testing.assert_allclose(np.asarray(blockwise), np.asarray(dense), atol=1e-5)


def test_blockwise_full_mask_equals_dense():
    """The vision tower's mask: every query sees every key."""
    q, k, v, _ = inputs(2, 3, 50, 4, 4, 8, jnp.float32)
    mask = AttentionMask.full(3, 50, 50)
    np.testing.assert_allclose(np.asarray(B.blockwise_attention(q, k, v, mask, block=16)),
                               np.asarray(A.dense_attention(q, k, v, None)), atol=1e-5)


def test_blockwise_program_holds_no_square_score_array():
    """Neither the forward nor the backward program of blockwise attention at T = 1,024 has an
    array with two axes of length T (dense attention's gradient has [B, KV, T*G, T]), also
    inside a differentiated layer scan, whose working set stays below one [H, T, T] score
    array (a scan must not save every block's scores as residuals)."""
    length, heads = 1024, 2
    q, k, v, _ = inputs(3, 1, length, heads, 1, 16, jnp.float32)
    mask = AttentionMask.causal_segments(jnp.ones((1, length), jnp.int32))

    def compiled(fn):
        def layers(q, k, v):  # two layers whose inputs depend on the previous output
            def body(x, _):
                return x + fn(x, k * jnp.mean(x), v), None
            return jnp.sum(jax.lax.scan(body, q, None, length=2)[0])
        return jax.jit(jax.grad(layers, argnums=(0, 1, 2))).lower(q, k, v).compile()

    square = re.compile(rf"\[[0-9,]*\b{length}\b[0-9,]*,{length}\b|\b{length}\b,[0-9,]*\b{length}\]")
    dense = compiled(lambda q, k, v: A.dense_attention(q, k, v, mask.dense()))
    blockwise = compiled(lambda q, k, v: B.blockwise_attention(q, k, v, mask, block=128))
    assert square.search(dense.as_text())
    assert not square.search(blockwise.as_text())
    assert blockwise.memory_analysis().temp_size_in_bytes < heads * length * length * 4


def test_block_skipping():
    """Blocks no query may see are skipped: above the causal diagonal, across packed
    sequences, and empty cache slots; blocks with one visible pair are kept."""
    seg = np.array([[1] * 8 + [2] * 8 + [0] * 8], np.int32)
    pos = np.arange(24, dtype=np.int32)[None]
    summary = B._block_summary(jnp.asarray(seg), jnp.asarray(pos), 8)
    visible = lambda i, j, causal=True: bool(B._block_visible(summary, summary, i, j, causal))
    assert visible(0, 0) and visible(1, 1)
    assert not visible(0, 1)  # above the diagonal
    assert not visible(1, 0, causal=False)  # segment 2 queries, segment 1 keys
    assert not visible(2, 2, causal=False) and not visible(1, 2, causal=False)  # padding


@pytest.mark.parametrize("case", ["causal", "padded", "full"])
def test_cudnn_mapping_equals_dense(case, monkeypatch):
    """cudnn_attention's arguments (is_causal, per-row sequence lengths for right padding),
    run through XLA's implementation of the same call, give dense attention's output."""
    batch, length = 2, 48
    q, k, v, _ = inputs(4, batch, length, 4, 2, 16, jnp.float32)
    if case == "full":
        mask = AttentionMask.full(batch, length, length)
        dense = A.dense_attention(q, k, v, None)
        seen = np.ones((batch, length), bool)
    else:
        mask = AttentionMask.causal_segments(segments_for(case, batch, length))
        dense = A.dense_attention(q, k, v, mask.dense())
        seen = np.asarray(mask.query_segments > 0)
    out = F.cudnn_attention(q, k, v, mask, implementation="xla")
    np.testing.assert_allclose(np.where(seen[..., None, None], np.asarray(out), 0),
                               np.where(seen[..., None, None], np.asarray(dense), 0), atol=1e-5)
    assert not np.asarray(out)[~seen].any()


def test_splash_interpret_equals_dense():
    """The splash kernel in Pallas interpret mode (CPU): causal, packed segments, padding,
    GQA; padding queries give zeros."""
    batch, length = 1, 256
    q, k, v, _ = inputs(5, batch, length, 4, 2, 64, jnp.float32)
    seg = np.ones((batch, length), np.int32)
    seg[0, 100:200] = 2
    seg[0, 200:] = 0
    mask = AttentionMask.causal_segments(seg, packed=True)
    assert F.splash_accepts(q, k, mask, False, interpret=True) is None
    dense = np.asarray(A.dense_attention(q, k, v, mask.dense())) * (seg > 0)[..., None, None]
    np.testing.assert_allclose(np.asarray(F.splash_attention(q, k, v, mask, interpret=True)), dense, atol=1e-5)


def test_resolve_per_backend_and_fallback():
    """On CPU: auto runs dense for a small score array and blockwise for a large one; cudnn and
    splash are refused (they exist on gpu / tpu only); unknown names are refused. Compiled for a
    TPU (`compile_platform`, as the planner's AOT path traces), auto and splash pick splash where
    the kernel takes the call and blockwise for a KV-cache mask, and every choice is recorded."""
    small = jnp.zeros((1, 16, 4, 8)), jnp.zeros((1, 16, 2, 8))
    large = jnp.zeros((1, 2048, 4, 8)), jnp.zeros((1, 2048, 2, 8))
    mask = lambda n: AttentionMask.causal_segments(jnp.ones((1, n), jnp.int32))
    assert A.resolve("auto", *small, mask(16)) == "dense"
    assert A.resolve("auto", *large, mask(2048)) == "blockwise"
    for name, platform in (("cudnn", "gpu"), ("splash", "tpu")):
        with pytest.raises(ValueError, match=f"model.attention='{name}' runs on {platform} only"):
            A.resolve(name, *large, mask(2048))
    cache = AttentionMask.cache(jnp.ones((1, 2048), bool), jnp.arange(2048))
    resolved = []
    with F.compile_platform("tpu", resolved):
        assert A.resolve("auto", *large, mask(2048)) == "splash"
        assert A.resolve("splash", *large, mask(2048)) == "splash"
        assert A.resolve("splash", *large, cache) == "blockwise"
        with pytest.raises(ValueError, match="runs on gpu only; this program is compiled for tpu"):
            A.resolve("cudnn", *large, mask(2048))
    assert [(c.requested, c.chosen, c.kind) for c in resolved] == [
        ("auto", "splash", "causal"), ("splash", "splash", "causal"), ("splash", "blockwise", "cache")]
    # causal self-attention: half of the 2048 x 2048 scores, 2 matmuls x 2 FLOPs, 4 heads x 8 dims
    assert resolved[0].flops == 4 * 4 * 8 * 2048 * 2048 / 2 and resolved[2].flops == 2 * resolved[0].flops
    assert F.target_platform() == jax.default_backend()
    assert "not gpu" in F.cudnn_accepts(*large, mask(2048), False)
    assert "not tpu" in F.splash_accepts(*large, mask(2048), False)
    packed = AttentionMask.causal_segments(jnp.ones((1, 2048), jnp.int32), packed=True)
    assert "packed" in F.cudnn_accepts(large[0].astype(jnp.bfloat16), large[1], packed, False) or \
        jax.default_backend() != "gpu"
    assert "cache" in F.splash_accepts(*large, AttentionMask.cache(jnp.ones((1, 2048), bool),
                                                                     jnp.arange(2048)), True, interpret=True)
    with pytest.raises(ValueError, match="model.attention='flash'"):
        A.resolve("flash", *small, mask(16))
    with pytest.raises(ConfigError, match="attention='flash'"):
        preset("tiny", attention="flash")
    with pytest.raises(ConfigError, match="attention_block=4"):
        preset("tiny", attention_block=4)
