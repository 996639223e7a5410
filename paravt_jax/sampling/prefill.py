"""The sampler's prefill: one jitted program that writes a right-padded chunk per row into the
KV cache at the shared write pointer, one row group per call (Sampler.prefill drives the
groups from the host)."""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl.text import CacheView, KVCache
from paravt_jax.sampling.backend import SamplerBackend
from paravt_jax.sampling.kv_cache import CacheShardings, RowGroup, RowIndex, constrain, replicated
from paravt_jax.sampling.programs import merge


@dataclasses.dataclass(frozen=True)
class PrefillPlan:
    """The static arguments of a prefill: one compiled program per plan (and input shapes).
    window: the cache slots attended (CacheView.window); block: the attention block of a
    blockwise prefill; shards: the blocks the cache rows are split into over the devices (a
    row group takes the same rows of each)."""
    sharding: CacheShardings | None  # of the cache's layers (None without a mesh)
    backend: SamplerBackend
    window: int
    block: int
    shards: int = 1
    split_rows: bool = True  # SamplerConfig.prefill_row_split


class PrefillChunk(NamedTuple):
    """One row group's chunk: g rows of W tokens, right-padded."""
    ids: jax.Array  # [g, W] int32
    positions: jax.Array  # [3, g, W] int32
    counts: jax.Array  # [g] int32 real tokens per row
    visual_index: jax.Array | None  # [g, W]: row of visual_embeds (of its shard's) for vision pads, -1 elsewhere
    visual_embeds: jax.Array | None  # [Nv, D], or [S, Nv, D] per shard of rows (whole_features)
    deepstack: jax.Array | None  # [n_ds, Nv, D], or [n_ds, S, Nv, D]
    # [] int32: the cache slot of each row's first chunk token; [g]: each row's own (the group is
    # every row of the cache; a row past the capacity writes nothing)
    write_index: jax.Array
    row_start: jax.Array  # [] int32: the group's first row in each device's block of rows
    # a write slot per row: [B] bool, the cache rows that read their prompt's prefix (None: all)
    prefix_rows: jax.Array | None = None
    # a write slot per row: [g] int32, the cache row of each chunk row (None: the g rows are
    # every row of the cache)
    row_index: jax.Array | None = None


