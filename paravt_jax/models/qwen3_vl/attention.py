"""One attention op for every attention in the model, with the implementation chosen by config.

`attend(q, k, v, mask, implementation)`:
  dense      softmax(q k^T) v with the whole [B, H, Lq, Lk] score array (XLA, every backend).
  blockwise  flash-style online softmax over query and key blocks in pure JAX, with a
             `jax.custom_vjp` whose backward pass recomputes each block's scores: neither pass
             holds more than one [B, H, block_q, block_k] score block. Blocks that no query may
             see (the causal triangle, other packed sequences, empty cache slots) are skipped
             with a `lax.cond`. Every backend.
  cudnn      `jax.nn.dot_product_attention(implementation="cudnn")`: GPU, bf16/fp16, causal or
             full masks with right padding (no packed segments, no cache masks).
  splash     the Pallas TPU splash attention kernel shipped with jax, with segment ids: TPU,
             causal or full self-attention, lengths a multiple of 128.
  auto       cudnn on GPU / splash on TPU where they accept the call, else dense when the
             whole score array is small (a decode step), else blockwise.

The mask is carried factored (`AttentionMask`), never as a [Lq, Lk] array: key j is visible to
query i when both are in the same non-zero segment and, for a causal mask, key_positions[j] <=
query_positions[i]. Segment 0 marks padding queries (their output is zero) and empty keys.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from paravt_jax.models.qwen3_vl.config import ATTENTION_IMPLEMENTATIONS as IMPLEMENTATIONS

# Masked attention logits get this value instead of -inf so that a fully masked row stays finite.
MASK_VALUE = -1e30
# `auto` runs dense attention when the float32 score array of the whole call is at most this
# (a decode step, a short chunk): one pair of matmuls beats a loop over blocks there.
DENSE_MAX_SCORE_BYTES = 16 << 20
DEFAULT_BLOCK = 512
# The platform the traced program is compiled for. A run compiles for its own devices
# (jax.default_backend()); an ahead-of-time compile for other devices (the planner lowering for
# a TPU topology from a CPU process) names theirs with `compile_platform`, so `auto` picks the
# kernels of that platform. Every resolution made while tracing is recorded in `_RESOLVED`.
_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("attention_platform", default=None)
_RESOLVED: contextvars.ContextVar[list | None] = contextvars.ContextVar("attention_resolved", default=None)
# The mesh a sharded program runs on: a Pallas kernel cannot be partitioned automatically, so
# splash runs under shard_map over it (rows over data x fsdp, heads over tensor).
_MESH: contextvars.ContextVar = contextvars.ContextVar("attention_mesh", default=None)


@contextlib.contextmanager
def kernel_mesh(mesh):
    """Traces inside run fused kernels per shard of `mesh` (None: unsharded)."""
    token = _MESH.set(mesh)
    try:
        yield
    finally:
        _MESH.reset(token)


def target_platform() -> str:
    """The platform kernels are chosen for: the one `compile_platform` set, else the default backend's."""
    return _PLATFORM.get() or jax.default_backend()


@contextlib.contextmanager
def compile_platform(platform: str, resolved: list | None = None):
    """Traces inside choose kernels for `platform` ("tpu", "gpu", "cpu"); `resolved`, when given,
    collects (requested, chosen) of every attention call traced inside."""
    token, record = _PLATFORM.set(platform), _RESOLVED.set(resolved)
    try:
        yield
    finally:
        _PLATFORM.reset(token)
        _RESOLVED.reset(record)


