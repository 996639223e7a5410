"""KV cache layout, buckets and sharding for the sampler.

The cache (the model's `KVCache`) is a tuple of one array per layer for keys,
[B, KV heads, head_dim, S], and one for values, [B, KV heads, S, head_dim]: both attention
products then contract over a leading axis of the cached operand, the form CPU matmul
kernels read fastest (keys stored [S, head_dim] made the decode's q.k product ~2x slower on
XLA:CPU). `CacheSpec.shape` names
the whole (stacked) value extent, `layer_shape` one value array, `key_layer_shape` one key
array."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from paravt_jax.infra import sharding as sh
from paravt_jax.infra.buckets import bucket
from paravt_jax.models.qwen3_vl.text import KVCache

CACHE_AXES = ("layers", "batch", "kv_heads", "cache_length", "head_dim")
KEY_AXES = ("batch", "kv_heads", "head_dim", "cache_length")


# ----------------------------------------------------------------------------- capacity schedule
# One schedule for the suffix cache, used by the sampler as it runs (Sampler.extend before a
# turn, Sampler._decode when a decode fills the cache) and by the planner for a full-budget
# episode (`capacity_after`).
def first_capacity(chunk_end: int, max_new_tokens: int, multiple: int) -> int:
    """Cache slots for a chunk ending at slot `chunk_end` and the start of its decode: room for
    min(max_new_tokens, max(64, chunk_end)) tokens plus one; the decode grows the cache with
    `grown_capacity` when it runs out."""
    room = min(max_new_tokens, max(64, chunk_end))
    return bucket(chunk_end + room + 1, 16, multiple)


def turn_capacity(capacity: int, chunk_end: int, max_new_tokens: int, multiple: int) -> int:
    """The suffix size for a turn whose chunk ends at slot `chunk_end`: `capacity` when it
    holds `first_capacity`, else that."""
    return max(capacity, first_capacity(chunk_end, max_new_tokens, multiple))


def grown_capacity(capacity: int, tokens_left: int, multiple: int) -> int:
    """The next cache size of a decode that filled all `capacity` slots with at most
    `tokens_left` tokens still to emit per row: enough for them, but at most double, so
    attention never reads more than ~2x the slots in use."""
    return bucket(min(capacity + tokens_left + 1, 2 * capacity), 16, multiple)


def capacity_after(capacity: int, chunk_end: int, budget: int, multiple: int) -> tuple[int, int]:
    """(capacity, the capacity before its last growth or 0) of a suffix of `capacity` slots
    after a chunk ending at slot `chunk_end` and a decode in which some row emits all `budget`
    tokens: `turn_capacity`, then `grown_capacity` each time the decode fills the suffix."""
    previous = 0
    grown = turn_capacity(capacity, chunk_end, budget, multiple)
    if grown > capacity:
        previous, capacity = capacity, grown
    last_write = chunk_end + budget - 1  # slots written once the last token is sampled
    while capacity < last_write:
        previous, capacity = capacity, grown_capacity(capacity, last_write - capacity, multiple)
    return capacity, previous


def episode_capacity(turns, min_chunk: int, multiple: int) -> int:
    """Suffix slots that an episode never outgrows: turns = [(chunk tokens, new tokens)], the
    first (0, M) for generate's decode after the prompt, then (tool-response tokens, budget)
    per extend. Mirrors Sampler.extend / Sampler._decode: an extend writes the pending token
    plus its chunk, bucketed to min_chunk, at the shared write pointer; a decode of n tokens
    writes n - 1 (the last stays pending); both check first_capacity."""
    write, capacity = 0, 0
    for chunk, budget in turns:
        end = write + (bucket(1 + chunk, min_chunk) if chunk else 0)
        capacity = max(capacity, first_capacity(end, budget, multiple), end + budget - 1)
        write = end + budget - 1
    return bucket(capacity, 16, multiple)


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    layers: int
    batch: int
    capacity: int
    kv_heads: int
    head_dim: int
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.layers, self.batch, self.kv_heads, self.capacity, self.head_dim)

    @property
    def layer_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def key_layer_shape(self) -> tuple[int, ...]:
        return (self.batch, self.kv_heads, self.head_dim, self.capacity)

    @property
    def bytes(self) -> int:
        return 2 * int(np.prod(self.shape)) * jnp.dtype(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class CacheShardings:
    keys: object  # NamedSharding of one layer's key array
    values: object  # NamedSharding of one layer's value array


def cache_sharding(mesh, spec: CacheSpec) -> CacheShardings | None:
    """The shardings of one layer's key and value arrays (None without a mesh)."""
    if mesh is None:
        return None
    return CacheShardings(sh.named_sharding(mesh, KEY_AXES, spec.key_layer_shape),
                          sh.named_sharding(mesh, CACHE_AXES[1:], spec.layer_shape))


