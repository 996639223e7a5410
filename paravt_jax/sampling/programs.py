"""The sampler's jitted programs (each compiled once per input shape) and the sampling of
one token: vision, prefill and decode over a per-layer KV cache, the cache's allocation,
growth and row copies, per-row random streams. `Sampler` (sampler.py) drives them from the
host; the memory planner (memory.py) compiles them on abstract shapes.

Behaviour log-prob convention (the RL loss uses the same one): the log-probability of each
generated token under softmax(logits / temperature), before any top-k / top-p truncation;
for greedy decoding (temperature 0) under softmax(logits).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from paravt_jax.models.qwen3_vl.model import Qwen3VL
from paravt_jax.models.qwen3_vl.text import SharedPrefix
from paravt_jax.sampling.backend import SamplerBackend, decode_weights
from paravt_jax.sampling.kv_cache import CacheShardings, RowGroup, constrain


# ----------------------------------------------------------------------------- sampling
def sample_logits(logits, keys, temperature, top_p, top_k):
    """logits [B, V] float32, keys [B] PRNG keys -> (tokens [B], log-probs [B]).

    temperature 0 is greedy. top_k <= 0 and top_p >= 1 disable truncation. Log-probs follow
    the module convention (temperature-scaled, untruncated).
    """
    safe_t = jnp.where(temperature > 0, temperature, 1.0)
    scaled = logits / safe_t
    # two plain reductions instead of log_softmax + argmax: no [B, V] output is written, and
    # max/min reductions vectorise where the (value, index) argmax reduction does not
    top = jnp.max(scaled, axis=-1, keepdims=True)
    log_norm = top[:, 0] + jnp.log(jnp.sum(jnp.exp(scaled - top), axis=-1))
    vocab = logits.shape[-1]
    greedy = jnp.min(jnp.where(scaled == top, jnp.arange(vocab, dtype=jnp.int32), vocab), axis=-1)

    def plain(_):
        return jax.vmap(jax.random.categorical)(keys, scaled)

    def truncated(_):
        order = jnp.argsort(-scaled, axis=-1)
        ranked = jnp.take_along_axis(scaled, order, axis=-1)
        probs = jax.nn.softmax(ranked, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs
        rank = jnp.arange(ranked.shape[-1])[None]
        keep = (before < top_p) & ((top_k <= 0) | (rank < top_k))
        keep = keep.at[:, 0].set(True)
        choice = jax.vmap(jax.random.categorical)(keys, jnp.where(keep, ranked, -jnp.inf))
        return jnp.take_along_axis(order, choice[:, None], axis=-1)[:, 0]

    def stochastic(_):
        return jax.lax.cond((top_k > 0) | (top_p < 1.0), truncated, plain, None).astype(jnp.int32)

    token = jax.lax.cond(temperature > 0, stochastic, lambda _: greedy, None)
    return token, jnp.take_along_axis(scaled, token[:, None], axis=-1)[:, 0] - log_norm


# ----------------------------------------------------------------------------- jitted parts
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


@functools.partial(jax.jit, static_argnames="graphdef")
def vision(graphdef, params, pixel_values, meta):
    model = merge(graphdef, params)
    return model.encode_vision(pixel_values, *meta)


@functools.partial(jax.jit, static_argnames=("graphdef", "fuse"))
def decode_weights_program(graphdef, params, fuse):
    return decode_weights(merge(graphdef, params).language, fuse)


def output_axis_whole(model: Qwen3VL) -> bool:
    """Whether no device holds a slice of a projection's output axis (then the sampler may
    fuse q/k/v and gate/up into one matmul each)."""
    for name in ("q_proj", "gate_proj"):
        weight = model.language.layers[name][...]  # [layers, in, out]
        sharding = getattr(weight, "sharding", None)
        if sharding is not None and sharding.shard_shape(weight.shape)[2] != weight.shape[2]:
            return False
    return True


@jax.jit
def row_keys(seed, row_ids):
    """Row b's random stream: fold_in(PRNGKey(seed), row_ids[b])."""
    base = jax.random.PRNGKey(seed)
    return jax.vmap(lambda r: jax.random.fold_in(base, r))(row_ids)