@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """Which keys each query sees, in factored form (O(L) memory instead of O(Lq * Lk)).

    query_segments [B, Lq], key_segments [B, Lk] int32: a query sees only keys of its own
    segment; segment 0 = padding query / empty key. query_positions [B, Lq], key_positions
    [B, Lk] int32: with `causal`, a query sees only keys at positions <= its own.
    `kind` (static) tells the fused kernels what structure the mask has: "full" (no mask),
    "causal" (self-attention, positions 0..L-1, segments either one per row with right padding
    or, with `packed`, several) or "cache" (queries over a KV cache).
    """
    query_segments: jax.Array
    key_segments: jax.Array
    query_positions: jax.Array
    key_positions: jax.Array
    causal: bool
    kind: str
    packed: bool = False

    @staticmethod
    def full(batch: int, query_len: int, key_len: int) -> AttentionMask:
        """Every query sees every key (the vision tower's attention within one frame)."""
        q = jnp.ones((batch, query_len), jnp.int32)
        k = jnp.ones((batch, key_len), jnp.int32)
        return AttentionMask(q, k, jnp.zeros_like(q), jnp.zeros_like(k), causal=False, kind="full")

    @staticmethod
    def causal_segments(segment_ids: jax.Array, packed: bool = False) -> AttentionMask:
        """Causal self-attention over segment_ids [B, L] (0 = padding; one segment per row is an
        attention mask, several with `packed`); token order is position order."""
        segments = jnp.asarray(segment_ids).astype(jnp.int32)
        positions = jnp.broadcast_to(jnp.arange(segments.shape[1], dtype=jnp.int32), segments.shape)
        return AttentionMask(segments, segments, positions, positions, causal=True, kind="causal",
                             packed=packed)

    @staticmethod
    def prefix(valid: jax.Array, query_len: int) -> AttentionMask:
        """Queries after a whole prefix: each of query_len queries of row b sees every valid
        slot of valid [B, S] (the prefix ends before the first query)."""
        batch, slots = valid.shape
        zeros = jnp.zeros((batch, query_len), jnp.int32)
        return AttentionMask(jnp.ones_like(zeros), valid.astype(jnp.int32), zeros,
                             jnp.zeros((batch, slots), jnp.int32), causal=False, kind="cache")

    @staticmethod
    def cache(valid: jax.Array, query_slots: jax.Array) -> AttentionMask:
        """Queries over a KV cache: valid [B, S] marks filled slots; query i sits at slot
        query_slots[i] ([Lq]) and sees the valid slots <= it."""
        batch, slots = valid.shape
        query_slots = jnp.broadcast_to(jnp.asarray(query_slots, jnp.int32), (batch, query_slots.shape[-1]))
        return AttentionMask(jnp.ones_like(query_slots), valid.astype(jnp.int32), query_slots,
                             jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32), (batch, slots)),
                             causal=True, kind="cache")

    def dense(self) -> jax.Array:
        """The [B, Lq, Lk] boolean mask (True = attend)."""
        return _visible(self.query_segments, self.query_positions, self.key_segments,
                        self.key_positions, self.causal)


jax.tree_util.register_dataclass(
    AttentionMask, data_fields=["query_segments", "key_segments", "query_positions", "key_positions"],
    meta_fields=["causal", "kind", "packed"])


def _visible(q_seg, q_pos, k_seg, k_pos, causal: bool) -> jax.Array:
    """[B, Lq] and [B, Lk] -> [B, Lq, Lk] bool."""
    allowed = (q_seg[:, :, None] == k_seg[:, None, :]) & (k_seg[:, None, :] != 0)
    if causal:
        allowed &= k_pos[:, None, :] <= q_pos[:, :, None]
    return allowed


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


