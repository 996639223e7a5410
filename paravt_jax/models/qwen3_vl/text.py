"""Qwen3 text decoder with interleaved MRoPE and DeepStack injection, in Flax NNX.

Layer parameters are stored stacked along a leading `layers` axis so that the same
parameters serve an unrolled loop or a `lax.scan` (config.scan_layers).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from paravt_jax.models.qwen3_vl import layers as L
from paravt_jax.models.qwen3_vl.attention import attend, attend_partial, merge_partials, shared_prefix_partial
from paravt_jax.models.qwen3_vl.attention_mask import AttentionMask
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.models.qwen3_vl.rope import mrope_tables


def dense_projections(x: jax.Array, params: dict, names: tuple[str, ...],
                      sizes: tuple[int, ...]) -> tuple[jax.Array, ...]:
    """(x @ params[name] for each name), kernels stored [in, out]. The sampler passes its own
    projections (paravt_jax/sampling/backend.py) for the weight layouts it builds."""
    del sizes
    return tuple(L.dense(x, params[name]) for name in names)


def visual_rows(table: jax.Array, index: jax.Array) -> jax.Array:
    """Vision features for each token: table [Nv, D] indexed by index [B, L] -> [B, L, D]. A
    sharded table [S, Nv, D] (a training micro-batch whose rows are split over S shards, shard
    s holding rows s * B/S ... (s + 1) * B/S - 1 and their frames' features) is indexed shard by
    shard, each row within its own shard's features: the gather stays on the devices of a shard."""
    if table.ndim == 2:
        return table[index]
    shards = table.shape[0]
    rows, length = index.shape
    if rows % shards:
        raise ValueError(f"{rows} rows do not split over {shards} vision shards")
    local = index.reshape(shards, rows // shards, length)
    return jax.vmap(lambda t, i: t[i])(table, local).reshape(rows, length, table.shape[-1])


@dataclasses.dataclass(frozen=True)
class KVCache:
    """Cached keys and values of B rows, one array per layer (a layer's attention then reads
    its own buffer: slicing one layer out of a stacked cache copies it on XLA:CPU/GPU, every
    decode step): keys [B, KV, hd, S] and values [B, KV, S, hd] (both attention products then
    contract over a leading axis of the cached operand); valid [B, S] marks the filled slots."""
    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    valid: jax.Array

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]


jax.tree_util.register_dataclass(KVCache, data_fields=["keys", "values", "valid"], meta_fields=[])


@dataclasses.dataclass(frozen=True)
class CacheView:
    """What a cached forward reads and writes. `cache`: the KV cache whose rows the call writes
    (its `valid` already marks the chunk's slots, so padding slots are never attended); the
    chunk goes to slots [write_index, write_index + P) of every row (write_index [B]: each row at
    its own slots, a scattered write that drops the slots past the capacity; rows=None only). `window` (static, >=
    write_index + P; None = the capacity) limits attention to the first `window` slots: a
    prefill into an empty or short cache then costs O(P * window), not O(P * S). `prefix`:
    keys and values that groups of rows share and attend before their own cache (row b reads
    prefix b // (B / P)); read, never written. `rows`: which rows of the cache the call's rows
    are (an object with read(array) -> those rows and write(array, chunk, slot_axis, slot) ->
    the array with chunk written at those rows; sampling/kv_cache.RowGroup), or, with a write
    slot per row, rows by index (an object with read(array) and `index` [g]:
    sampling/kv_cache.RowIndex); None: all rows.
    `active` ([B] bool, None: every row as before): the attention bounded per row, for a
    decode: a row whose flag is off attends to nothing (its output is not used), and the rows'
    own cache is read only up to the last block that an active row holds a key in (blockwise,
    one program for every fill; attention.attend_partial). `paged` (None: the contiguous read):
    a one-token decode step that attends on pages instead (sampling/pages.PagedView: its
    attend(layer, q, k, v) writes the step's key and value into the layer's pool and returns
    (the attention output, the pool)); the chunk is still written into `cache`, and
    forward_cached returns the pools too. `prefix_rows` ([B] bool, None: every row): the rows
    that read `prefix`; the others attend to their own cache only (a refilled decode's row
    that took other work, its whole prompt in its own cache: Sampler.admit_turns)."""
    cache: KVCache
    write_index: jax.Array
    window: int | None = None
    prefix: KVCache | None = None
    rows: object = None
    active: jax.Array | None = None
    paged: object = None
    prefix_rows: jax.Array | None = None

    def read_rows(self, array):
        return array if self.rows is None else self.rows.read(array)


class PrefixLayer(NamedTuple):
    """One layer of a shared prefix (a KVCache): keys [P, KV, hd, S], values [P, KV, S, hd], valid [P, S];
    queries [B] bool: the rows that attend (None: all; CacheView.active)."""
    keys: jax.Array
    values: jax.Array
    valid: jax.Array
    queries: jax.Array | None = None


class TextDecoder(nnx.Module):
    def __init__(self, config: Qwen3VLConfig, *, rngs: nnx.Rngs):
        t = config.text
        if t.attention_bias:
            raise ValueError("text_config.attention_bias=True is not supported (Qwen3-VL has none)")
        self.config = t
        self.num_deepstack = len(config.vision.deepstack_visual_indexes)
        self.tie_word_embeddings = config.tie_word_embeddings
        self.remat, self.scan = config.remat, config.scan_layers
        self.attention_impl, self.attention_block = config.attention, config.attention_block
        self.dtype = L.to_dtype(config.dtype)
        pd = L.to_dtype(config.param_dtype)
        d, f, n = t.hidden_size, t.intermediate_size, t.num_hidden_layers
        qd, kvd = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
        p = lambda shape, axes, init="normal": L.make_param(rngs, shape, axes, init, pd,
                                                           t.initializer_range)
        self.embed_tokens = p((t.vocab_size, d), ("vocab", "embed"))
        lay = "layers"
        self.layers = nnx.Dict(
            input_norm=p((n, d), (lay, "norm"), "ones"),
            q_proj=p((n, d, qd), (lay, "embed", "heads")),
            k_proj=p((n, d, kvd), (lay, "embed", "kv_heads")),
            v_proj=p((n, d, kvd), (lay, "embed", "kv_heads")),
            o_proj=p((n, qd, d), (lay, "heads", "embed")),
            q_norm=p((n, t.head_dim), (lay, "head_dim"), "ones"),
            k_norm=p((n, t.head_dim), (lay, "head_dim"), "ones"),
            post_norm=p((n, d), (lay, "norm"), "ones"),
            gate_proj=p((n, d, f), (lay, "embed", "mlp")),
            up_proj=p((n, d, f), (lay, "embed", "mlp")),
            down_proj=p((n, f, d), (lay, "mlp", "embed")),
        )
        self.norm = p((d,), ("norm",), "ones")
        if not config.tie_word_embeddings:
            self.lm_head = p((d, t.vocab_size), ("embed", "vocab"))

    # -- pieces reused by the sampler -----------------------------------------------------
    def embed(self, input_ids: jax.Array, visual_index: jax.Array | None,
              visual_embeds: jax.Array | None) -> jax.Array:
        """Token embeddings with visual placeholders replaced by vision tokens.

        visual_index [B, L]: row into visual_embeds [Nv, D] for vision pads, -1 elsewhere (or
        into its shard's rows of a sharded visual_embeds [S, Nv, D], see `visual_rows`).
        """
        x = self.embed_tokens[...].astype(self.dtype)[input_ids]
        if visual_embeds is not None and visual_index is not None:
            rows = visual_rows(visual_embeds.astype(self.dtype), jnp.maximum(visual_index, 0))
            x = jnp.where((visual_index >= 0)[..., None], rows, x)
        return x

    def attention(self, x, params, cos, sin, mask: AttentionMask, kv=None, cache_layout=False,
                  project=dense_projections, block: int | None = None, prefix: PrefixLayer | None = None,
                  bounded: bool = False, paged=None):
        """Returns (output [B, L, D], (k, v) of this chunk [B, L, KV, hd]). `kv` maps this
        chunk's keys and values to the ones attended (the sampler's cache write); `paged`, a
        function (q, k, v) -> output [B, L, H, hd], attends instead of them (a decode step on
        pages: CacheView.paged). With
        `prefix`, the queries also attend to a prefix shared by groups of rows (before every
        key of `mask`), merged with the rest through the two parts' log-sum-exps; `bounded`:
        the row's own keys (`keys`, `values`) are read only as far as they are filled
        (attention.attend_partial)."""
        t = self.config
        b, n, _ = x.shape
        qd, kvd = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
        q, k, v = project(x, params, ("q_proj", "k_proj", "v_proj"), (qd, kvd, kvd))
        q = q.reshape(b, n, t.num_attention_heads, t.head_dim)
        k = k.reshape(b, n, t.num_key_value_heads, t.head_dim)
        v = v.reshape(b, n, t.num_key_value_heads, t.head_dim)
        q = L.rms_norm(q, params["q_norm"], t.rms_norm_eps)
        k = L.rms_norm(k, params["k_norm"], t.rms_norm_eps)
        q = L.apply_rotary(q, cos[:, :, None, :], sin[:, :, None, :])
        k = L.apply_rotary(k, cos[:, :, None, :], sin[:, :, None, :])
        keys, values = (k, v) if kv is None else kv(k, v)
        block = block or self.attention_block
        if paged is not None:
            out = paged(q, k, v).astype(q.dtype)
        elif prefix is None and not bounded:
            out = attend(q, keys, values, mask, self.attention_impl, cache_layout=cache_layout, block=block)
        elif prefix is None:
            out = attend_partial(q, keys, values, mask, self.attention_impl, cache_layout=cache_layout, block=block,
                                 bounded=True)[0].astype(q.dtype)
        else:
            own = attend_partial(q, keys, values, mask, self.attention_impl, cache_layout=cache_layout, block=block,
                                 bounded=bounded)
            # the prompt is filled to its bucket from the first step: its read is not bounded
            # further (blockwise, when chosen, still stops at the last filled block)
            shared = shared_prefix_partial(q, prefix.keys, prefix.values, prefix.valid, self.attention_impl, block,
                                           queries=prefix.queries)
            out = merge_partials(shared, own).astype(q.dtype)
        out = out.reshape(b, n, -1)
        return project(out, params, ("o_proj",), (t.hidden_size,))[0], (k, v)

    def layer(self, x, params, cos, sin, mask: AttentionMask, kv=None, cache_layout=False,
              project=dense_projections, block: int | None = None, prefix: PrefixLayer | None = None,
              bounded: bool = False, paged=None):
        t = self.config
        h, new_kv = self.attention(L.rms_norm(x, params["input_norm"], t.rms_norm_eps),
                                   params, cos, sin, mask, kv, cache_layout, project, block, prefix, bounded, paged)
        x = x + h
        y = L.rms_norm(x, params["post_norm"], t.rms_norm_eps)
        gate, up = project(y, params, ("gate_proj", "up_proj"), (t.intermediate_size,) * 2)
        y = jax.nn.silu(gate) * up
        return x + project(y, params, ("down_proj",), (t.hidden_size,))[0], new_kv

    def final_norm(self, hidden: jax.Array) -> jax.Array:
        return L.rms_norm(hidden, self.norm[...], self.config.rms_norm_eps)

    def head(self) -> jax.Array:
        """The output projection as [vocab, D]: the tied embeddings, else the lm head transposed."""
        return self.embed_tokens[...] if self.tie_word_embeddings else self.lm_head[...].T

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Output logits [..., vocab] in the compute dtype."""
        h = self.final_norm(hidden)
        if self.tie_word_embeddings:
            return jnp.einsum("...d,vd->...v", h, self.embed_tokens[...].astype(h.dtype))
        return L.dense(h, self.lm_head[...])

    def layer_params(self) -> dict:
        return {k: v[...] for k, v in self.layers.items()}

    def layer_slices(self) -> tuple[dict, ...]:
        """One parameter dict per layer, sliced from the stacked parameters."""
        stacked = self.layer_params()
        return tuple({name: p[i] for name, p in stacked.items()}
                     for i in range(self.config.num_hidden_layers))

    def _deepstack_adder(self, visual_index, deepstack):
        """f(x, i) adding DeepStack feature i at visual positions after layer i < n_ds."""
        if deepstack is None or visual_index is None:
            return lambda x, i: x
        is_visual = (visual_index >= 0)[..., None]
        gather = jnp.maximum(visual_index, 0)
        num_ds = self.num_deepstack

        def add(x, i):
            if isinstance(i, int):
                if i >= num_ds:
                    return x
                return x + jnp.where(is_visual, visual_rows(deepstack[i].astype(x.dtype), gather), 0)
            j = jnp.minimum(i, num_ds - 1)
            return x + jnp.where(is_visual & (i < num_ds), visual_rows(deepstack[j].astype(x.dtype), gather), 0)

        return add

    # -- cached forward (sampler) ---------------------------------------------------------
    def forward_cached(self, input_ids: jax.Array, position_ids: jax.Array, view: CacheView,
                       visual_index: jax.Array | None = None, visual_embeds: jax.Array | None = None,
                       deepstack: jax.Array | None = None, *, layers: tuple[dict, ...] | None = None,
                       project=dense_projections, block: int | None = None,
                       constrain_rows=None, gather_weights=None) -> tuple[jax.Array, KVCache]:
        """Runs a chunk of P tokens per row on top of a KV cache (see CacheView).

        All rows write their chunk to the same slots with one in-place `dynamic_update_slice`
        per layer, so rows of different lengths and turns share the cache (or, write_index [B],
        each row at its own slot: a decode whose rows restart as they are refilled). Token p
        attends to valid slots <= write_index + p. input_ids [B, P], position_ids [3, B, P]. `layers`
        supplies per-layer parameter dicts and `project` the matmuls that read them (the
        sampler's weight layouts, paravt_jax/sampling/backend.py); by default the stacked
        parameters are sliced here. `block` (static): the attention block of a blockwise
        prefill (default config.attention_block). The layers are unrolled. `constrain_rows` (a
        function of a [B, ...] array, e.g. `sharding.row_constraint(mesh)`; a prefill whose rows
        lie in the devices' blocks of cache rows) pins the hidden states to a row-split layout;
        `gather_weights` (a function of one layer's parameter dict) then gathers each layer's
        weights whole when that layer starts (after a barrier on the layer's input and weights),
        not every layer's at once.
        Returns (hidden [B, P, D], the cache with the chunk's keys and values written), and with
        view.paged the pools written as a third element.
        """
        t = self.config
        cache = view.cache
        if len(cache.keys) != t.num_hidden_layers or len(cache.values) != t.num_hidden_layers:
            raise ValueError(f"forward_cached: {len(cache.keys)}/{len(cache.values)} cache layers for a "
                             f"{t.num_hidden_layers}-layer decoder")
        length = input_ids.shape[1]
        pin = constrain_rows or (lambda a: a)
        x = pin(self.embed(input_ids, visual_index, visual_embeds))
        cos, sin = mrope_tables(position_ids, t, self.dtype)
        valid = view.read_rows(cache.valid)
        capacity = valid.shape[1]
        window = capacity if view.window is None else min(int(view.window), capacity)
        slot = jnp.asarray(view.write_index, jnp.int32)
        per_row = slot.ndim == 1
        if per_row and view.rows is not None and not hasattr(view.rows, "index"):
            raise ValueError("forward_cached: a write slot per row takes every row of the cache or rows by index")
        query_slots = (slot[:, None] if per_row else slot) + jnp.arange(length)
        mask = AttentionMask.cache(valid[:, :window], query_slots)
        bounded = view.active is not None
        if bounded:  # rows that no longer sample see nothing, and so never extend the read
            active = view.read_rows(view.active)
            seeing = jnp.broadcast_to(active[:, None], mask.query_segments.shape).astype(jnp.int32)
            mask = dataclasses.replace(mask, query_segments=seeing)
        add_deepstack = self._deepstack_adder(visual_index, deepstack)
        rows, prefix = view.rows, view.prefix
        reading = active if bounded else None  # the rows whose queries read the prefix (None: all)
        if view.prefix_rows is not None:
            own = view.read_rows(view.prefix_rows)
            reading = own if reading is None else reading & own
        if layers is None:
            layers = self.layer_slices()
        out_k, out_v, pools = [], [], []
        for i, params in enumerate(layers):
            written = {}

            def kv(k_new, v_new, ck=cache.keys[i], cv=cache.values[i], written=written):
                # chunk [B, P, KV, hd] -> keys [B, KV, hd, P], values [B, KV, P, hd]
                k_chunk = k_new.transpose(0, 2, 3, 1).astype(ck.dtype)
                v_chunk = v_new.transpose(0, 2, 1, 3).astype(cv.dtype)
                if per_row:  # each row's chunk at its own slots (past the capacity: dropped, not clamped)
                    b = (jnp.arange(ck.shape[0]) if rows is None else rows.index)[:, None]
                    slots = slot[:, None] + jnp.arange(length)[None]
                    new_k = ck.at[b, :, :, slots].set(k_chunk.transpose(0, 3, 1, 2), mode="drop")
                    new_v = cv.at[b, :, slots, :].set(v_chunk.transpose(0, 2, 1, 3), mode="drop")
                elif rows is None:
                    new_k = jax.lax.dynamic_update_slice(ck, k_chunk, (0, 0, 0, slot))
                    new_v = jax.lax.dynamic_update_slice(cv, v_chunk, (0, 0, slot, 0))
                else:
                    new_k, new_v = rows.write(ck, k_chunk, 3, slot), rows.write(cv, v_chunk, 2, slot)
                # the barrier: write in place first, then read (else XLA may fuse the read with
                # the write and copy the whole layer's cache to keep the original)
                written["k"], written["v"] = jax.lax.optimization_barrier((new_k, new_v))
                keys, values = view.read_rows(written["k"]), view.read_rows(written["v"])
                keys, values = keys[..., :window], values[:, :, :window]
                return keys.astype(k_new.dtype), values.astype(v_new.dtype)

            shared = None if prefix is None else PrefixLayer(prefix.keys[i], prefix.values[i], prefix.valid,
                                                             reading)
            paged = None
            if view.paged is not None:
                def paged(q, k_new, v_new, i=i):
                    out, pool = view.paged.attend(i, q, k_new, v_new)
                    pools.append(pool)
                    return out
            if gather_weights is not None:  # this layer's weights are gathered after the last layer's output
                x, params = jax.lax.optimization_barrier((x, params))
                params = gather_weights(params)
            x, _ = self.layer(x, params, cos, sin, mask, kv, cache_layout=True, project=project, block=block,
                              prefix=shared, bounded=bounded, paged=paged)
            x = pin(add_deepstack(x, i))
            out_k.append(written["k"])
            out_v.append(written["v"])
        cache = KVCache(tuple(out_k), tuple(out_v), cache.valid)
        return (x, cache) if view.paged is None else (x, cache, tuple(pools))

    def forward_packed(self, input_ids: jax.Array, position_ids: jax.Array, segment_ids: jax.Array,
                       visual_index: jax.Array | None = None, visual_embeds: jax.Array | None = None,
                       deepstack: jax.Array | None = None, *, layers: tuple[dict, ...] | None = None,
                       project=dense_projections, block: int | None = None
                       ) -> tuple[jax.Array, tuple[jax.Array, ...], tuple[jax.Array, ...]]:
        """Fresh sequences (no cache) packed into rows: input_ids, segment_ids [R, W] (segment
        ids 1, 2, ... per sequence of a row, 0 = padding), position_ids [3, R, W] (each sequence
        its own). A token attends to the earlier tokens of its own sequence only (blockwise, the
        blocks of other sequences skipped). `layers`, `project` and `block` as forward_cached's.
        Returns (hidden [R, W, D], and per layer the keys and values [R, W, KV, hd] that a cache
        of those sequences holds: the sampler's ragged prompt prefill, sampling/prefill.py)."""
        x = self.embed(input_ids, visual_index, visual_embeds)
        cos, sin = mrope_tables(position_ids, self.config, self.dtype)
        mask = AttentionMask.causal_segments(segment_ids, packed=True)
        add_deepstack = self._deepstack_adder(visual_index, deepstack)
        keys, values = [], []
        for i, params in enumerate(self.layer_slices() if layers is None else layers):
            x, (k, v) = self.layer(x, params, cos, sin, mask, project=project, block=block)
            x = add_deepstack(x, i)
            keys.append(k)
            values.append(v)
        return x, tuple(keys), tuple(values)

    # -- full-sequence forward ------------------------------------------------------------
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, position_ids: jax.Array,
                 visual_index: jax.Array | None = None, visual_embeds: jax.Array | None = None,
                 deepstack: jax.Array | None = None, return_hidden: bool = False,
                 packed: bool = False, constrain_rows=None, parents: jax.Array | None = None) -> jax.Array:
        """input_ids, attention_mask, visual_index [B, L]; position_ids [3, B, L];
        visual_embeds [Nv, D]; deepstack [n_ds, Nv, D]. Returns logits [B, L, vocab] in float32
        (or the final hidden states [B, L, D] before the norm when return_hidden).
        attention_mask: 0 for padding; with `packed` (static) it holds segment ids (1, 2, ...
        per packed sequence of a row) and a token attends only within its own segment (each
        segment then carries its own position_ids); `parents` [B, L] (packed only): the segment
        whose earlier tokens each token also sees (0: none; a prompt stored once for the packed
        sequences that share it). `constrain_rows` (a function of a [B, ...]
        array, e.g. `sharding.row_constraint(mesh)`) pins each layer's input and output to a
        row-split layout on a mesh."""
        t = self.config
        x = self.embed(input_ids, visual_index, visual_embeds)
        cos, sin = mrope_tables(position_ids, t, self.dtype)
        segments = attention_mask.astype(jnp.int32) if packed else (attention_mask != 0).astype(jnp.int32)
        mask = AttentionMask.causal_segments(segments, packed=packed, parent_ids=parents)
        add_deepstack = self._deepstack_adder(visual_index, deepstack)

        def body(x, params, i):
            x, _ = self.layer(x, params, cos, sin, mask)
            return add_deepstack(x, i)

        x = L.run_layers(body, x, self.layer_params(), t.num_hidden_layers,
                         scan=self.scan, remat=self.remat, constrain=constrain_rows)
        if return_hidden:
            return x
        return self.logits(x).astype(jnp.float32)
