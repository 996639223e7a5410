"""The sampler's smaller jitted programs (each compiled once per input shape): the vision
tower, the decode-weight copies, the cache's allocation, growth and row copies. The prefill
and the decode loop have their own modules (prefill.py, decode.py); `Sampler` (sampler.py)
drives them from the host; the memory planner (planner/memory.py) compiles them on abstract
shapes."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.models.qwen3_vl.text import KVCache
from paravt_jax.sampling.backend import DecodeWeights, WeightLayout, head_copy, layer_copy
from paravt_jax.sampling.kv_cache import CacheShardings, constrain, replicated


class HashOnce:
    """A static jit argument (the model's GraphDef) whose hash is computed once: hashing a
    GraphDef walks the whole module tree, which cost ~1 ms per sampler call."""

    def __init__(self, value):
        self.value, self._hash = value, hash(value)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, HashOnce) and (self.value is other.value or self.value == other.value)


def merge(graphdef: HashOnce, params):
    return nnx.merge(graphdef.value, params)


@functools.partial(jax.jit, static_argnames=("graphdef", "mesh", "feature_rows"))
def vision(graphdef, params, pixel_values, meta, mesh=None, feature_rows: int = 0):
    """The vision tower over one row group's frames: pixel_values [N, patch_dim] (one pass) or
    [S, N, patch_dim] (one pass per shard of rows, Sampler.vision_inputs); with `mesh` the
    features [S, Nv, D] and DeepStack [n_ds, S, Nv, D] stay split by shard over its batch axes.
    `feature_rows` > Nv (one pass only): the features padded with zero rows to that many (a pass
    over fewer blank frames gives the features the shape of the call's fixed frame count)."""
    embeds, deepstack = merge(graphdef, params).encode_vision(pixel_values, *meta)
    if feature_rows > embeds.shape[0]:
        extra = feature_rows - embeds.shape[0]
        embeds = jnp.pad(embeds, ((0, extra), (0, 0)))
        deepstack = jnp.pad(deepstack, ((0, 0), (0, extra), (0, 0)))
    if mesh is not None:
        embeds, deepstack = sh.row_constraint(mesh)(embeds), sh.row_constraint(mesh, batch_axis=1)(deepstack)
    return embeds, deepstack


@functools.partial(jax.jit, static_argnames=("graphdef", "layout", "with_head"))
def layer_copy_program(graphdef, params, index, layout: WeightLayout, with_head: bool = False):
    """Layer `index`'s decode copies (backend.layer_copy), and with `with_head` the lm head's
    (backend.head_copy): (the layer's dict, the head or None). One program for every layer: the
    index is traced."""
    lang = merge(graphdef, params).language
    own = {name: jax.lax.dynamic_index_in_dim(p, index, keepdims=False) for name, p in lang.layer_params().items()}
    return layer_copy(own, layout), head_copy(lang, layout) if with_head else None


def decode_weights(graphdef, params, layout: WeightLayout, layers: int) -> DecodeWeights:
    """Sampler.weights: the decoder's per-layer copies and the lm head's, one layer a call of
    `layer_copy_program` (the head with the first), so that a layer's resharding temporaries
    (a split MLP's: every layer's at once in one program, 9.95 GiB a device for the 32B on
    gpu16_tp2 by XLA:GPU) are freed before the next layer's."""
    first, head = layer_copy_program(graphdef, params, np.int32(0), layout, with_head=True)
    rest = [layer_copy_program(graphdef, params, np.int32(i), layout)[0] for i in range(1, layers)]
    return DecodeWeights((first, *rest), head, layout.mesh if layout.head_axes else None)


def weight_layout(state, config: Qwen3VLConfig, split: bool = True) -> WeightLayout:
    """The sampler's WeightLayout for a model's parameter `state` (an nnx State of arrays, or of
    ShapeDtypeStructs with shardings: the planner's) of model config `config`: fused where no
    device holds a slice of q_proj's output axis; with `split`, the MLP split over every mesh axis
    that shards the stacked gate_proj [layers, in, out] (when the intermediate size divides over
    them) and an untied lm head over every axis that shards it (when the vocabulary does)."""
    flat = {path: v.get_value() for path, v in nnx.to_flat_state(state) if path[0] == "language"}
    q_proj, gate = flat[("language", "layers", "q_proj")], flat[("language", "layers", "gate_proj")]
    sharding = getattr(q_proj, "sharding", None)
    fuse = sharding is None or sharding.shard_shape(q_proj.shape)[2] == q_proj.shape[2]
    if not split or not hasattr(getattr(gate, "sharding", None), "spec"):  # a NamedSharding alone
        return WeightLayout(fuse=fuse)

    def axes_of(array, size: int) -> tuple[str, ...]:
        mesh = array.sharding.mesh
        used = {a for part in array.sharding.spec if part for a in ((part,) if isinstance(part, str) else part)}
        axes = tuple(a for a in mesh.axis_names if a in used and mesh.shape[a] > 1)
        return axes if axes and size % int(np.prod([mesh.shape[a] for a in axes])) == 0 else ()

    head = None if config.tie_word_embeddings else flat[("language", "lm_head")]
    return WeightLayout(fuse=fuse, mesh=gate.sharding.mesh, axes=axes_of(gate, config.text.intermediate_size),
                        head_axes=() if head is None else axes_of(head, config.text.vocab_size))


@functools.partial(jax.jit, static_argnames=("layers", "shape", "dtype", "sharding"))
def new_cache(layers, shape, dtype, sharding):
    """shape = (B, KV, S, hd) of one value array; keys are stored [B, KV, hd, S]."""
    rows, kv, capacity, head_dim = shape
    keys = tuple(jnp.zeros((rows, kv, head_dim, capacity), dtype) for _ in range(layers))
    values = tuple(jnp.zeros(shape, dtype) for _ in range(layers))
    return constrain(KVCache(keys, values, jnp.zeros((rows, capacity), bool)), sharding)


@functools.partial(jax.jit, static_argnames="sharding")
def copy_rows(cache: KVCache, index, sharding) -> KVCache:
    """The copied layout: prompt cache rows gathered to one copy per sample."""
    return constrain(jax.tree.map(lambda array: array[index], cache), sharding)


@functools.partial(jax.jit, static_argnames=("axis", "extra", "sharding"))
def grow_layer(layer, axis, extra, sharding):
    """One cache array with `extra` more slots along `axis` (zeros; the slots are not valid)."""
    pad = [(0, 0)] * layer.ndim
    pad[axis] = (0, extra)
    grown = jnp.pad(layer, pad)
    return grown if sharding is None else jax.lax.with_sharding_constraint(grown, sharding)


def grow_suffix(cache: KVCache, extra: int, shardings: CacheShardings | None) -> KVCache:
    """The suffix caches with `extra` more slots, copied one layer at a time, each old layer
    deleted once copied: the transient is one layer's old buffer, never a second copy of the
    whole cache; the shared prefix is never copied. Consumes the arrays passed in."""
    def grow(layers, axis, sharding):
        out = []
        for layer in layers:
            out.append(grow_layer(layer, axis, extra, sharding))
            layer.delete()
        return tuple(out)

    keys = grow(cache.keys, 3, shardings and shardings.keys)
    values = grow(cache.values, 2, shardings and shardings.values)
    return KVCache(keys, values, grow_layer(cache.valid, 1, extra, None))


@jax.jit
def pick_rows(take, new, old):
    """Rows of `new` where `take` [B] is set, else of `old` ([B, V] logits)."""
    return jnp.where(take[:, None], new, old)


@functools.partial(jax.jit, static_argnames=("prefix_sharding", "suffix_sharding"),
                   donate_argnames=("prefix", "suffix", "logits"))
def admit_rows(prefix: KVCache, suffix: KVCache, logits, fresh: KVCache, fresh_logits, rows,
               prefix_sharding, suffix_sharding) -> tuple[KVCache, KVCache, jax.Array]:
    """A refilled decode's new prompts moved into their rows (Sampler.sample_queued): row i of
    `fresh` (a prompt cache as wide as `prefix`) and of `fresh_logits` goes to row rows[i] of
    `prefix` and `logits` (rows[i] past the end: dropped), and those rows' suffix slots are
    emptied. In place (the caches and logits are donated)."""
    def put(old, new):
        return old.at[rows].set(new, mode="drop")

    prefix = constrain(jax.tree.map(put, prefix, fresh), prefix_sharding)
    suffix = constrain(KVCache(suffix.keys, suffix.values, suffix.valid.at[rows].set(False, mode="drop")),
                       suffix_sharding)
    return prefix, suffix, put(logits, fresh_logits)


@functools.partial(jax.jit, static_argnames="sharding", donate_argnames="cache")
def forget_rows(cache: KVCache, rows, sharding) -> KVCache:
    """`cache` with every slot of the rows set in `rows` [B] bool emptied (a refilled decode's
    row that takes other work: Sampler.admit_turns). In place (the cache is donated)."""
    valid = jnp.where(rows[:, None], False, cache.valid)
    return constrain(KVCache(cache.keys, cache.values, valid), sharding)


def mesh_sharding(array) -> jax.sharding.NamedSharding | None:
    """`replicated` over the array's mesh, None for an array of no mesh (one device, uncommitted)."""
    return replicated(array.sharding.mesh) if isinstance(array.sharding, jax.sharding.NamedSharding) else None


def zero_rows(out, count: int):
    """[count, V] zeros placed as put_rows' outputs are (`mesh_sharding(out)`: a row-index
    prefill's logits, prefill.py, are), so that put_rows runs one program for every call."""
    zeros = np.zeros((count, *out.shape[1:]), out.dtype)
    sharding = mesh_sharding(out)
    return jnp.asarray(zeros) if sharding is None else jax.device_put(zeros, sharding)


@functools.partial(jax.jit, donate_argnames="logits", static_argnames="sharding")
def put_rows(logits, out, rows, sharding):
    """`logits` [B, V] with row rows[i] set to out[i] (rows[i] = B: dropped), placed as
    `sharding` (`mesh_sharding(out)`; None: as XLA places it). In place."""
    logits = logits.at[rows].set(out, mode="drop")
    return logits if sharding is None else jax.lax.with_sharding_constraint(logits, sharding)


@functools.partial(jax.jit, static_argnames=("extra", "sharding"))
def pad_rows(cache: KVCache, logits, extra: int, sharding) -> tuple[KVCache, jax.Array]:
    """A prompt cache and its logits with `extra` rows more, empty (no valid slot): the prompts
    of a refilled decode's spare rows (Sampler.start_turns)."""
    def pad(a):
        return jnp.pad(a, [(0, extra)] + [(0, 0)] * (a.ndim - 1))

    cache = KVCache(tuple(map(pad, cache.keys)), tuple(map(pad, cache.values)), pad(cache.valid))
    return constrain(cache, sharding), pad(logits)