# ----------------------------------------------------------------------------- blockwise
def _block_summary(segments: jax.Array, positions: jax.Array, block: int):
    """Per block of `block` tokens: (lowest non-zero segment, highest segment, lowest and highest
    position), each [B, n_blocks]; a block without a non-zero segment has highest segment 0."""
    batch, length = segments.shape
    seg = segments.reshape(batch, length // block, block)
    pos = positions.reshape(batch, length // block, block)
    big = jnp.iinfo(jnp.int32).max
    return (jnp.min(jnp.where(seg > 0, seg, big), -1), jnp.max(seg, -1),
            jnp.min(pos, -1), jnp.max(pos, -1))


def _block_visible(q_sum, k_sum, i, j, causal: bool) -> jax.Array:
    """Whether any query of query block i may see any key of key block j (in any row). Exact
    for contiguous (sorted) segment ids; otherwise it may only keep a block it could skip."""
    q_lo, q_hi, _, q_pos_hi = (x[:, i] for x in q_sum)
    k_lo, k_hi, k_pos_lo, _ = (x[:, j] for x in k_sum)
    seen = (q_hi > 0) & (k_hi > 0) & (q_lo <= k_hi) & (k_lo <= q_hi)
    if causal:
        seen &= k_pos_lo <= q_pos_hi
    return jnp.any(seen)


def _loop(count: int, body, carry):
    """carry = body(i, carry) for i in range(count), as a `lax.while_loop`. Not `fori_loop` /
    `lax.map`: with static bounds those lower to scans, and partial evaluation inside an outer
    differentiated `lax.scan` (the layer scan) would then save every block's scores and mask
    as residuals, [T/block, T/block, ...] of them; a while loop is never split that way."""
    return jax.lax.while_loop(lambda c: c[0] < count, lambda c: (c[0] + 1, body(c[0], c[1])),
                              (jnp.int32(0), carry))[1]


def _slice(x, start, size, axis):
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis)


def _scores(qi, kj, q_seg, q_pos, k_seg, k_pos, causal, scale):
    """qi [B, KV, G, bq, hd], kj [B, KV, bk, hd] -> (scores [B, KV, G, bq, bk] f32, mask
    [B, 1, 1, bq, bk])."""
    s = jnp.einsum("bkgqd,bksd->bkgqs", qi, kj, preferred_element_type=jnp.float32) * scale
    allowed = _visible(q_seg, q_pos, k_seg, k_pos, causal)[:, None, None]
    return jnp.where(allowed, s, MASK_VALUE), allowed


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _flash(q, k, v, q_seg, q_pos, k_seg, k_pos, causal, block_q, block_k):
    return _flash_forward(q, k, v, q_seg, q_pos, k_seg, k_pos, causal, block_q, block_k)[0]


def _flash_forward(q, k, v, q_seg, q_pos, k_seg, k_pos, causal, block_q, block_k):
    """q [B, KV, G, Lq, hd], k/v [B, KV, Lk, hd] (lengths multiples of the blocks) ->
    (out [B, KV, G, Lq, hd] in q.dtype, log-sum-exp [B, KV, G, Lq] f32; MASK_VALUE and a zero
    output where a query sees no key)."""
    batch, kv_heads, groups, q_len, head_dim = q.shape
    k_len = k.shape[2]
    scale = head_dim**-0.5
    q_sum = _block_summary(q_seg, q_pos, block_q)
    k_sum = _block_summary(k_seg, k_pos, block_k)

    def query_block(i, outputs):
        start = i * block_q
        qi = _slice(q, start, block_q, 3)
        qs, qp = _slice(q_seg, start, block_q, 1), _slice(q_pos, start, block_q, 1)

        def key_block(j, carry):
            def compute(carry):
                m, l, acc = carry
                kstart = j * block_k
                kj, vj = _slice(k, kstart, block_k, 2), _slice(v, kstart, block_k, 2)
                s, allowed = _scores(qi, kj, qs, qp, _slice(k_seg, kstart, block_k, 1),
                                     _slice(k_pos, kstart, block_k, 1), causal, scale)
                m_new = jnp.maximum(m, jnp.max(s, -1))
                p = jnp.where(allowed, jnp.exp(s - m_new[..., None]), 0.0)
                correction = jnp.exp(m - m_new)
                acc = acc * correction[..., None] + jnp.einsum(
                    "bkgqs,bksd->bkgqd", p.astype(v.dtype), vj, preferred_element_type=jnp.float32)
                return m_new, l * correction + jnp.sum(p, -1), acc

            return jax.lax.cond(_block_visible(q_sum, k_sum, i, j, causal), compute, lambda c: c, carry)

        shape = (batch, kv_heads, groups, block_q)
        init = (jnp.full(shape, MASK_VALUE, jnp.float32), jnp.zeros(shape, jnp.float32),
                jnp.zeros(shape + (head_dim,), jnp.float32))
        m, l, acc = _loop(k_len // block_k, key_block, init)
        seen = l > 0
        out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
        # a query that sees no key: MASK_VALUE, so that it weighs nothing in merge_partials
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), MASK_VALUE)
        return (jax.lax.dynamic_update_slice_in_dim(outputs[0], out.astype(q.dtype), start, 3),
                jax.lax.dynamic_update_slice_in_dim(outputs[1], lse, start, 3))

    return _loop(q_len // block_q, query_block,
                 (jnp.zeros(q.shape, q.dtype), jnp.zeros(q.shape[:-1], jnp.float32)))


