"""The factored attention mask every attention implementation takes (models/qwen3_vl/attention.py).

Key j is visible to query i when both are in the same non-zero segment (or key j is in query i's
parent segment: a prompt shared by several packed sequences) and, for a causal mask,
key_positions[j] <= query_positions[i]. Segment 0 marks padding queries and empty keys. The
mask stays in this form (O(L) memory) and is expanded to [B, Lq, Lk] only by `dense()`.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

# Masked attention logits get this value instead of -inf so that a fully masked row stays finite.
MASK_VALUE = -1e30


@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """Which keys each query sees, in factored form (O(L) memory instead of O(Lq * Lk)).

    query_segments [B, Lq], key_segments [B, Lk] int32: a query sees only keys of its own
    segment; segment 0 = padding query / empty key. query_positions [B, Lq], key_positions
    [B, Lk] int32: with `causal`, a query sees only keys at positions <= its own.
    `kind` (static) tells the fused kernels what structure the mask has: "full" (no mask),
    "causal" (self-attention, positions 0..L-1, segments either one per row with right padding
    or, with `packed`, several) or "cache" (queries over a KV cache).
    query_parents [B, Lq] int32 or None: a query also sees the keys of this segment (0: none);
    packed rows whose sequences share a prompt stored once (train/batch.py `SharedPrompts`).
    """
    query_segments: jax.Array
    key_segments: jax.Array
    query_positions: jax.Array
    key_positions: jax.Array
    causal: bool
    kind: str
    packed: bool = False
    query_parents: jax.Array | None = None

    @staticmethod
    def full(batch: int, query_len: int, key_len: int) -> AttentionMask:
        """Every query sees every key (the vision tower's attention within one frame)."""
        q = jnp.ones((batch, query_len), jnp.int32)
        k = jnp.ones((batch, key_len), jnp.int32)
        return AttentionMask(q, k, jnp.zeros_like(q), jnp.zeros_like(k), causal=False, kind="full")

    @staticmethod
    def causal_segments(segment_ids: jax.Array, packed: bool = False,
                        parent_ids: jax.Array | None = None) -> AttentionMask:
        """Causal self-attention over segment_ids [B, L] (0 = padding; one segment per row is an
        attention mask, several with `packed`); token order is position order. parent_ids [B, L]
        (packed rows only): each token also sees the earlier tokens of that segment (0: none)."""
        segments = jnp.asarray(segment_ids).astype(jnp.int32)
        positions = jnp.broadcast_to(jnp.arange(segments.shape[1], dtype=jnp.int32), segments.shape)
        if parent_ids is not None and not packed:
            raise ValueError("parent segments need packed rows (segment ids)")
        parents = None if parent_ids is None else jnp.asarray(parent_ids).astype(jnp.int32)
        return AttentionMask(segments, segments, positions, positions, causal=True, kind="causal",
                             packed=packed, query_parents=parents)

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
        return visible(self.query_segments, self.query_positions, self.key_segments,
                       self.key_positions, self.causal, self.query_parents)


jax.tree_util.register_dataclass(
    AttentionMask, data_fields=["query_segments", "key_segments", "query_positions", "key_positions",
                                "query_parents"],
    meta_fields=["causal", "kind", "packed"])


def visible(q_seg, q_pos, k_seg, k_pos, causal: bool, q_par=None) -> jax.Array:
    """[B, Lq] and [B, Lk] -> [B, Lq, Lk] bool (q_par [B, Lq]: each query's parent segment)."""
    same = q_seg[:, :, None] == k_seg[:, None, :]
    if q_par is not None:
        same |= q_par[:, :, None] == k_seg[:, None, :]
    allowed = same & (k_seg[:, None, :] != 0)
    if causal:
        allowed &= k_pos[:, None, :] <= q_pos[:, :, None]
    return allowed