@functools.partial(jax.jit, static_argnames=("layers", "shape", "dtype", "sharding"))
def new_cache(layers, shape, dtype, sharding):
    """shape = (B, KV, S, hd) of one value array; keys are stored [B, KV, hd, S]."""
    rows, kv, capacity, head_dim = shape
    keys = tuple(jnp.zeros((rows, kv, head_dim, capacity), dtype) for _ in range(layers))
    values = tuple(jnp.zeros(shape, dtype) for _ in range(layers))
    return (*constrain(keys, values, sharding), jnp.zeros((rows, capacity), bool))


@functools.partial(jax.jit, static_argnames=("graphdef", "sharding", "window", "backend", "block", "shards"),
                   donate_argnames=("cache_k", "cache_v", "valid"))
def prefill(graphdef, params, weights, cache_k, cache_v, valid, prefix, write_index, row_start, ids, positions,
             counts, visual_index, visual_embeds, deepstack, sharding, window, backend: SamplerBackend, block,
             shards=1):
    """One row group: the chunk ids [g, W] of the cache rows RowGroup(row_start, g / shards,
    shards).order(B) (rows [row_start, row_start + g / shards) of each device's block of rows)
    written into their cache rows at `write_index`, in place (the caches are donated); with `prefix`
    (SharedPrefix, None for a prompt prefill) the rows also attend to their prompts'
    prefixes. Returns (logits [g, V] of each row's last chunk token, caches, valid)."""
    lang = merge(graphdef, params).language
    group, width = ids.shape
    rows = None if group == valid.shape[0] else RowGroup(row_start, group // shards, shards)
    rows_valid = valid if rows is None else rows.read(valid)
    if prefix is not None and rows is not None:
        per_prompt = valid.shape[0] // prefix.valid.shape[0]
        prompts = RowGroup(row_start // per_prompt, max(rows.local // per_prompt, 1), shards)
        prefix = SharedPrefix(tuple(map(prompts.read, prefix.keys)), tuple(map(prompts.read, prefix.values)),
                              prompts.read(prefix.valid))
    fresh = jnp.arange(width)[None, :] < counts[:, None]
    rows_valid = jax.lax.dynamic_update_slice(rows_valid, fresh, (0, write_index))
    hidden, cache_k, cache_v = lang.forward_cached(ids, positions, write_index, rows_valid, cache_k, cache_v,
                                                   visual_index, visual_embeds, deepstack,
                                                   window=window, layers=weights.layers,
                                                   project=backend.project, block=block, prefix=prefix, rows=rows)
    last = jnp.maximum(counts - 1, 0)
    last_hidden = hidden[jnp.arange(group), last][:, None]
    logits = backend.logits(lang, last_hidden, weights)[:, 0].astype(jnp.float32)
    valid = rows_valid if rows is None else rows.write(valid, rows_valid)
    return (logits, *constrain(cache_k, cache_v, sharding), valid)


@functools.partial(jax.jit, static_argnames="sharding")
def copy_rows(cache_k, cache_v, valid, index, sharding):
    """The copied layout: prompt cache rows gathered to one copy per sample."""
    keys = tuple(layer[index] for layer in cache_k)
    values = tuple(layer[index] for layer in cache_v)
    return (*constrain(keys, values, sharding), valid[index])


@functools.partial(jax.jit, static_argnames=("axis", "extra", "sharding"))
def grow_layer(layer, axis, extra, sharding):
    """One cache array with `extra` more slots along `axis` (zeros; the slots are not valid)."""
    pad = [(0, 0)] * layer.ndim
    pad[axis] = (0, extra)
    grown = jnp.pad(layer, pad)
    return grown if sharding is None else jax.lax.with_sharding_constraint(grown, sharding)


def grow_suffix(cache_k, cache_v, valid, extra: int, shardings: CacheShardings | None):
    """The suffix caches with `extra` more slots, copied one layer at a time, each old layer
    deleted once copied: the transient is one layer's old buffer, never a second copy of the
    whole cache; the shared prefix is never copied. Consumes the arrays passed in."""
    def grow(layers, axis, sharding):
        out = []
        for layer in layers:
            out.append(grow_layer(layer, axis, extra, sharding))
            layer.delete()
        return tuple(out)

    keys = grow(cache_k, 3, shardings and shardings.keys)
    values = grow(cache_v, 2, shardings and shardings.values)
    return keys, values, grow_layer(valid, 1, extra, None)


@dataclasses.dataclass(frozen=True)
class DecodeCarry:
    """Decode progress that survives between the segments of one decode (see Sampler._decode)."""
    step: jax.Array  # [] tokens emitted so far per row slot (0 = the prefill logits not used yet)
    tokens: jax.Array  # [B, max_steps] int32, -1 where nothing was emitted
    logps: jax.Array  # [B, max_steps] float32
    n_gen: jax.Array  # [B]
    done: jax.Array  # [B] stop id hit or budget used up
    finished: jax.Array  # [B] stop id hit
    write_index: jax.Array  # [] next free cache slot
    next_position: jax.Array  # [B]

    @staticmethod
    def start(budgets: np.ndarray, max_steps: int, write_index: int, next_position: np.ndarray):
        rows = budgets.shape[0]
        return DecodeCarry(np.int32(0), np.full((rows, max_steps), -1, np.int32),
                            np.zeros((rows, max_steps), np.float32), np.zeros(rows, np.int32),
                            budgets <= 0, np.zeros(rows, bool), np.int32(write_index),
                            next_position.astype(np.int32))


jax.tree_util.register_dataclass(DecodeCarry, data_fields=[f.name for f in dataclasses.fields(DecodeCarry)],
                                 meta_fields=[])


@functools.partial(jax.jit, static_argnames=("graphdef", "sharding", "backend"),
                   donate_argnames=("cache_k", "cache_v", "valid"))
def decode(graphdef, params, weights, cache_k, cache_v, valid, prefix, logits, budgets, stop_ids, row_keys,
            temperature, top_p, top_k, carry: DecodeCarry, max_steps, sharding, backend: SamplerBackend):
    """Samples until every row is done, `max_steps` tokens were emitted, or the suffix cache is
    full (the caller grows it and calls again with the returned carry); every step attends to
    the row's prompt in `prefix` and to its own suffix. The first call (step 0)
    samples from the prefill's `logits`; see the module docstring for the log-prob convention."""
    lang = merge(graphdef, params).language
    capacity = valid.shape[1]

    def keys_at(step):
        return jax.vmap(lambda k: jax.random.fold_in(k, step))(row_keys)

    def emit(c: DecodeCarry, logits, active) -> DecodeCarry:
        token, logp = sample_logits(logits, keys_at(c.step), temperature, top_p, top_k)
        n_gen = c.n_gen + active
        hit = active & jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
        return dataclasses.replace(
            c, step=c.step + 1, tokens=c.tokens.at[:, c.step].set(jnp.where(active, token, -1)),
            logps=c.logps.at[:, c.step].set(jnp.where(active, logp, 0.0)), n_gen=n_gen,
            done=c.done | hit | (n_gen >= budgets), finished=c.finished | hit)

    carry = jax.lax.cond(carry.step == 0, lambda c: emit(c, logits, budgets > 0), lambda c: c, carry)

    def cond(loop):
        c = loop[0]
        return (c.step < max_steps) & ~jnp.all(c.done) & (c.write_index < capacity)

    def body(loop):
        c, ck, cv, valid = loop
        active = ~c.done
        fed = jnp.maximum(c.tokens[:, c.step - 1], 0)[:, None]
        positions = jnp.broadcast_to(c.next_position[None, :, None], (3, fed.shape[0], 1))
        valid = jax.lax.dynamic_update_slice(valid, active[:, None], (0, c.write_index))
        hidden, ck, cv = lang.forward_cached(fed, positions, c.write_index, valid, ck, cv,
                                             layers=weights.layers, project=backend.project, prefix=prefix)
        new_logits = backend.logits(lang, hidden, weights)[:, 0].astype(jnp.float32)
        c = dataclasses.replace(c, write_index=c.write_index + 1, next_position=c.next_position + active)
        return (emit(c, new_logits, active), *constrain(ck, cv, sharding), valid)

    carry, cache_k, cache_v, valid = jax.lax.while_loop(cond, body, (carry, cache_k, cache_v, valid))
    return carry, cache_k, cache_v, valid




@jax.jit
def pick_rows(take, new, old):
    """Rows of `new` where `take` [B] is set, else of `old` ([B, V] logits)."""
    return jnp.where(take[:, None], new, old)