def _flash_fwd(q, k, v, q_seg, q_pos, k_seg, k_pos, causal, block_q, block_k):
    out, lse = _flash_forward(q, k, v, q_seg, q_pos, k_seg, k_pos, causal, block_q, block_k)
    return out, (q, k, v, q_seg, q_pos, k_seg, k_pos, out, lse)


def _flash_bwd(causal, block_q, block_k, residuals, d_out):
    """FlashAttention-2's backward: for each key block, loop over the query blocks that see it,
    recompute the probabilities from the saved log-sum-exp and accumulate dk, dv (carried per
    key block) and dq (one float32 [B, KV, G, Lq, hd] accumulator)."""
    q, k, v, q_seg, q_pos, k_seg, k_pos, out, lse = residuals
    head_dim = q.shape[-1]
    q_len, k_len = q.shape[3], k.shape[2]
    scale = head_dim**-0.5
    q_sum = _block_summary(q_seg, q_pos, block_q)
    k_sum = _block_summary(k_seg, k_pos, block_k)
    # D_i = sum_d dO_id O_id: the softmax backward's row term
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), -1)

    def key_block(j, grads):
        dq, dk_all, dv_all = grads
        kstart = j * block_k
        kj, vj = _slice(k, kstart, block_k, 2), _slice(v, kstart, block_k, 2)
        ks, kp = _slice(k_seg, kstart, block_k, 1), _slice(k_pos, kstart, block_k, 1)

        def query_block(i, carry):
            def compute(carry):
                dq, dk, dv = carry
                start = i * block_q
                qi, doi = _slice(q, start, block_q, 3), _slice(d_out, start, block_q, 3)
                s, allowed = _scores(qi, kj, _slice(q_seg, start, block_q, 1),
                                     _slice(q_pos, start, block_q, 1), ks, kp, causal, scale)
                p = jnp.where(allowed, jnp.exp(s - _slice(lse, start, block_q, 3)[..., None]), 0.0)
                dv = dv + jnp.einsum("bkgqs,bkgqd->bksd", p.astype(doi.dtype), doi,
                                     preferred_element_type=jnp.float32)
                dp = jnp.einsum("bkgqd,bksd->bkgqs", doi, vj, preferred_element_type=jnp.float32)
                ds = p * (dp - _slice(delta, start, block_q, 3)[..., None]) * scale
                dk = dk + jnp.einsum("bkgqs,bkgqd->bksd", ds.astype(qi.dtype), qi,
                                     preferred_element_type=jnp.float32)
                dqi = jnp.einsum("bkgqs,bksd->bkgqd", ds.astype(kj.dtype), kj,
                                 preferred_element_type=jnp.float32)
                dq = jax.lax.dynamic_update_slice_in_dim(dq, _slice(dq, start, block_q, 3) + dqi, start, 3)
                return dq, dk, dv

            return jax.lax.cond(_block_visible(q_sum, k_sum, i, j, causal), compute, lambda c: c, carry)

        zeros = jnp.zeros(kj.shape, jnp.float32)
        dq, dk, dv = _loop(q_len // block_q, query_block, (dq, zeros, zeros))
        return (dq, jax.lax.dynamic_update_slice_in_dim(dk_all, dk, kstart, 2),
                jax.lax.dynamic_update_slice_in_dim(dv_all, dv, kstart, 2))

    dq, dk, dv = _loop(k_len // block_k, key_block, (jnp.zeros(q.shape, jnp.float32),
                                                    jnp.zeros(k.shape, jnp.float32),
                                                    jnp.zeros(v.shape, jnp.float32)))
    return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _pad_to(x: jax.Array, axis: int, multiple: int) -> jax.Array:
    extra = -x.shape[axis] % multiple
    if not extra:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, extra)
    return jnp.pad(x, pad)


