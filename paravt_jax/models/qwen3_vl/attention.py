"""One attention op for every attention in the model, with the implementation chosen by config.

`attend(q, k, v, mask, implementation)`:
  dense      softmax(q k^T) v with the whole [B, H, Lq, Lk] score array (XLA, every backend).
  blockwise  flash-style online softmax over query and key blocks in pure JAX, every backend
             (models/qwen3_vl/blockwise.py).
  cudnn      the cuDNN flash kernel: GPU (models/qwen3_vl/fused_attention.py).
  splash     the Pallas TPU splash kernel: TPU (models/qwen3_vl/fused_attention.py).
  auto       cudnn on GPU / splash on TPU where they accept the call, else dense when the
             whole score array is small (a decode step), else blockwise.

This module holds dense attention, the choice among the implementations (`resolve`, with the
cost of each call the planner records) and the partial attentions the sampler merges over a
shared prefix and its own keys (`attend_partial`, `merge_partials`, `shared_prefix_partial`).
The mask is carried factored (`AttentionMask`, models/qwen3_vl/attention_mask.py), never as a
[Lq, Lk] array.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from paravt_jax.models.qwen3_vl.attention_mask import MASK_VALUE, AttentionMask
from paravt_jax.models.qwen3_vl.blockwise import DEFAULT_BLOCK, blockwise_attention, blockwise_partial
from paravt_jax.models.qwen3_vl.config import ATTENTION_IMPLEMENTATIONS as IMPLEMENTATIONS
from paravt_jax.models.qwen3_vl.fused_attention import (
    KERNEL_PLATFORMS,
    cudnn_accepts,
    cudnn_attention,
    resolutions,
    splash_accepts,
    splash_attention,
    target_platform,
)

# `auto` runs dense attention when the float32 score array of the whole call is at most this
# (a decode step, a short chunk): one pair of matmuls beats a loop over blocks there.
DENSE_MAX_SCORE_BYTES = 16 << 20


# ----------------------------------------------------------------------------- dense
def dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None,
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


# ----------------------------------------------------------------------------- partials
def _dense_partial(q, k, v, mask: AttentionMask, cache_layout: bool):
    """dense_attention's folding, returning (out [B, KV, Lq * G, hd] f32, lse [B, KV, Lq * G])."""
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[1] if cache_layout else k.shape[2]
    groups = heads // kv_heads
    folded = q.reshape(batch, q_len, kv_heads, groups, head_dim).transpose(0, 2, 1, 3, 4)
    folded = folded.reshape(batch, kv_heads, q_len * groups, head_dim)
    keys = k if cache_layout else k.transpose(0, 2, 3, 1)  # [B, KV, hd, Lk]
    values = v if cache_layout else v.transpose(0, 2, 1, 3)
    logits = jnp.einsum("bkqd,bkds->bkqs", folded, keys, preferred_element_type=jnp.float32)
    logits = logits * (head_dim**-0.5)
    allowed = jnp.broadcast_to(mask.dense()[:, None, :, None], (batch, 1, q_len, groups, keys.shape[-1]))
    allowed = allowed.reshape(batch, 1, q_len * groups, -1)
    logits = jnp.where(allowed, logits, MASK_VALUE)
    top = jnp.max(logits, -1, keepdims=True)
    p = jnp.where(allowed, jnp.exp(logits - top), 0.0)
    total = jnp.sum(p, -1)
    seen = total > 0
    out = jnp.einsum("bkqs,bksd->bkqd", p.astype(v.dtype), values, preferred_element_type=jnp.float32)
    out = out / jnp.where(seen, total, 1.0)[..., None]
    lse = jnp.where(seen, top[..., 0] + jnp.log(jnp.where(seen, total, 1.0)), MASK_VALUE)
    return out, lse


