"""Small numerical building blocks shared by the vision tower and the text decoder.

Precision rules (docs/model.md, "Precision"): norms accumulate in float32, softmax runs in
float32, the vision rotary is applied in float32, the text rotary in the compute dtype.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# Masked attention logits get this value instead of -inf so that a fully masked row (a
# padding query) stays finite.
MASK_VALUE = -1e30


def make_param(rngs: nnx.Rngs, shape: Sequence[int], axes: Sequence[str | None],
               init: str, dtype, stddev: float = 0.02) -> nnx.Param:
    """A parameter carrying its logical axis names in the `axes` metadata."""
    if len(shape) != len(axes):
        raise ValueError(f"shape {tuple(shape)} and axes {tuple(axes)} differ in rank")
    if init == "normal":
        value = stddev * jax.random.normal(rngs.params(), tuple(shape), jnp.float32)
    elif init == "ones":
        value = jnp.ones(tuple(shape), jnp.float32)
    elif init == "zeros":
        value = jnp.zeros(tuple(shape), jnp.float32)
    else:
        raise ValueError(f"unknown init {init!r}")
    return nnx.Param(value.astype(dtype), axes=tuple(axes))


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Normalise in float32, cast back to x.dtype, then scale in x.dtype (HF order)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return normed.astype(x.dtype) * weight.astype(x.dtype)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-6) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    y = jnp.einsum("...i,io->...o", x, kernel.astype(x.dtype))
    if bias is not None:
        y = y + bias.astype(x.dtype)
    return y


def gelu_tanh(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=True)


def gelu_exact(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=False)


def rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """NeoX-style rotary (pairs i and i + d/2). cos/sin broadcast against x."""
    return x * cos + rotate_half(x) * sin


def dot_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None,
                  cache_layout: bool = False) -> jax.Array:
    """Grouped-query attention with a boolean mask.

    q: [B, Lq, H, hd]; k, v: [B, Lk, KV, hd], or with cache_layout the KV-cache layout
    k: [B, KV, hd, Lk], v: [B, KV, Lk, hd]; mask: [B, Lq, Lk] (True = attend) or None.
    Returns [B, Lq, H, hd]. Logits and softmax in float32, result in q.dtype.
    The G = H/KV query heads that share a KV head are folded into the query axis (query
    major, so the folding moves whole [G, hd] rows) and both products are plain batched
    matmuls over (B, KV) (measurably faster on CPU and GPU than a 5-D einsum or repeating K/V).
    """
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[1] if cache_layout else k.shape[2]
    groups = heads // kv_heads
    folded = q.reshape(batch, q_len, kv_heads, groups, head_dim).transpose(0, 2, 1, 3, 4)
    folded = folded.reshape(batch, kv_heads, q_len * groups, head_dim)
    if cache_layout:
        values = v
        logits = jnp.einsum("bkqd,bkds->bkqs", folded, k, preferred_element_type=jnp.float32)
    else:
        values = v.transpose(0, 2, 1, 3)
        logits = jnp.einsum("bkqd,bksd->bkqs", folded, k.transpose(0, 2, 1, 3),
                            preferred_element_type=jnp.float32)
    logits = logits * (head_dim**-0.5)
    if mask is not None:
        tiled = jnp.broadcast_to(mask[:, None, :, None], (batch, 1, q_len, groups, mask.shape[-1]))
        logits = jnp.where(tiled.reshape(batch, 1, q_len * groups, -1), logits, MASK_VALUE)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkqs,bksd->bkqd", probs, values)
    out = out.reshape(batch, kv_heads, q_len, groups, head_dim).transpose(0, 2, 1, 3, 4)
    return out.reshape(batch, q_len, heads, head_dim)


# chunked_attention unrolls at most this many query segments (each with its own static key
# range); the blocks within a segment run in a lax.map, so the program size stays bounded
# however long the chunk is.
MAX_QUERY_SEGMENTS = 8


def chunk_score_bytes() -> int:
    """chunked_attention's default score block budget: cache-sized on XLA:CPU (measured; 2 MB
    and 16 MB blocks were slower), 256 MB on accelerators, where every block is a few kernel
    launches (a 8k-token prefill of 16 heads at 8 MB would run blocks of 16 queries)."""
    return (8 << 20) if jax.default_backend() == "cpu" else (256 << 20)


def chunked_attention(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array,
                      query_slots: jax.Array, cache_layout: bool = False,
                      max_score_bytes: int | None = None, causal_offset: int | None = None) -> jax.Array:
    """Causal attention over a KV buffer, a group of batch rows and one block of queries at a
    time, so the float32 score block [rows, KV, G * q_block, Lk] stays within
    `max_score_bytes` (default `chunk_score_bytes()`) instead of materialising
    [B, KV, G * Lq, Lk] at once.
    Exact: each query's softmax still spans every key it may see. Row groups (as many rows as
    fit the budget, a divisor of B) run in a `lax.map`.

    valid [B, Lk]: keys holding real tokens; query_slots [Lq]: the key index of each query, so
    query i attends to the valid keys <= query_slots[i] (the sampler's cache mask). Each
    block's mask is built inside the block. causal_offset (static, optional): a bound with
    query_slots[i] < causal_offset + i + 1; the queries then fall into at most
    MAX_QUERY_SEGMENTS unrolled segments (blocks of at most max(64, Lq / 8) queries), each
    reading only the keys below its last query's bound, which skips up to ~7/16 of the work of
    a prefill's causal triangle. The blocks of a segment share its key range and run in a
    `lax.map`, so a long chunk (many blocks) compiles as fast as a short one.
    """
    batch, q_len, heads, head_dim = q.shape
    max_score_bytes = max_score_bytes or chunk_score_bytes()
    key_len = k.shape[-1] if cache_layout else k.shape[1]
    per_query = heads * key_len * 4
    block = q_len
    limit = max(64, q_len // 8) if causal_offset is not None else q_len
    while block > 1 and block % 2 == 0 and (block * per_query > max_score_bytes or block > limit):
        block //= 2
    rows = max([r for r in range(1, batch + 1)
                if batch % r == 0 and r * block * per_query <= max_score_bytes] or [1])
    blocks = q_len // block
    segment = q_len // min(blocks, MAX_QUERY_SEGMENTS)  # a multiple of block

    def segment_attention(qs, slots, keys, values, valid_rows):
        """qs [rows, n, H, hd] (n a multiple of block), slots [n], keys/values up to `end`."""
        def one_block(args):
            qb, sb = args
            mask = valid_rows[:, None, :] & (jnp.arange(valid_rows.shape[1])[None, :] <= sb[:, None])[None]
            return dot_attention(qb, keys, values, mask, cache_layout)

        n = qs.shape[1]
        if n == block:
            return one_block((qs, slots))
        qb = qs.reshape(qs.shape[0], n // block, block, heads, head_dim).swapaxes(0, 1)
        out = jax.lax.map(one_block, (qb, slots.reshape(n // block, block)))
        return out.swapaxes(0, 1).reshape(qs.shape)

    def one_group(group):
        qr, kr, vr, valid_rows = group
        outs = []
        for s in range(0, q_len, segment):
            end = key_len if causal_offset is None else max(1, min(key_len, causal_offset + s + segment))
            keys = kr[..., :end] if cache_layout else kr[:, :end]
            values = vr[:, :, :end] if cache_layout else vr[:, :end]
            outs.append(segment_attention(qr[:, s:s + segment], query_slots[s:s + segment], keys,
                                          values, valid_rows[:, :end]))
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)

    if rows == batch:
        return one_group((q, k, v, valid))
    split = lambda x: x.reshape((batch // rows, rows) + x.shape[1:])
    out = jax.lax.map(one_group, (split(q), split(k), split(v), split(valid)))
    return out.reshape(q.shape[:3] + (v.shape[-1],))


def run_layers(layer_fn: Callable, carry, stacked_params, num_layers: int, *, scan: bool,
               remat: bool):
    """Applies `carry = layer_fn(carry, params_i, i)` for i in range(num_layers).

    Parameters are stored stacked along a leading `layers` axis; `scan=True` runs one
    `lax.scan` (one compiled body, fast compiles for deep models), `scan=False` unrolls.
    """
    fn = jax.checkpoint(layer_fn, prevent_cse=not scan) if remat else layer_fn
    if scan:
        def body(c, xs):
            params_i, i = xs
            return fn(c, params_i, i), None

        carry, _ = jax.lax.scan(body, carry, (stacked_params, jnp.arange(num_layers)))
        return carry
    for i in range(num_layers):
        carry = fn(carry, jax.tree.map(lambda p, i=i: p[i], stacked_params), i)
    return carry


def to_dtype(name: str):
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def as_numpy_int(x, name: str) -> np.ndarray | None:
    if x is None:
        return None
    arr = np.asarray(x)
    if arr.dtype.kind not in "iub":
        raise TypeError(f"{name}: expected an integer array, got dtype {arr.dtype}")
    return arr.astype(np.int64)