def block_sizes(query_len: int, key_len: int, block: int) -> tuple[int, int]:
    """(block_q, block_k): `block`, or the whole length when it is shorter."""
    return min(block, query_len), min(block, key_len)


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask,
                        cache_layout: bool = False, block: int = DEFAULT_BLOCK) -> jax.Array:
    """Memory-efficient exact attention; shapes as `dense_attention`, the mask factored.

    Lengths that are not a multiple of the block are padded with segment 0 (never seen, and
    their outputs are dropped). Memory: one [B, H, block, block] float32 score block per pass,
    plus O(L) residuals (the output and a log-sum-exp per query) for the backward pass.
    """
    batch, q_len, heads, head_dim = q.shape
    out = _flash(*_flash_inputs(q, k, v, mask, cache_layout, block), mask.causal,
                 *block_sizes(q_len, k.shape[-1] if cache_layout else k.shape[1], block))
    out = out[:, :, :, :q_len].transpose(0, 3, 1, 2, 4)
    return out.reshape(batch, q_len, heads, head_dim)


def _flash_inputs(q, k, v, mask: AttentionMask, cache_layout: bool, block: int):
    """The blockwise kernels' operands: q [B, KV, G, Lq', hd], k/v [B, KV, Lk', hd] and the
    mask's segments and positions, padded to multiples of the blocks (block_sizes)."""
    batch, q_len, heads, head_dim = q.shape
    if cache_layout:
        k = k.transpose(0, 1, 3, 2)  # [B, KV, hd, Lk] -> [B, KV, Lk, hd]
    else:
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    kv_heads, k_len = k.shape[1], k.shape[2]
    block_q, block_k = block_sizes(q_len, k_len, block)
    qg = q.reshape(batch, q_len, kv_heads, heads // kv_heads, head_dim).transpose(0, 2, 3, 1, 4)
    qg = _pad_to(qg, 3, block_q)
    k, v = _pad_to(k, 2, block_k), _pad_to(v, 2, block_k)
    q_seg, q_pos = (_pad_to(x, 1, block_q) for x in (mask.query_segments, mask.query_positions))
    k_seg, k_pos = (_pad_to(x, 1, block_k) for x in (mask.key_segments, mask.key_positions))
    return qg, k, v, q_seg, q_pos, k_seg, k_pos


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
                   *, cache_layout: bool = False, block: int = DEFAULT_BLOCK) -> tuple[jax.Array, jax.Array]:
    """Attention over one part of the keys, with what merge_partials needs to combine parts.

    Shapes as `attend`. Returns (out [B, Lq, H, hd] float32, log-sum-exp [B, Lq, H] float32 of
    each query's scores; a query that sees no key gets a zero output and lse MASK_VALUE).
    Dense where `attend` would run dense, else the blockwise forward (the fused kernels do not
    return a log-sum-exp). Forward only: no custom gradient (the sampler's use)."""
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[1] if cache_layout else k.shape[2]
    groups = heads // kv_heads
    key_len = k.shape[-1] if cache_layout else k.shape[1]
    small = batch * heads * q_len * key_len * 4 <= DENSE_MAX_SCORE_BYTES
    if implementation == "dense" or (implementation == "auto" and small):
        out, lse = _dense_partial(q, k, v, mask, cache_layout)
        out = out.reshape(batch, kv_heads, q_len, groups, head_dim).transpose(0, 2, 1, 3, 4)
        lse = lse.reshape(batch, kv_heads, q_len, groups).transpose(0, 2, 1, 3)
        return out.reshape(batch, q_len, heads, head_dim), lse.reshape(batch, q_len, heads)
    out, lse = _flash_forward(*_flash_inputs(q, k, v, mask, cache_layout, block), mask.causal,
                              *block_sizes(q_len, key_len, block))
    out = out[:, :, :, :q_len].transpose(0, 3, 1, 2, 4).reshape(batch, q_len, heads, head_dim).astype(jnp.float32)
    lse = lse[:, :, :, :q_len].transpose(0, 3, 1, 2).reshape(batch, q_len, heads)
    return out, lse