def attend_partial(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, implementation: str = "auto",
                   *, cache_layout: bool = False, block: int = DEFAULT_BLOCK,
                   bounded: bool = False) -> tuple[jax.Array, jax.Array]:
    """Attention over one part of the keys, with what merge_partials needs to combine parts.
    Inside `compile_platform` the call's analytic cost is recorded as `attend`'s is (an
    AttentionCall at the static key length: a bounded call's read when its keys are all filled).

    Shapes as `attend`. Returns (out [B, Lq, H, hd] float32, log-sum-exp [B, Lq, H] float32 of
    each query's scores; a query that sees no key gets a zero output and lse MASK_VALUE).
    Dense where `attend` would run dense, else the blockwise forward (the fused kernels do not
    return a log-sum-exp), which reads the keys only as far as a row with a seeing query has
    any (blockwise_partial). `bounded` (a decode over a KV cache filled only in part): the
    blockwise forward under `auto` too, so that the read stops at the filled blocks where dense
    would read every slot. Forward only: no custom gradient (the sampler's use)."""
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[1] if cache_layout else k.shape[2]
    groups = heads // kv_heads
    key_len = k.shape[-1] if cache_layout else k.shape[1]
    dense = partial_runs_dense(implementation, batch, q_len, heads, key_len, bounded)
    record = resolutions()
    if record is not None:  # the time plan's analytic cost, as `resolve` records attend's
        record.append(AttentionCall(implementation, "dense" if dense else "blockwise", mask.kind,
                                    *attention_cost(q, k, mask, cache_layout)))
    if dense:
        out, lse = _dense_partial(q, k, v, mask, cache_layout)
        out = out.reshape(batch, kv_heads, q_len, groups, head_dim).transpose(0, 2, 1, 3, 4)
        lse = lse.reshape(batch, kv_heads, q_len, groups).transpose(0, 2, 1, 3)
        return out.reshape(batch, q_len, heads, head_dim), lse.reshape(batch, q_len, heads)
    return blockwise_partial(q, k, v, mask, cache_layout, block)


def partial_runs_dense(implementation: str, batch: int, q_len: int, heads: int, key_len: int,
                       bounded: bool = False) -> bool:
    """Whether attend_partial runs dense on these shapes (else the blockwise forward): asked
    for, or under `auto` a float32 score array of at most DENSE_MAX_SCORE_BYTES and no bound."""
    small = batch * heads * q_len * key_len * 4 <= DENSE_MAX_SCORE_BYTES
    return implementation == "dense" or (implementation == "auto" and small and not bounded)


