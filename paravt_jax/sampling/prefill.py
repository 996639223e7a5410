"""The sampler's prefill: one jitted program that writes a right-padded chunk per row into the
KV cache at the shared write pointer, one row group per call (Sampler._prefill drives the
groups from the host)."""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from paravt_jax.models.qwen3_vl.text import CacheView, KVCache
from paravt_jax.sampling.backend import SamplerBackend
from paravt_jax.sampling.kv_cache import CacheShardings, RowGroup, constrain
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


class PrefillChunk(NamedTuple):
    """One row group's chunk: g rows of W tokens, right-padded."""
    ids: jax.Array  # [g, W] int32
    positions: jax.Array  # [3, g, W] int32
    counts: jax.Array  # [g] int32 real tokens per row
    visual_index: jax.Array | None  # [g, W]: row of visual_embeds for vision pads, -1 elsewhere
    visual_embeds: jax.Array | None  # [Nv, D]
    deepstack: jax.Array | None  # [n_ds, Nv, D]
    write_index: jax.Array  # [] int32: the cache slot of each row's first chunk token
    row_start: jax.Array  # [] int32: the group's first row in each device's block of rows


@functools.partial(jax.jit, static_argnames=("graphdef", "plan"), donate_argnames="cache")
def prefill(graphdef, params, weights, cache: KVCache, prefix: KVCache | None, chunk: PrefillChunk,
            plan: PrefillPlan) -> tuple[jax.Array, KVCache]:
    """One row group: the chunk's g rows are the cache rows RowGroup(row_start, g / shards,
    shards).order(B) (rows [row_start, row_start + g / shards) of each device's block of rows),
    written at `write_index`, in place (the cache is donated); with `prefix` (None for a prompt
    prefill) the rows also attend to their prompts' prefixes. Returns (logits [g, V] of each
    row's last chunk token, the cache)."""
    lang = merge(graphdef, params).language
    group, width = chunk.ids.shape
    rows = None if group == cache.valid.shape[0] else RowGroup(chunk.row_start, group // plan.shards, plan.shards)
    if prefix is not None and rows is not None:
        per_prompt = cache.valid.shape[0] // prefix.valid.shape[0]
        prompts = RowGroup(chunk.row_start // per_prompt, max(rows.local // per_prompt, 1), plan.shards)
        prefix = jax.tree.map(prompts.read, prefix)
    fresh = jnp.arange(width)[None, :] < chunk.counts[:, None]
    if rows is None:
        valid = jax.lax.dynamic_update_slice(cache.valid, fresh, (0, chunk.write_index))
    else:
        valid = rows.write(cache.valid, jax.lax.dynamic_update_slice(rows.read(cache.valid), fresh,
                                                                     (0, chunk.write_index)))
    view = CacheView(KVCache(cache.keys, cache.values, valid), chunk.write_index, window=plan.window,
                     prefix=prefix, rows=rows)
    hidden, cache = lang.forward_cached(chunk.ids, chunk.positions, view, chunk.visual_index, chunk.visual_embeds,
                                        chunk.deepstack, layers=weights.layers, project=plan.backend.project,
                                        block=plan.block)
    last = jnp.maximum(chunk.counts - 1, 0)
    last_hidden = hidden[jnp.arange(group), last][:, None]
    logits = plan.backend.logits(lang, last_hidden, weights)[:, 0].astype(jnp.float32)
    return logits, constrain(cache, plan.sharding)
