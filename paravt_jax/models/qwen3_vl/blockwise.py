"""Blockwise (flash-style) exact attention in pure JAX, on every backend.

An online softmax over query and key blocks, with a `jax.custom_vjp` whose backward pass
recomputes each block's scores: neither pass holds more than one [B, H, block_q, block_k]
score block. Blocks that no query may see (the causal triangle, other packed sequences, empty
cache slots) are skipped with a `lax.cond`. `blockwise_partial` is the forward alone with each
query's log-sum-exp (attention.attend_partial, the sampler's shared-prefix attention).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from paravt_jax.models.qwen3_vl.attention_mask import MASK_VALUE, AttentionMask, visible

DEFAULT_BLOCK = 512
# The named scope of every loop below: their instructions' op_name carries it (an accelerator's
# compiled HLO keeps op_name but not source_file), so that the planner's byte count
# (planner/hlo_counts.py) can leave these loops to the analytic attention cost it adds instead
LOOP_SCOPE = "blockwise_attention_loop"


def _block_summary(segments: jax.Array, positions: jax.Array, block: int, parents: jax.Array | None = None):
    """Per block of `block` tokens: (lowest non-zero segment, highest segment, lowest and highest
    position), each [B, n_blocks]; a block without a non-zero segment has highest segment 0.
    With `parents` (queries that also see a parent segment, numbered below their own) the
    lowest counts the parents: the segments the block's queries see span [lowest, highest]."""
    batch, length = segments.shape
    seg = segments.reshape(batch, length // block, block)
    low = seg if parents is None else jnp.where(parents > 0, parents, segments).reshape(seg.shape)
    pos = positions.reshape(batch, length // block, block)
    big = jnp.iinfo(jnp.int32).max
    return (jnp.min(jnp.where(low > 0, low, big), -1), jnp.max(seg, -1),
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
    as residuals, [T/block, T/block, ...] of them; a while loop is never split that way. Traced
    under LOOP_SCOPE."""
    with jax.named_scope(LOOP_SCOPE):
        return jax.lax.while_loop(lambda c: c[0] < count, lambda c: (c[0] + 1, body(c[0], c[1])),
                                  (jnp.int32(0), carry))[1]


def _slice(x, start, size, axis):
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis)


def _scores(qi, kj, q_seg, q_pos, k_seg, k_pos, causal, scale, keys_t: bool = False, q_par=None):
    """qi [B, KV, G, bq, hd], kj [B, KV, bk, hd] (with keys_t the KV cache's [B, KV, hd, bk])
    -> (scores [B, KV, G, bq, bk] f32, mask [B, 1, 1, bq, bk])."""
    form = "bkgqd,bkds->bkgqs" if keys_t else "bkgqd,bksd->bkgqs"
    s = jnp.einsum(form, qi, kj, preferred_element_type=jnp.float32) * scale
    allowed = visible(q_seg, q_pos, k_seg, k_pos, causal, q_par)[:, None, None]
    return jnp.where(allowed, s, MASK_VALUE), allowed


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10))
def _flash(q, k, v, q_seg, q_pos, k_seg, k_pos, q_par, causal, block_q, block_k):
    return _flash_forward(q, k, v, q_seg, q_pos, k_seg, k_pos, causal, block_q, block_k, q_par=q_par)[0]


def _key_blocks(q_seg, k_seg, block_k: int) -> jax.Array:
    """The key blocks up to the last one that holds a key of a row with a query that sees
    anything (a traced count): the blocks past it are empty for every such row."""
    rows = jnp.any(q_seg > 0, axis=1)
    filled = jnp.any((k_seg > 0) & rows[:, None], axis=0)
    last = jnp.max(jnp.where(filled, jnp.arange(k_seg.shape[1], dtype=jnp.int32), -1))
    return (last + block_k) // block_k


def _flash_forward(q, k, v, q_seg, q_pos, k_seg, k_pos, causal, block_q, block_k, keys_t: bool = False,
                   bounded: bool = False, q_par=None):
    """q [B, KV, G, Lq, hd], k/v [B, KV, Lk, hd] (lengths multiples of the blocks; with keys_t
    k in the KV cache's layout [B, KV, hd, Lk], read in place, block by block) ->
    (out [B, KV, G, Lq, hd] in q.dtype, log-sum-exp [B, KV, G, Lq] f32; MASK_VALUE and a zero
    output where a query sees no key). With `bounded` the loop over key blocks stops after the
    last block a row with a seeing query holds a key in (`_key_blocks`), not at Lk: a KV cache
    is read only as far as it is filled, in one program for every fill. q_par: each query's
    parent segment (AttentionMask.query_parents) or None."""
    batch, kv_heads, groups, q_len, head_dim = q.shape
    k_len = v.shape[2]
    scale = head_dim**-0.5
    q_sum = _block_summary(q_seg, q_pos, block_q, q_par)
    k_sum = _block_summary(k_seg, k_pos, block_k)
    key_blocks = _key_blocks(q_seg, k_seg, block_k) if bounded else k_len // block_k

    def query_block(i, outputs):
        start = i * block_q
        qi = _slice(q, start, block_q, 3)
        qs, qp = _slice(q_seg, start, block_q, 1), _slice(q_pos, start, block_q, 1)
        qa = None if q_par is None else _slice(q_par, start, block_q, 1)

        def key_block(j, carry):
            def compute(carry):
                m, l, acc = carry
                kstart = j * block_k
                kj, vj = _slice(k, kstart, block_k, 3 if keys_t else 2), _slice(v, kstart, block_k, 2)
                s, allowed = _scores(qi, kj, qs, qp, _slice(k_seg, kstart, block_k, 1),
                                     _slice(k_pos, kstart, block_k, 1), causal, scale, keys_t, qa)
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
        m, l, acc = _loop(key_blocks, key_block, init)
        seen = l > 0
        out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
        # a query that sees no key: MASK_VALUE, so that it weighs nothing in merge_partials
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), MASK_VALUE)
        return (jax.lax.dynamic_update_slice_in_dim(outputs[0], out.astype(q.dtype), start, 3),
                jax.lax.dynamic_update_slice_in_dim(outputs[1], lse, start, 3))

    return _loop(q_len // block_q, query_block,
                 (jnp.zeros(q.shape, q.dtype), jnp.zeros(q.shape[:-1], jnp.float32)))


def _flash_fwd(q, k, v, q_seg, q_pos, k_seg, k_pos, q_par, causal, block_q, block_k):
    out, lse = _flash_forward(q, k, v, q_seg, q_pos, k_seg, k_pos, causal, block_q, block_k, q_par=q_par)
    return out, (q, k, v, q_seg, q_pos, k_seg, k_pos, q_par, out, lse)


def _flash_bwd(causal, block_q, block_k, residuals, d_out):
    """FlashAttention-2's backward: for each key block, loop over the query blocks that see it,
    recompute the probabilities from the saved log-sum-exp and accumulate dk, dv (carried per
    key block) and dq (one float32 [B, KV, G, Lq, hd] accumulator)."""
    q, k, v, q_seg, q_pos, k_seg, k_pos, q_par, out, lse = residuals
    head_dim = q.shape[-1]
    q_len, k_len = q.shape[3], k.shape[2]
    scale = head_dim**-0.5
    q_sum = _block_summary(q_seg, q_pos, block_q, q_par)
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
                                     _slice(q_pos, start, block_q, 1), ks, kp, causal, scale,
                                     q_par=None if q_par is None else _slice(q_par, start, block_q, 1))
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
    return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None, None)


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
    With cache_layout (the sampler's KV cache) the keys are read in place block by block and
    only the forward is defined (the sampler differentiates nothing).
    """
    batch, q_len, heads, head_dim = q.shape
    blocks = block_sizes(q_len, k.shape[-1] if cache_layout else k.shape[1], block)
    inputs = _flash_inputs(q, k, v, mask, cache_layout, block)
    if cache_layout:
        out = _flash_forward(*inputs[:7], mask.causal, *blocks, keys_t=True, q_par=inputs[7])[0]
    else:
        out = _flash(*inputs, mask.causal, *blocks)
    out = out[:, :, :, :q_len].transpose(0, 3, 1, 2, 4)
    return out.reshape(batch, q_len, heads, head_dim)


def _flash_inputs(q, k, v, mask: AttentionMask, cache_layout: bool, block: int):
    """The blockwise kernels' operands: q [B, KV, G, Lq', hd], k/v [B, KV, Lk', hd] (with
    cache_layout k stays [B, KV, hd, Lk']: a transpose here would copy a layer's whole key
    cache at every decode step) and the mask's segments and positions, padded to multiples of
    the blocks (block_sizes; a cache whose capacity the block divides is never copied), then
    the queries' parent segments (None without)."""
    batch, q_len, heads, head_dim = q.shape
    if not cache_layout:
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    kv_heads, k_len = v.shape[1], v.shape[2]
    block_q, block_k = block_sizes(q_len, k_len, block)
    qg = q.reshape(batch, q_len, kv_heads, heads // kv_heads, head_dim).transpose(0, 2, 3, 1, 4)
    qg = _pad_to(qg, 3, block_q)
    k, v = _pad_to(k, 3 if cache_layout else 2, block_k), _pad_to(v, 2, block_k)
    q_seg, q_pos = (_pad_to(x, 1, block_q) for x in (mask.query_segments, mask.query_positions))
    k_seg, k_pos = (_pad_to(x, 1, block_k) for x in (mask.key_segments, mask.key_positions))
    q_par = None if mask.query_parents is None else _pad_to(mask.query_parents, 1, block_q)
    return qg, k, v, q_seg, q_pos, k_seg, k_pos, q_par


def blockwise_partial(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, cache_layout: bool = False,
                      block: int = DEFAULT_BLOCK) -> tuple[jax.Array, jax.Array]:
    """The blockwise forward with each query's log-sum-exp, no custom gradient: (out [B, Lq, H,
    hd] float32, lse [B, Lq, H] float32), shapes as `blockwise_attention`. The keys are read
    only up to the last block that a row with a seeing query (query segment > 0) holds a key
    in: rows whose queries see nothing (a decode's finished rows) do not extend the read."""
    batch, q_len, heads, head_dim = q.shape
    key_len = k.shape[-1] if cache_layout else k.shape[1]
    inputs = _flash_inputs(q, k, v, mask, cache_layout, block)
    out, lse = _flash_forward(*inputs[:7], mask.causal, *block_sizes(q_len, key_len, block), keys_t=cache_layout,
                              bounded=True, q_par=inputs[7])
    out = out[:, :, :, :q_len].transpose(0, 3, 1, 2, 4).reshape(batch, q_len, heads, head_dim).astype(jnp.float32)
    lse = lse[:, :, :, :q_len].transpose(0, 3, 1, 2).reshape(batch, q_len, heads)
    return out, lse