def merge_partials(*parts: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Exact attention over the union of disjoint key sets from attend_partial's (out, lse)
    of each: the outputs weighted by exp(lse - max lse). [B, Lq, H, hd] float32."""
    top = functools.reduce(jnp.maximum, [lse for _, lse in parts])
    weights = [jnp.exp(lse - top) for _, lse in parts]
    total = functools.reduce(jnp.add, weights)
    return functools.reduce(jnp.add, [out * w[..., None] for (out, _), w in zip(parts, weights)]) / total[..., None]


def shared_prefix_partial(q: jax.Array, keys: jax.Array, values: jax.Array, valid: jax.Array,
                          implementation: str = "auto", block: int = DEFAULT_BLOCK, *,
                          queries: jax.Array | None = None, bounded: bool = False) -> tuple[jax.Array, jax.Array]:
    """attend_partial of rows that share a prefix: q [P * F, Lq, H, hd] (row p * F + f reads
    prefix p) against keys [P, KV, hd, S], values [P, KV, S, hd], valid [P, S]. The F rows of a
    prefix fold into its query axis, so the prefix is read once per prefix, never copied.
    queries [P * F] bool (None: all): the rows whose queries attend; the others see nothing
    (a prefix none of whose rows attends is then not read by a bounded call)."""
    rows, q_len, heads, head_dim = q.shape
    prefixes = valid.shape[0]
    folded = q.reshape(prefixes, (rows // prefixes) * q_len, heads, head_dim)
    mask = AttentionMask.prefix(valid, folded.shape[1])
    if queries is not None:
        seeing = jnp.broadcast_to(queries.reshape(prefixes, rows // prefixes, 1), (prefixes, rows // prefixes, q_len))
        mask = dataclasses.replace(mask, query_segments=seeing.reshape(prefixes, -1).astype(jnp.int32))
    out, lse = attend_partial(folded, keys, values, mask, implementation, cache_layout=True, block=block,
                              bounded=bounded)
    return out.reshape(rows, q_len, heads, head_dim), lse.reshape(rows, q_len, heads)


# ----------------------------------------------------------------------------- dispatch
def resolve(implementation: str, q: jax.Array, k: jax.Array, mask: AttentionMask,
            cache_layout: bool = False) -> str:
    """The implementation that runs: `auto` resolved for the target platform. An explicit fused
    kernel on a platform that has no such kernel is an error; on its own platform, a call the
    kernel does not take (a KV-cache mask in decode, a length it cannot tile) runs blockwise."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"model.attention={implementation!r}: expected one of {IMPLEMENTATIONS}")
    chosen = _choose(implementation, q, k, mask, cache_layout)
    record = resolutions()
    if record is not None:
        record.append(AttentionCall(implementation, chosen, mask.kind, *attention_cost(q, k, mask, cache_layout)))
    return chosen


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """One attention call seen while tracing: what was asked, what runs, the mask kind, and the
    call's forward FLOPs and HBM bytes (whole call, not per device) for the time plan: XLA's
    cost analysis sees nothing inside a fused kernel and one block of a blockwise loop."""
    requested: str
    chosen: str
    kind: str
    flops: float
    bytes: float


def attention_cost(q, k, mask: AttentionMask, cache_layout: bool) -> tuple[float, float]:
    """(FLOPs, bytes) of one attention forward of these operands (`attention_cost_of`)."""
    batch, q_len, heads, head_dim = q.shape
    key_len = k.shape[-1] if cache_layout else k.shape[1]
    kv_heads = k.shape[1] if cache_layout else k.shape[2]
    return attention_cost_of(batch, q_len, heads, kv_heads, head_dim, key_len, jnp.dtype(q.dtype).itemsize,
                             causal=mask.kind == "causal")


def attention_cost_of(batch: int, q_len: int, heads: int, kv_heads: int, head_dim: int, key_len: float,
                      itemsize: int, causal: bool = False) -> tuple[float, float]:
    """(FLOPs, bytes) of one attention forward from its shapes: two matmuls of 2 FLOPs per
    multiply-add over the visible score entries (half of them for causal self-attention), q/k/v
    read and out written once. key_len: the keys read (the time plan passes a decode's mean fill)."""
    visible = 0.5 if causal else 1.0
    flops = 4.0 * batch * heads * head_dim * q_len * key_len * visible
    return flops, float(itemsize * head_dim * batch * (2 * heads * q_len + 2 * kv_heads * key_len))


def _choose(implementation, q, k, mask, cache_layout) -> str:
    if implementation in ("dense", "blockwise"):
        return implementation
    platform = target_platform()
    if implementation in KERNEL_PLATFORMS and KERNEL_PLATFORMS[implementation] != platform:
        raise ValueError(f"model.attention={implementation!r} runs on {KERNEL_PLATFORMS[implementation]} only; "
                         f"this program is compiled for {platform}: use 'auto' or 'blockwise'")
    if implementation in ("auto", "cudnn") and cudnn_accepts(q, k, mask, cache_layout) is None:
        return "cudnn"
    if implementation in ("auto", "splash") and splash_accepts(q, k, mask, cache_layout) is None:
        return "splash"
    if implementation == "auto":
        batch, q_len, heads, _ = q.shape
        key_len = k.shape[-1] if cache_layout else k.shape[1]
        if batch * heads * q_len * key_len * 4 <= DENSE_MAX_SCORE_BYTES:
            return "dense"
    return "blockwise"


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, implementation: str = "auto",
           *, cache_layout: bool = False, block: int = DEFAULT_BLOCK) -> jax.Array:
    """Attention with the configured implementation (see the module docstring).

    q [B, Lq, H, hd]; k, v [B, Lk, KV, hd] (or with cache_layout k [B, KV, hd, Lk], v
    [B, KV, Lk, hd]); H a multiple of KV. Returns [B, Lq, H, hd] in q.dtype; queries that see
    no key get zeros from every implementation but dense (which averages the values).
    """
    chosen = resolve(implementation, q, k, mask, cache_layout)
    if chosen == "cudnn":
        return cudnn_attention(q, k, v, mask)
    if chosen == "splash":
        return splash_attention(q, k, v, mask)
    if chosen == "blockwise":
        return blockwise_attention(q, k, v, mask, cache_layout, block)
    return dense_attention(q, k, v, None if mask.kind == "full" else mask.dense(), cache_layout)