def merge_partials(*parts: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Exact attention over the union of disjoint key sets from attend_partial's (out, lse)
    of each: the outputs weighted by exp(lse - max lse). [B, Lq, H, hd] float32."""
    top = functools.reduce(jnp.maximum, [lse for _, lse in parts])
    weights = [jnp.exp(lse - top) for _, lse in parts]
    total = functools.reduce(jnp.add, weights)
    return functools.reduce(jnp.add, [out * w[..., None] for (out, _), w in zip(parts, weights)]) / total[..., None]


def shared_prefix_partial(q: jax.Array, keys: jax.Array, values: jax.Array, valid: jax.Array,
                          implementation: str = "auto", block: int = DEFAULT_BLOCK) -> tuple[jax.Array, jax.Array]:
    """attend_partial of rows that share a prefix: q [P * F, Lq, H, hd] (row p * F + f reads
    prefix p) against keys [P, KV, hd, S], values [P, KV, S, hd], valid [P, S]. The F rows of a
    prefix fold into its query axis, so the prefix is read once per prefix, never copied."""
    rows, q_len, heads, head_dim = q.shape
    prefixes = valid.shape[0]
    folded = q.reshape(prefixes, (rows // prefixes) * q_len, heads, head_dim)
    out, lse = attend_partial(folded, keys, values, AttentionMask.prefix(valid, folded.shape[1]),
                              implementation, cache_layout=True, block=block)
    return out.reshape(rows, q_len, heads, head_dim), lse.reshape(rows, q_len, heads)


# ----------------------------------------------------------------------------- fused kernels
def cudnn_accepts(q: jax.Array, k: jax.Array, mask: AttentionMask, cache_layout: bool) -> str | None:
    """None when the cuDNN flash kernel takes this call, else why not."""
    if target_platform() != "gpu":
        return f"backend {target_platform()} is not gpu"
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        return f"dtype {q.dtype} (cuDNN flash attention takes bf16/fp16)"
    if cache_layout or mask.kind == "cache":
        return "a KV-cache mask"
    if mask.packed:
        return "packed segments (cuDNN takes sequence lengths, not segment ids)"
    if q.shape[-1] % 8 or q.shape[-1] > 256:
        return f"head_dim {q.shape[-1]}"
    return None


def cudnn_attention(q, k, v, mask: AttentionMask, implementation: str = "cudnn") -> jax.Array:
    """q [B, Lq, H, hd], k/v [B, Lk, KV, hd]; a causal mask over right-padded rows maps to
    is_causal plus per-row sequence lengths (the count of non-zero segment ids), a full mask to
    no mask. `implementation="xla"` runs the same mapping through XLA (tests on CPU)."""
    lengths = {}
    if mask.kind == "causal":
        lengths = dict(query_seq_lengths=jnp.sum(mask.query_segments > 0, -1).astype(jnp.int32),
                       key_value_seq_lengths=jnp.sum(mask.key_segments > 0, -1).astype(jnp.int32))
    out = jax.nn.dot_product_attention(q, k, v, is_causal=mask.causal, implementation=implementation,
                                       **lengths)
    if lengths:  # padding queries give zeros, as in the other implementations
        out = jnp.where((mask.query_segments > 0)[..., None, None], out, 0)
    return out


SPLASH_BLOCK = 128


def splash_accepts(q: jax.Array, k: jax.Array, mask: AttentionMask, cache_layout: bool,
                   interpret: bool = False) -> str | None:
    """None when the splash kernel takes this call, else why not."""
    if not interpret and target_platform() != "tpu":
        return f"backend {target_platform()} is not tpu"
    if cache_layout or mask.kind == "cache":
        return "a KV-cache mask"
    if q.shape[1] != k.shape[1]:
        return f"query length {q.shape[1]} != key length {k.shape[1]}"
    if q.shape[1] % SPLASH_BLOCK:
        return f"length {q.shape[1]} is not a multiple of {SPLASH_BLOCK}"
    return None


def splash_attention(q, k, v, mask: AttentionMask, interpret: bool = False) -> jax.Array:
    """q [B, L, H, hd], k/v [B, L, KV, hd] through the Pallas splash kernel (one MQA kernel per
    KV head group, vmapped over batch and KV heads), segment ids from the mask. Padding tokens
    (segment 0) attend among themselves inside the kernel; their outputs are zeroed here."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    groups = heads // kv_heads
    single = (splash.CausalMask if mask.causal else splash.FullMask)((length, length))
    blocks = splash.BlockSizes(block_q=SPLASH_BLOCK, block_kv=SPLASH_BLOCK, block_kv_compute=SPLASH_BLOCK,
                               block_q_dkv=SPLASH_BLOCK, block_kv_dkv=SPLASH_BLOCK,
                               block_kv_dkv_compute=SPLASH_BLOCK, block_q_dq=SPLASH_BLOCK,
                               block_kv_dq=SPLASH_BLOCK)
    kernel = splash.make_splash_mqa_single_device(splash.MultiHeadMask([single] * groups),
                                                  block_sizes=blocks, interpret=interpret)
    scaled = (q * head_dim**-0.5).astype(q.dtype)
    # [B, L, KV, G, hd] -> [B, KV, G, L, hd]; k, v -> [B, KV, L, hd]
    qg = scaled.reshape(batch, length, kv_heads, groups, head_dim).transpose(0, 2, 3, 1, 4)
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def one_row(qr, kr, vr, seg):
        ids = splash.SegmentIds(q=seg, kv=seg)
        return jax.vmap(lambda a, b, c: kernel(a, b, c, segment_ids=ids))(qr, kr, vr)

    def local(qg, kt, vt, segments):
        return jax.vmap(one_row)(qg, kt, vt, segments)

    mesh = _MESH.get()
    if mesh is not None and mesh.size > 1:
        from jax.sharding import PartitionSpec as P

        rows = tuple(a for a in ("data", "fsdp") if a in mesh.shape and mesh.shape[a] > 1)
        row_axes = rows if rows and batch % math.prod(mesh.shape[a] for a in rows) == 0 else None
        tensor = mesh.shape.get("tensor", 1)
        head_axis = "tensor" if tensor > 1 and kv_heads % tensor == 0 else None
        spec = P(row_axes, head_axis)
        local = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, P(row_axes)), out_specs=spec,
                              check_vma=False)
    out = local(qg, kt, vt, mask.query_segments)
    out = out.transpose(0, 3, 1, 2, 4).reshape(batch, length, heads, head_dim)
    return jnp.where((mask.query_segments > 0)[..., None, None], out, 0).astype(q.dtype)


