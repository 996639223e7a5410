"""The sampler's decode loop (one jitted program) and the sampling of one token.

Behaviour log-prob convention (the RL loss uses the same one): the log-probability of each
generated token under softmax(logits / temperature), before any top-k / top-p truncation;
for greedy decoding (temperature 0) under softmax(logits).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from paravt_jax.models.qwen3_vl.text import CacheView, KVCache
from paravt_jax.sampling.backend import SamplerBackend
from paravt_jax.sampling.kv_cache import CacheShardings, constrain
from paravt_jax.sampling.pages import PagedPlan, PagedView, advance, paginate
from paravt_jax.sampling.params import MAX_STOP_IDS, SamplingParams
from paravt_jax.sampling.programs import merge


def sample_logits(logits, keys, temperature, top_p, top_k, truncation: bool = True):
    """logits [B, V] float32, keys [B] PRNG keys -> (tokens [B], log-probs [B]).

    temperature 0 is greedy. top_k <= 0 and top_p >= 1 disable truncation. Log-probs follow
    the module convention (temperature-scaled, untruncated). `truncation` (static) False leaves
    the top-p / top-k branch (a sort of every row's logits) out of the program: for calls that
    never truncate, where it would not run; the tokens are the same.
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
        if not truncation:
            return plain(None).astype(jnp.int32)
        return jax.lax.cond((top_k > 0) | (top_p < 1.0), truncated, plain, None).astype(jnp.int32)

    token = jax.lax.cond(temperature > 0, stochastic, lambda _: greedy, None)
    return token, jnp.take_along_axis(scaled, token[:, None], axis=-1)[:, 0] - log_norm


@jax.jit
def row_keys(seed, row_ids):
    """Row b's random stream: fold_in(PRNGKey(seed), row_ids[b]); `seed` one for every row or
    [B], each row's own (a refilled decode whose rows are at different turns)."""
    seeds = jnp.broadcast_to(jnp.asarray(seed, jnp.uint32), jnp.shape(row_ids))
    return jax.vmap(lambda s, r: jax.random.fold_in(jax.random.PRNGKey(s), r))(seeds, row_ids)


class DecodeInputs(NamedTuple):
    """What stays fixed over the segments of one decode (traced: other values reuse the program)."""
    logits: jax.Array  # [B, V] float32: the prefill's, sampled from at step 0
    budgets: jax.Array  # [B] int32 tokens each row may emit (0: the row sits the turn out)
    row_keys: jax.Array  # [B, 2] each row's random stream (row_keys)
    stop_ids: jax.Array  # [MAX_STOP_IDS] int32, -2 in unused slots
    temperature: jax.Array  # [] float32
    top_p: jax.Array  # [] float32
    top_k: jax.Array  # [] int32
    max_steps: jax.Array  # [] int32: tokens emitted at most (the carry's token columns)
    # a refilled decode (DecodePlan.refill): the loop also stops once this many rows are done
    # (the host then refills them); None otherwise
    stop_when_done: jax.Array | None = None
    # [B] bool: the rows that read their prompt's prefix (None: all; CacheView.prefix_rows)
    prefix_rows: jax.Array | None = None

    @staticmethod
    def of(logits, budgets: np.ndarray, keys, sampling: SamplingParams, max_steps: int,
           stop_when_done: int | None = None, prefix_rows: np.ndarray | None = None) -> DecodeInputs:
        stop = np.full(MAX_STOP_IDS, -2, np.int32)
        stop[:len(sampling.stop_ids)] = sampling.stop_ids
        return DecodeInputs(logits, budgets, keys, stop, np.float32(sampling.temperature),
                            np.float32(sampling.top_p), np.int32(sampling.top_k), max_steps,
                            None if stop_when_done is None else np.int32(stop_when_done),
                            None if prefix_rows is None else np.asarray(prefix_rows, bool))


@dataclasses.dataclass(frozen=True)
class DecodeCarry:
    """Decode progress that survives between the segments of one decode (see Sampler._decode)."""
    step: jax.Array  # [] loop steps so far (0 = the prefill logits not used yet)
    tokens: jax.Array  # [B, max_steps] int32, -1 where nothing was emitted
    logps: jax.Array  # [B, max_steps] float32
    n_gen: jax.Array  # [B]
    done: jax.Array  # [B] stop id hit or budget used up
    finished: jax.Array  # [B] stop id hit
    write_index: jax.Array  # [] next free cache slot ([B]: each row's, a refilled decode)
    next_position: jax.Array  # [B]

    @staticmethod
    def start(budgets: np.ndarray, max_steps: int, write_index, next_position: np.ndarray):
        rows = budgets.shape[0]
        return DecodeCarry(np.int32(0), np.full((rows, max_steps), -1, np.int32),
                            np.zeros((rows, max_steps), np.float32), np.zeros(rows, np.int32),
                            budgets <= 0, np.zeros(rows, bool), np.asarray(write_index, np.int32),
                            next_position.astype(np.int32))

    def restart(self, rows: np.ndarray, next_position: np.ndarray, write_index=0) -> DecodeCarry:
        """This carry (on the host) with `rows` begun afresh (a refilled decode): no token yet,
        not done, the next token at `next_position` (one per row of `rows`), writing from
        `write_index` of their suffix (0: a new prompt each; a row's next turn: past its tool
        responses)."""
        arrays = {f.name: np.array(getattr(self, f.name)) for f in dataclasses.fields(self)}
        arrays["tokens"][rows], arrays["logps"][rows] = -1, 0.0
        arrays["n_gen"][rows] = 0
        arrays["write_index"][rows] = write_index
        arrays["done"][rows] = arrays["finished"][rows] = False
        arrays["next_position"][rows] = next_position
        return DecodeCarry(**arrays)


jax.tree_util.register_dataclass(DecodeCarry, data_fields=[f.name for f in dataclasses.fields(DecodeCarry)],
                                 meta_fields=[])


DECODE_WINDOWS = ("used", "capacity")
DECODE_CACHES = ("contiguous", "paged")


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """The static arguments of a decode: one compiled program per plan (and input shapes).
    window: what a step attends (SamplerConfig.decode_window): "used" = each row, while it
    samples, its prompt and its own cache up to the last filled block of the rows still
    sampling (finished rows attend to nothing), blockwise in blocks of backend.decode_block;
    "capacity" = every row every slot of the cache (dense when the scores are small).
    paged (SamplerConfig.decode_cache="paged"): each call copies the prompt and suffix caches
    into pages (sampling/pages.py: the prompt's full pages shared by its rows) and every step
    writes its keys and values there too and reads only the pages, each row up to its length.
    truncation: whether the program holds the top-p / top-k branch (`SamplingParams.truncates`:
    a call that never truncates compiles without it, one program for every such call).
    refill: see the field."""
    sharding: CacheShardings | None  # of the suffix cache's layers (None without a mesh)
    backend: SamplerBackend
    window: str = "used"
    paged: PagedPlan | None = None
    truncation: bool = True
    # a refilled decode: each row writes its own suffix slots (carry.write_index [B]) and token
    # columns (at its n_gen) and draws its k-th token from fold_in(row key, k), so a row can
    # restart with a new prompt mid-call (Sampler.sample_queued); the loop also stops once
    # inputs.stop_when_done rows are done
    refill: bool = False


@functools.partial(jax.jit, static_argnames=("graphdef", "plan"), donate_argnames="cache")
def decode(graphdef, params, weights, cache: KVCache, prefix: KVCache, inputs: DecodeInputs, carry: DecodeCarry,
           plan: DecodePlan) -> tuple[DecodeCarry, KVCache]:
    """Samples until every row is done, `inputs.max_steps` tokens were emitted, or the suffix
    `cache` is full (the caller grows it and calls again with the returned carry); every step
    attends to the row's prompt in `prefix` and to its own suffix. The first call (step 0)
    samples from the prefill's logits; see the module docstring for the log-prob convention.
    A refilled decode (plan.refill) samples each row's first token from the logits whenever the
    row starts (n_gen 0, not done) and also stops once inputs.stop_when_done rows are done."""
    lang = merge(graphdef, params).language
    capacity = cache.capacity
    backend, budgets = plan.backend, inputs.budgets
    rows = jnp.arange(budgets.shape[0])

    def keys_at(c: DecodeCarry):  # a refilled row's k-th token: fold_in(its key, k), wherever it started
        if plan.refill:
            return jax.vmap(jax.random.fold_in)(inputs.row_keys, c.n_gen)
        return jax.vmap(lambda k: jax.random.fold_in(k, c.step))(inputs.row_keys)

    def emit(c: DecodeCarry, logits, active) -> DecodeCarry:
        token, logp = sample_logits(logits, keys_at(c), inputs.temperature, inputs.top_p, inputs.top_k,
                                    plan.truncation)
        n_gen = c.n_gen + active
        hit = active & jnp.any(token[:, None] == inputs.stop_ids[None, :], axis=-1)
        if plan.refill:  # each active row's token at its own column, the others' columns untouched
            column = jnp.where(active, c.n_gen, c.tokens.shape[1])
            tokens = c.tokens.at[rows, column].set(token, mode="drop")
            logps = c.logps.at[rows, column].set(logp, mode="drop")
        else:
            tokens = c.tokens.at[:, c.step].set(jnp.where(active, token, -1))
            logps = c.logps.at[:, c.step].set(jnp.where(active, logp, 0.0))
        return dataclasses.replace(c, step=c.step + 1, tokens=tokens, logps=logps, n_gen=n_gen,
                                   done=c.done | hit | (n_gen >= budgets), finished=c.finished | hit)

    if plan.refill:  # rows (re)started since the last call sample their first token from the prefill's logits
        fresh = (carry.n_gen == 0) & ~carry.done
        carry = jax.lax.cond(jnp.any(fresh), lambda c: emit(c, inputs.logits, fresh), lambda c: c, carry)
    else:
        carry = jax.lax.cond(carry.step == 0, lambda c: emit(c, inputs.logits, budgets > 0), lambda c: c, carry)
    if plan.paged is not None and inputs.prefix_rows is not None:
        raise ValueError("decode: prefix_rows needs the contiguous decode (the paged one reads every row's prompt)")
    pools, table = (), None
    if plan.paged is not None:  # the caches as they stand, in pages (one copy per call, not per step)
        pools, table = paginate(prefix.valid, cache.valid, plan.paged.page,
                                list(zip(prefix.keys, prefix.values, cache.keys, cache.values)))

    def cond(loop):
        c = loop[0]
        if plan.refill:  # every row within its budget's columns and slots; stop for the host to refill
            room = jnp.all(c.done | (c.write_index < capacity))
            return ~jnp.all(c.done) & room & (jnp.sum(c.done) < inputs.stop_when_done)
        return (c.step < inputs.max_steps) & ~jnp.all(c.done) & (c.write_index < capacity)

    def body(loop):
        c, cache, pools, table = loop
        active = ~c.done
        last = c.tokens[rows, jnp.maximum(c.n_gen - 1, 0)] if plan.refill else c.tokens[:, c.step - 1]
        fed = jnp.maximum(last, 0)[:, None]
        positions = jnp.broadcast_to(c.next_position[None, :, None], (3, fed.shape[0], 1))
        write = c.write_index
        if plan.refill:  # a row that is done writes nothing (its slot past the capacity: dropped)
            write = jnp.where(active, c.write_index, capacity)
            valid = cache.valid.at[rows, write].set(True, mode="drop")
        else:
            valid = jax.lax.dynamic_update_slice(cache.valid, active[:, None], (0, c.write_index))
        view = CacheView(KVCache(cache.keys, cache.values, valid), write, prefix=prefix,
                         active=active if plan.window == "used" else None,
                         paged=None if plan.paged is None else PagedView(pools, table, active, plan.paged),
                         prefix_rows=inputs.prefix_rows)
        block = backend.decode_block if plan.window == "used" else None
        hidden, cache, *written = lang.forward_cached(fed, positions, view, layers=weights.layers,
                                                      project=backend.project, block=block)
        if plan.paged is not None:
            pools, table = written[0], advance(table, active)
        new_logits = backend.logits(lang, hidden, weights)[:, 0].astype(jnp.float32)
        c = dataclasses.replace(c, write_index=c.write_index + (active if plan.refill else 1),
                                next_position=c.next_position + active)
        return emit(c, new_logits, active), constrain(cache, plan.sharding), pools, table

    carry, cache, _, _ = jax.lax.while_loop(cond, body, (carry, cache, pools, table))
    return carry, cache
