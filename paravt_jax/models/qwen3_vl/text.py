"""Qwen3 text decoder with interleaved MRoPE and DeepStack injection, in Flax NNX.

Layer parameters are stored stacked along a leading `layers` axis so that the same
parameters serve an unrolled loop or a `lax.scan` (config.scan_layers).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from paravt_jax.models.qwen3_vl import layers as L
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.models.qwen3_vl.rope import mrope_tables

# Cached forwards whose float32 attention scores would exceed this run chunked_attention.
CHUNK_SCORE_BYTES = 16 << 20
# ... and so do cached forwards of at least this many queries (causal block skipping).
CHUNK_MIN_QUERIES = 256


class CachedMask(NamedTuple):
    """The cache mask in factored form (for chunked_attention): key s is visible to query i
    when valid[b, s] and s <= query_slots[i]."""
    valid: jax.Array  # [B, window]
    query_slots: jax.Array  # [P]
    score_bytes: int  # chunked_attention's score block budget


class DecodeWeights(NamedTuple):
    """Weight copies laid out for the sampler (see TextDecoder.decode_weights)."""
    layers: tuple  # per-layer parameter dicts, projections [out, in] under `<name>_t`
    head_t: jax.Array | None  # untied lm head [vocab, D]; None when tied to the embeddings


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# Projections that read the same input, stored as one [sum(out), in] weight by
# `unstacked_layers` (one matmul: fewer, wider GEMMs are faster at decode's few rows).
FUSED = {("q_proj", "k_proj", "v_proj"): "qkv_t", ("gate_proj", "up_proj"): "gate_up_t"}


# Token counts up to which a matmul with a large [out, in] weight runs as weight @ x^T (the
# weight as the tall operand): XLA:CPU streams a weight that does not fit its caches 1.1-1.3x
# faster that way at decode's few rows (measured at 4-32 rows); larger inputs and small
# weights keep x @ weight^T.
WEIGHT_FIRST_MAX_ROWS = 64
WEIGHT_FIRST_MIN_BYTES = 1 << 20


def matmul_t(x: jax.Array, weight_t: jax.Array) -> jax.Array:
    """x [..., in] @ weight_t [out, in]^T -> [..., out]."""
    weight_t = weight_t.astype(x.dtype)
    if (np.prod(x.shape[:-1]) <= WEIGHT_FIRST_MAX_ROWS
            and weight_t.size * weight_t.dtype.itemsize >= WEIGHT_FIRST_MIN_BYTES
            and jax.default_backend() == "cpu"):  # measured on XLA:CPU only
        return jnp.moveaxis(jnp.einsum("oi,...i->o...", weight_t, x), 0, -1)
    return jnp.einsum("...i,oi->...o", x, weight_t)


def _project_many(x: jax.Array, params: dict, names: tuple[str, ...], sizes: tuple[int, ...]):
    """(x @ kernel for each name), from the fused [sum(sizes), in] weight when present."""
    fused = FUSED.get(names)
    if fused in params:
        y = matmul_t(x, params[fused])
        cuts = np.cumsum(sizes)[:-1].tolist()
        return tuple(jnp.split(y, cuts, axis=-1))
    return tuple(_project(x, params, n) for n in names)


def _project(x: jax.Array, params: dict, name: str) -> jax.Array:
    """x @ kernel, with the kernel stored [in, out] under `name` or [out, in] under name_t."""
    if name + "_t" in params:
        return matmul_t(x, params[name + "_t"])
    return L.dense(x, params[name])


class TextDecoder(nnx.Module):
    def __init__(self, config: Qwen3VLConfig, *, rngs: nnx.Rngs):
        t = config.text
        if t.attention_bias:
            raise ValueError("text_config.attention_bias=True is not supported (Qwen3-VL has none)")
        self.config = t
        self.num_deepstack = len(config.vision.deepstack_visual_indexes)
        self.tie_word_embeddings = config.tie_word_embeddings
        self.remat, self.scan = config.remat, config.scan_layers
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

        visual_index [B, L]: row into visual_embeds [Nv, D] for vision pads, -1 elsewhere.
        """
        x = self.embed_tokens[...].astype(self.dtype)[input_ids]
        if visual_embeds is not None and visual_index is not None:
            rows = visual_embeds.astype(self.dtype)[jnp.maximum(visual_index, 0)]
            x = jnp.where((visual_index >= 0)[..., None], rows, x)
        return x

    def attention(self, x, params, cos, sin, mask, kv=None, cache_layout=False):
        """Returns (output [B, L, D], (k, v) of this chunk [B, L, KV, hd])."""
        t = self.config
        b, n, _ = x.shape
        qd, kvd = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
        q, k, v = _project_many(x, params, ("q_proj", "k_proj", "v_proj"), (qd, kvd, kvd))
        q = q.reshape(b, n, t.num_attention_heads, t.head_dim)
        k = k.reshape(b, n, t.num_key_value_heads, t.head_dim)
        v = v.reshape(b, n, t.num_key_value_heads, t.head_dim)
        q = L.rms_norm(q, params["q_norm"], t.rms_norm_eps)
        k = L.rms_norm(k, params["k_norm"], t.rms_norm_eps)
        q = L.apply_rotary(q, cos[:, :, None, :], sin[:, :, None, :])
        k = L.apply_rotary(k, cos[:, :, None, :], sin[:, :, None, :])
        keys, values = (k, v) if kv is None else kv(k, v)
        if isinstance(mask, CachedMask):
            # a prefill chunk: attend in row groups and query blocks, each segment of blocks
            # reading only the keys it may see (the chunk's causal triangle; see chunked_attention)
            out = L.chunked_attention(q, keys, values, mask.valid, mask.query_slots, cache_layout,
                                      max_score_bytes=mask.score_bytes,
                                      causal_offset=keys.shape[-1] - n).reshape(b, n, -1)
        else:
            out = L.dot_attention(q, keys, values, mask, cache_layout).reshape(b, n, -1)
        return _project(out, params, "o_proj"), (k, v)

    def layer(self, x, params, cos, sin, mask, kv=None, cache_layout=False):
        t = self.config
        h, new_kv = self.attention(L.rms_norm(x, params["input_norm"], t.rms_norm_eps),
                                   params, cos, sin, mask, kv, cache_layout)
        x = x + h
        y = L.rms_norm(x, params["post_norm"], t.rms_norm_eps)
        gate, up = _project_many(y, params, ("gate_proj", "up_proj"), (t.intermediate_size,) * 2)
        y = jax.nn.silu(gate) * up
        return x + _project(y, params, "down_proj"), new_kv

    def logits(self, hidden: jax.Array, head_t: jax.Array | None = None) -> jax.Array:
        """Output logits; head_t (optional) is the untied lm head stored [vocab, D]
        (`decode_weights`), which XLA:CPU multiplies ~1.4x faster at 8-32 rows."""
        h = L.rms_norm(hidden, self.norm[...], self.config.rms_norm_eps)
        if self.tie_word_embeddings:
            head_t = self.embed_tokens[...]
        if head_t is not None:
            return matmul_t(h, head_t)
        return L.dense(h, self.lm_head[...])

    def layer_params(self) -> dict:
        return {k: v[...] for k, v in self.layers.items()}

    def decode_weights(self, fuse: bool = True) -> DecodeWeights:
        """The sampler's copies: per-layer decoder weights and the untied lm head as [V, D]."""
        head_t = None if self.tie_word_embeddings else self.lm_head[...].T
        return DecodeWeights(self.unstacked_layers(fuse), head_t)

    def unstacked_layers(self, fuse: bool = False) -> tuple[dict, ...]:
        """One parameter dict per layer, projections stored [out, in] under `<name>_t`; with
        `fuse`, q/k/v and gate/up as one [sum(out), in] weight each (`FUSED`).

        XLA:CPU and XLA:GPU copy a slice of a stacked weight that feeds a matmul; inside the
        sampler's decode loop that meant reading and writing the decoder weights once more per
        token. The Sampler builds these buffers once (Sampler.weights) and passes them in.
        Fusing suits weights whose output axis is not split over devices (the split of a fused
        output would not line up with the shards).
        """
        stacked = self.layer_params()
        fused_names = {n for names in FUSED for n in names} if fuse else set()
        out = []
        for i in range(self.config.num_hidden_layers):
            layer = {name: p[i] for name, p in stacked.items() if name not in PROJECTIONS}
            layer.update({name + "_t": stacked[name][i].T for name in PROJECTIONS if name not in fused_names})
            if fuse:
                layer.update({fused: jnp.concatenate([stacked[n][i].T for n in names], axis=0)
                              for names, fused in FUSED.items()})
            out.append(layer)
        return tuple(out)

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
                return x + jnp.where(is_visual, deepstack[i].astype(x.dtype)[gather], 0)
            j = jnp.minimum(i, num_ds - 1)
            return x + jnp.where(is_visual & (i < num_ds), deepstack[j].astype(x.dtype)[gather], 0)

        return add

    # -- cached forward (sampler) ---------------------------------------------------------
    def forward_cached(self, input_ids: jax.Array, position_ids: jax.Array, write_index: jax.Array,
                       valid: jax.Array, cache_k: tuple[jax.Array, ...], cache_v: tuple[jax.Array, ...],
                       visual_index: jax.Array | None = None, visual_embeds: jax.Array | None = None,
                       deepstack: jax.Array | None = None, window: int | None = None,
                       layers: tuple[dict, ...] | None = None, score_bytes: int | None = None):
        """Runs a chunk of P tokens per row on top of a KV cache.

        The cache is one array per layer (cache_k: [B, KV, hd, S] each, cache_v:
        [B, KV, S, hd] each), so that a layer's attention reads its own buffer: slicing one
        layer out of a stacked [layers, ...] cache copies it on XLA:CPU/GPU, every decode
        step. All rows write their chunk to the same slots [write_index, write_index + P) with
        one in-place
        `dynamic_update_slice` per layer; `valid` [B, S] marks which slots hold real tokens
        (it must already include this chunk's), so rows of different lengths and turns share
        the cache and padding slots are never attended. Token p attends to valid slots
        <= write_index + p. input_ids [B, P], position_ids [3, B, P]. `window` (static,
        >= write_index + P) limits attention to the first `window` slots: a prefill into an
        empty or short cache then costs O(P * window), not O(P * S). `layers` (from
        `unstacked_layers`) supplies per-layer parameter buffers; by default they are sliced
        from the stacked ones here. The layers are unrolled. `score_bytes` (static): the
        score block budget of a chunked prefill (None or 0: `layers.chunk_score_bytes()`).
        Returns (hidden [B, P, D], cache_k, cache_v).
        """
        t = self.config
        if len(cache_k) != t.num_hidden_layers or len(cache_v) != t.num_hidden_layers:
            raise ValueError(f"forward_cached: {len(cache_k)}/{len(cache_v)} cache layers for a "
                             f"{t.num_hidden_layers}-layer decoder")
        length = input_ids.shape[1]
        x = self.embed(input_ids, visual_index, visual_embeds)
        cos, sin = mrope_tables(position_ids, t, self.dtype)
        capacity = valid.shape[1]
        query_slots = write_index + jnp.arange(length)
        window = capacity if window is None else min(int(window), capacity)
        scores = input_ids.shape[0] * length * t.num_attention_heads * window * 4
        if length >= CHUNK_MIN_QUERIES or scores > CHUNK_SCORE_BYTES:
            mask = CachedMask(valid[:, :window], query_slots, int(score_bytes or L.chunk_score_bytes()))
        else:
            mask = valid[:, None, :window] & (jnp.arange(window)[None, None, :] <= query_slots[None, :, None])
        add_deepstack = self._deepstack_adder(visual_index, deepstack)
        slot = jnp.asarray(write_index, jnp.int32)
        if layers is None:
            layers = self.unstacked_layers()
        out_k, out_v = [], []
        for i, params in enumerate(layers):
            written = {}

            def kv(k_new, v_new, ck=cache_k[i], cv=cache_v[i], written=written):
                # chunk [B, P, KV, hd] -> keys [B, KV, hd, P], values [B, KV, P, hd]
                written["k"] = jax.lax.dynamic_update_slice(
                    ck, k_new.transpose(0, 2, 3, 1).astype(ck.dtype), (0, 0, 0, slot))
                written["v"] = jax.lax.dynamic_update_slice(
                    cv, v_new.transpose(0, 2, 1, 3).astype(cv.dtype), (0, 0, slot, 0))
                keys, values = written["k"][..., :window], written["v"][:, :, :window]
                return keys.astype(k_new.dtype), values.astype(v_new.dtype)

            x, _ = self.layer(x, params, cos, sin, mask, kv, cache_layout=True)
            x = add_deepstack(x, i)
            out_k.append(written["k"])
            out_v.append(written["v"])
        return x, tuple(out_k), tuple(out_v)

    # -- full-sequence forward ------------------------------------------------------------
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, position_ids: jax.Array,
                 visual_index: jax.Array | None = None, visual_embeds: jax.Array | None = None,
                 deepstack: jax.Array | None = None, return_hidden: bool = False) -> jax.Array:
        """input_ids, attention_mask, visual_index [B, L]; position_ids [3, B, L];
        visual_embeds [Nv, D]; deepstack [n_ds, Nv, D]. Returns logits [B, L, vocab] in float32
        (or the final hidden states [B, L, D] before the norm when return_hidden)."""
        t = self.config
        x = self.embed(input_ids, visual_index, visual_embeds)
        cos, sin = mrope_tables(position_ids, t, self.dtype)
        length = input_ids.shape[1]
        causal = jnp.tril(jnp.ones((length, length), bool))
        mask = causal[None] & attention_mask.astype(bool)[:, None, :]
        add_deepstack = self._deepstack_adder(visual_index, deepstack)

        def body(x, params, i):
            x, _ = self.layer(x, params, cos, sin, mask)
            return add_deepstack(x, i)

        x = L.run_layers(body, x, self.layer_params(), t.num_hidden_layers,
                         scan=self.scan, remat=self.remat)
        if return_hidden:
            return x
        return self.logits(x).astype(jnp.float32)