# ----------------------------------------------------------------------------- dispatch
KERNEL_PLATFORMS = {"cudnn": "gpu", "splash": "tpu"}


def resolve(implementation: str, q: jax.Array, k: jax.Array, mask: AttentionMask,
            cache_layout: bool = False) -> str:
    """The implementation that runs: `auto` resolved for the target platform. An explicit fused
    kernel on a platform that has no such kernel is an error; on its own platform, a call the
    kernel does not take (a KV-cache mask in decode, a length it cannot tile) runs blockwise."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"model.attention={implementation!r}: expected one of {IMPLEMENTATIONS}")
    chosen = _choose(implementation, q, k, mask, cache_layout)
    record = _RESOLVED.get()
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
    """(FLOPs, bytes) of one attention forward: two matmuls of 2 FLOPs per multiply-add over the
    visible score entries (half of them for causal self-attention), q/k/v read and out written once."""
    batch, q_len, heads, head_dim = q.shape
    key_len = k.shape[-1] if cache_layout else k.shape[1]
    kv_heads = k.shape[1] if cache_layout else k.shape[2]
    visible = 0.5 if mask.kind == "causal" else 1.0
    flops = 4.0 * batch * heads * head_dim * q_len * key_len * visible
    size = jnp.dtype(q.dtype).itemsize
    return flops, float(size * head_dim * batch * (2 * heads * q_len + 2 * kv_heads * key_len))


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