@dataclasses.dataclass(frozen=True)
class RowGroup:
    """Rows [start, start + local) of each of `shards` equal blocks of cache rows: a prefill row
    group that takes the same rows of every device's block, so no device touches another's
    rows. The cached forward (TextDecoder.forward_cached) writes the group's chunk into the
    whole cache in place and reads only the group's rows, one layer at a time."""
    start: jax.Array
    local: int
    shards: int

    def _blocks(self, array):
        return array.reshape(self.shards, array.shape[0] // self.shards, *array.shape[1:])

    def read(self, array):
        part = jax.lax.dynamic_slice_in_dim(self._blocks(array), self.start, self.local, 1)
        return part.reshape(self.shards * self.local, *array.shape[1:])

    def write(self, array, part, slot_axis: int | None = None, slot=0):
        """`array` with `part` (the group's rows, as read) written at the group's rows and, along
        slot_axis, from `slot`."""
        part = part.reshape(self.shards, self.local, *part.shape[1:])
        index = [0, self.start] + [0] * (array.ndim - 1)
        if slot_axis is not None:
            index[slot_axis + 1] = slot
        return jax.lax.dynamic_update_slice(self._blocks(array), part, index).reshape(array.shape)

    def order(self, rows: int) -> np.ndarray:
        """[shards * local] the cache rows of the group, in the order read() returns them."""
        return (np.arange(self.shards)[:, None] * (rows // self.shards) + int(self.start)
                + np.arange(self.local)[None]).reshape(-1)


@dataclasses.dataclass(frozen=True)
class RowIndex:
    """Any rows of the cache, `index` [g] (a prefill of the rows that write, each at its own
    slots: Sampler.extend_turns / admit_turns). The cached forward gathers the rows' caches for
    its reads and writes each row's chunk into the whole cache at the row's slots."""
    index: jax.Array

    def read(self, array):
        return array[self.index]


def replicated(mesh) -> jax.sharding.NamedSharding:
    """Every device of `mesh` holds the whole array (one placement for the logits of a
    prefill with a slot per row, whichever program made them)."""
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def row_group(rows: int) -> int:
    """Rows of a prefill with a slot per row (Sampler.extend_turns / admit_turns): a quarter of
    the cache's rows (a refilled decode's default refill) to a power of two, at most every row:
    one compiled program for every refill, whatever number of rows writes."""
    return min(1 << (max(rows // 4, 1) - 1).bit_length(), rows)


def writing_groups(write_index: np.ndarray, capacity: int, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The groups of `size` rows of a prefill with a slot per row: the rows that write (slot <
    capacity) in order, the last group padded with rows that do not (row 0 when none is left).
    Each group: (its cache rows [size] int32, where its outputs go [size]: the row, or the
    row count for a padding entry, which is dropped)."""
    rows = write_index.shape[0]
    writing = np.flatnonzero(write_index < capacity)
    idle = np.flatnonzero(write_index >= capacity)
    groups = []
    for start in range(0, max(len(writing), 1), size):
        part = writing[start:start + size]
        pads = np.resize(idle if idle.size else np.zeros(1, np.int64), size - len(part))
        groups.append((np.concatenate([part, pads]).astype(np.int32),
                       np.concatenate([part, np.full(size - len(part), rows)]).astype(np.int32)))
    return groups


def row_shards(shardings: CacheShardings | None, spec: CacheSpec, prompts: int) -> int:
    """Blocks the cache rows are split into over the devices: each block holds whole prompts
    (`prompts` a multiple of the blocks) or lies within one prompt (the blocks a multiple of the
    prompts: a prefill gives each block its prompt's prefix, prefill.block_prefixes); 1 without a
    mesh, or when the prompts split otherwise (a prefill row group would read rows of other
    devices)."""
    if shardings is None:
        return 1
    shards = spec.batch // shardings.values.shard_shape(spec.layer_shape)[0]
    return shards if prompts % shards == 0 or shards % prompts == 0 else 1


def constrain(cache: KVCache, shardings: CacheShardings | None) -> KVCache:
    """with_sharding_constraint on every layer of a cache's keys and values."""
    if shardings is None:
        return KVCache(tuple(cache.keys), tuple(cache.values), cache.valid)
    return KVCache(tuple(jax.lax.with_sharding_constraint(a, shardings.keys) for a in cache.keys),
                   tuple(jax.lax.with_sharding_constraint(a, shardings.values) for a in cache.values), cache.valid)