def whole_features(chunk: PrefillChunk, sharding: CacheShardings | None):
    """(visual_index, features, DeepStack) of a chunk as one table on every device. Features
    encoded per shard of rows ([S, Nv, D], shard s of the group's rows s * g/S ...) are joined
    into one [S * Nv, D] table, each row's index moved to its shard's block of it: the decoder
    then runs as with one replicated vision pass. (Left split, the features' row layout spread
    through the unrolled layers: the 8B's prefill gathered every layer's weights at once, 35 GiB
    of temporaries per device instead of 7.4, by XLA:CPU.)"""
    embeds, deepstack, index = chunk.visual_embeds, chunk.deepstack, chunk.visual_index
    if embeds is None or embeds.ndim == 2:
        return index, embeds, deepstack
    shards, per_shard, width = embeds.shape[0], embeds.shape[1], embeds.shape[2]
    rows = index.shape[0]
    offset = (jnp.arange(rows, dtype=index.dtype) // (rows // shards) * per_shard)[:, None]
    index = jnp.where(index >= 0, index + offset, -1)
    embeds, deepstack = embeds.reshape(-1, width), deepstack.reshape(deepstack.shape[0], -1, width)
    if sharding is not None:
        whole = NamedSharding(sharding.values.mesh, PartitionSpec())
        embeds, deepstack = jax.lax.with_sharding_constraint((embeds, deepstack), whole)
    return index, embeds, deepstack


def row_split(plan: PrefillPlan) -> tuple:
    """(constrain_rows, gather_weights) of TextDecoder.forward_cached: where the prefill's rows lie
    in the devices' blocks of cache rows (plan.shards > 1) its hidden states are split by rows
    and each layer's weights gathered whole on every device as the layer starts, so a device
    computes its own rows' tokens only; (None, None) otherwise (XLA's choice: every device
    computes all the group's tokens against its part of the weights), and on a mesh with a
    tensor axis, whose devices would each compute their rows with the whole layer instead of
    their share of it."""
    if plan.sharding is None or plan.shards == 1 or not plan.split_rows:
        return None, None
    mesh = plan.sharding.values.mesh
    if dict(mesh.shape).get("tensor", 1) > 1:
        return None, None
    whole = NamedSharding(mesh, PartitionSpec())
    return sh.row_constraint(mesh), lambda params: jax.lax.with_sharding_constraint(params, whole)


def block_prefixes(prefix: KVCache, shards: int, pin_rows=None) -> KVCache:
    """One prefix row per block of cache rows when the `shards` blocks outnumber the P prompts
    (each block lies within one prompt: block b reads prompt b // (shards / P)), split by rows as
    the hidden states are (`pin_rows`, row_split's), so each device holds its own prompt's keys
    and values; the attention then folds a block's rows onto its prefix row as it folds a
    prompt's samples. Without it such an extend (the 32B recipe's 8 prompts on 32 chips) could
    not split by rows: every device would compute every token of the group."""
    spread = shards // prefix.valid.shape[0]
    pin = pin_rows or (lambda x: x)
    return jax.tree.map(lambda a: pin(jnp.repeat(a, spread, axis=0)), prefix)


@functools.partial(jax.jit, static_argnames=("graphdef", "plan"), donate_argnames="cache")
def prefill(graphdef, params, weights, cache: KVCache, prefix: KVCache | None, chunk: PrefillChunk,
            plan: PrefillPlan) -> tuple[jax.Array, KVCache]:
    """One row group: the chunk's g rows are the cache rows RowGroup(row_start, g / shards,
    shards).order(B) (rows [row_start, row_start + g / shards) of each device's block of rows),
    written at `write_index` (or each row at its own, write_index [g], the g rows then the cache
    rows `chunk.row_index`), in place (the cache is donated); with `prefix` (None for a prompt
    prefill) the rows also attend to their prompts' prefixes. Returns (logits [g, V] of each
    row's last chunk token, the cache)."""
    lang = merge(graphdef, params).language
    group, width = chunk.ids.shape
    rows = None if group == cache.valid.shape[0] else RowGroup(chunk.row_start, group // plan.shards, plan.shards)
    if chunk.row_index is not None:
        rows = RowIndex(chunk.row_index)
    pin_rows, gather = row_split(plan)
    if prefix is not None and chunk.row_index is not None:  # each row's own prompt, gathered
        per_prompt = cache.valid.shape[0] // prefix.valid.shape[0]
        prefix = jax.tree.map(lambda a: a[chunk.row_index // per_prompt], prefix)
    elif prefix is not None and plan.shards > prefix.valid.shape[0]:
        prefix = block_prefixes(prefix, plan.shards, pin_rows)
    elif prefix is not None and rows is not None:
        per_prompt = cache.valid.shape[0] // prefix.valid.shape[0]
        prompts = RowGroup(chunk.row_start // per_prompt, max(rows.local // per_prompt, 1), plan.shards)
        prefix = jax.tree.map(prompts.read, prefix)
    fresh = jnp.arange(width)[None, :] < chunk.counts[:, None]
    if chunk.write_index.ndim == 1:  # each row's chunk at its own slots (Sampler.extend_turns / admit_turns)
        if chunk.row_index is None:
            raise ValueError("prefill: a write slot per row takes its rows by index (PrefillChunk.row_index)")
        slots = chunk.write_index[:, None] + jnp.arange(width)[None, :]
        valid = cache.valid.at[chunk.row_index[:, None], slots].set(fresh, mode="drop")
    elif rows is None:
        valid = jax.lax.dynamic_update_slice(cache.valid, fresh, (0, chunk.write_index))
    else:
        valid = rows.write(cache.valid, jax.lax.dynamic_update_slice(rows.read(cache.valid), fresh,
                                                                     (0, chunk.write_index)))
    view = CacheView(KVCache(cache.keys, cache.values, valid), chunk.write_index, window=plan.window,
                     prefix=prefix, rows=rows, prefix_rows=chunk.prefix_rows)
    visual_index, embeds, deepstack = whole_features(chunk, plan.sharding)
    hidden, cache = lang.forward_cached(chunk.ids, chunk.positions, view, visual_index, embeds, deepstack,
                                        layers=weights.layers, project=plan.backend.project, block=plan.block,
                                        constrain_rows=pin_rows, gather_weights=gather)
    last = jnp.maximum(chunk.counts - 1, 0)
    last_hidden = hidden[jnp.arange(group), last][:, None]
    logits = plan.backend.logits(lang, last_hidden, weights)[:, 0].astype(jnp.float32)
    if chunk.row_index is not None and plan.sharding is not None:  # one placement for programs.put_rows
        logits = jax.lax.with_sharding_constraint(logits, replicated(plan.sharding.values.mesh))
    return logits, constrain(cache, plan.sharding)


class PackedChunk(NamedTuple):
    """Fresh prompts packed into R rows of W tokens (sampling/chunks.py `pack_rows`): each
    prompt's tokens whole in one row at its offset, several prompts a row, no padding between
    them. `slot_rows` / `slot_index` [R * W]: the cache row and slot of each token (row = the
    cache's row count for padding tokens: dropped); `last` [P]: the flat index (row * W +
    column) of each cache row's last prompt token (0 for padding rows)."""
    ids: jax.Array  # [R, W] int32
    positions: jax.Array  # [3, R, W] int32
    segments: jax.Array  # [R, W] int32: 1, 2, ... per prompt of a row, 0 = padding
    visual_index: jax.Array | None  # [R, W]
    visual_embeds: jax.Array | None  # [Nv, D]
    deepstack: jax.Array | None  # [n_ds, Nv, D]
    slot_rows: jax.Array  # [R * W] int32
    slot_index: jax.Array  # [R * W] int32
    last: jax.Array  # [P] int32


@dataclasses.dataclass(frozen=True)
class PackedPlan:
    """The static arguments of a packed prompt prefill: the cache it fills (`rows` x `capacity`
    slots of `dtype`) and the attention block of its packed rows."""
    backend: SamplerBackend
    rows: int
    capacity: int
    dtype: str
    block: int


@functools.partial(jax.jit, static_argnames=("graphdef", "plan"))
def packed_prefill(graphdef, params, weights, chunk: PackedChunk, plan: PackedPlan) -> tuple[jax.Array, KVCache]:
    """The prompts of `chunk` through the decoder at once, only their own tokens computed
    (TextDecoder.forward_packed), their keys and values scattered into a new cache of
    plan.rows rows (row p: prompt p from slot 0, as a right-padded prefill writes it). Returns
    (logits [rows, V] of each prompt's last token, the cache)."""
    lang = merge(graphdef, params).language
    hidden, keys, values = lang.forward_packed(chunk.ids, chunk.positions, chunk.segments, chunk.visual_index,
                                               chunk.visual_embeds, chunk.deepstack, layers=weights.layers,
                                               project=plan.backend.project, block=plan.block)
    dtype = jnp.dtype(plan.dtype)
    rows, slots = chunk.slot_rows, chunk.slot_index

    def scatter(per_token, layout):  # [R, W, KV, hd] -> the cache layer
        flat = per_token.reshape(-1, *per_token.shape[2:]).astype(dtype)  # [T, KV, hd]
        kv_heads, head_dim = flat.shape[1:]
        if layout == "keys":  # [P, KV, hd, S]
            empty = jnp.zeros((plan.rows, kv_heads, head_dim, plan.capacity), dtype)
            return empty.at[rows, :, :, slots].set(flat, mode="drop")
        empty = jnp.zeros((plan.rows, kv_heads, plan.capacity, head_dim), dtype)  # [P, KV, S, hd]
        return empty.at[rows, :, slots, :].set(flat, mode="drop")

    valid = jnp.zeros((plan.rows, plan.capacity), bool).at[rows, slots].set(True, mode="drop")
    cache = KVCache(tuple(scatter(k, "keys") for k in keys), tuple(scatter(v, "values") for v in values), valid)
    last = hidden.reshape(-1, hidden.shape[-1])[chunk.last][:, None]
    logits = plan.backend.logits(lang, last, weights)[:, 0].astype(jnp.float32)
    return logits, cache
