"""A jitted KV-cache sampler for multimodal, multi-turn, batched rollouts.

Three jit boundaries, each compiled once per bucket and then reused:
  vision   — every image/video item of the call's new chunks in one pass (once per prompt,
             however many samples share it);
  prefill  — a right-padded chunk per row written into the cache at each row's own offset;
  decode   — one `lax.while_loop` that samples, feeds the token back and stops when every
             row hit a stop id or its budget.
Shapes are bucketed (chunk length, batch, cache capacity, decode steps) so that a steady run
over varied prompts and turns compiles nothing new; caches are donated between calls.

Behaviour log-prob convention (the RL loss uses the same one): the log-probability of each
generated token under softmax(logits / temperature), before any top-k / top-p truncation;
for greedy decoding (temperature 0) under softmax(logits).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from paravt_jax.config import set_by
from paravt_jax.models.qwen3_vl.model import Qwen3VL
from paravt_jax.models.qwen3_vl.text import SharedPrefix
from paravt_jax.models.qwen3_vl.vision import pad_frames_to_buckets, vision_layout
from paravt_jax.sampling.backend import DecodeWeights, SamplerBackend, backend_policy, decode_weights
from paravt_jax.sampling.kv_cache import (
    CacheShardings,
    CacheSpec,
    RowGroup,
    bucket,
    cache_sharding,
    constrain,
    episode_capacity,
    first_capacity,
    grown_capacity,
    row_shards,
)
from paravt_jax.text.inputs import ModelInputs, collate_vision, encode_ids

MAX_STOP_IDS = 8
PREFILL_WINDOWS = ("used", "capacity")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    # Defaults of the per-call knobs; rollouts and evaluation pass their own on every call.
    max_new_tokens: int = set_by(256, "each generate() call (rollout / eval settings)")
    temperature: float = set_by(0.0, "each generate() call (rollout / eval settings)")
    top_p: float = set_by(1.0, "each generate() call (rollout / eval settings)")
    top_k: int = set_by(0, "each generate() call (rollout / eval settings)")  # 0 = no top-k
    stop_ids: tuple[int, ...] = set_by((), "each generate() call (the tokenizer's stop tokens)")
    min_chunk_bucket: int = 16
    min_batch_bucket: int = 1
    cache_multiple: int = 1024  # capacities: powers of two up to this, then multiples of it
    cache_dtype: str = ""  # "" = the model's compute dtype
    # float32 score block budget of a blockwise prefill; 0 = the backend's default
    # (sampling/backend.py: 8 MB on CPU, 256 MB on accelerators)
    attention_block_bytes: int = 0
    # Row groups: a prefill runs at most this many chunk tokens (rows x chunk width) per call,
    # each group writing its own rows of the cache; 0 = the backend's default (backend.py)
    prefill_tokens: int = 0
    # True: the samples of a prompt share one copy of its keys and values; False: every sample
    # holds its own copy (the copied layout, kept as the measured baseline of bench/sampler.py)
    shared_prefix: bool = True
    # What a prefill attends: "used" = the cache slots in use, bucketed (one compiled program
    # per bucket the write pointer reaches); "capacity" = every slot of the cache (one program
    # per chunk width: the steady shapes of an RL run, at the cost of attending empty slots)
    prefill_window: str = set_by("used", "rl.shapes for RL rollouts; the caller")
    # > 0: an extend whose chunks hold no image writes them in pieces of this many tokens,
    # one prefill call each (one compiled program, however long the turn's tool responses);
    # 0: one call at the chunks' power-of-two bucket
    extend_width: int = set_by(0, "rl.shapes for RL rollouts; the caller")


@dataclasses.dataclass(frozen=True)
class PromptShape:
    """Fixed sizes of a generate() call's prompt prefill, so that calls over other prompts run
    the programs compiled for earlier ones: at least `rows` prompt rows (padding rows when
    fewer), at least `width` tokens, and a vision pass padded to `frames_per_row` frames per
    prompt row (per frame size). Zeros: each call's own power-of-two buckets."""
    rows: int = 0
    width: int = 0
    frames_per_row: int = 0

    def __post_init__(self):
        if min(self.rows, self.width, self.frames_per_row) < 0:
            raise ValueError(f"PromptShape sizes must be >= 0, got {self}")


@dataclasses.dataclass(frozen=True)
class SampleOutput:
    tokens: list[list[int]]  # per row, the stop token included when hit
    logprobs: list[np.ndarray]  # per row, float32, same length as tokens
    finished: np.ndarray  # [B] bool: hit a stop id
    lengths: np.ndarray  # [B] generated tokens


@dataclasses.dataclass(frozen=True)
class SamplerState:
    """Where each row's episode stands. Rows are prompt-major (row p * F + f, F = rows per
    prompt: the samples with a shared prefix, 1 in the copied layout). `prefix` holds each
    prompt's keys and values once (keys [P, KV heads, head_dim, Sp], values
    [P, KV heads, Sp, head_dim], valid [P, Sp]); the per-row suffix caches hold everything
    after the prompt: one array per layer, keys [B, KV heads, head_dim, S], values
    [B, KV heads, S, head_dim]. All rows share the suffix write pointer `write_index`;
    `valid` [B, S] marks the suffix slots that hold each row's real tokens. `pending` is the
    last sampled token, not yet in the cache (-1 when none); the next chunk of row b must be
    encoded with start_position = chunk_start[b]."""
    prefix: SharedPrefix
    cache_k: tuple[jax.Array, ...]
    cache_v: tuple[jax.Array, ...]
    valid: jax.Array  # [B, S] bool
    write_index: int
    next_position: np.ndarray  # [B] position of the pending token (or of the next token)
    pending: np.ndarray  # [B]
    num_rows: int

    @property
    def capacity(self) -> int:
        """Slots a row attends: its prompt's prefix plus its suffix."""
        return self.prefix.valid.shape[1] + self.valid.shape[1]

    @property
    def chunk_start(self) -> np.ndarray:
        return self.next_position + (self.pending >= 0)

    def cached_tokens(self) -> np.ndarray:
        """[B] tokens in each row's cache (its prompt's prefix + its own suffix)."""
        per_prompt = np.asarray(self.prefix.valid).sum(1)
        rows = self.valid.shape[0]
        return per_prompt.repeat(rows // per_prompt.shape[0]) + np.asarray(self.valid).sum(1)


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
class _HashOnce:
    """A static jit argument (the model's GraphDef) whose hash is computed once: hashing a
    GraphDef walks the whole module tree, which cost ~1 ms per sampler call."""

    def __init__(self, value):
        self.value, self._hash = value, hash(value)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, _HashOnce) and (self.value is other.value or self.value == other.value)


def _merge(graphdef: _HashOnce, params):
    return nnx.merge(graphdef.value, params)


@functools.partial(jax.jit, static_argnames="graphdef")
def _vision(graphdef, params, pixel_values, meta):
    model = _merge(graphdef, params)
    return model.encode_vision(pixel_values, *meta)


@functools.partial(jax.jit, static_argnames=("graphdef", "fuse"))
def _decode_weights(graphdef, params, fuse):
    return decode_weights(_merge(graphdef, params).language, fuse)


def _output_axis_whole(model: Qwen3VL) -> bool:
    """Whether no device holds a slice of a projection's output axis (then the sampler may
    fuse q/k/v and gate/up into one matmul each)."""
    for name in ("q_proj", "gate_proj"):
        weight = model.language.layers[name][...]  # [layers, in, out]
        sharding = getattr(weight, "sharding", None)
        if sharding is not None and sharding.shard_shape(weight.shape)[2] != weight.shape[2]:
            return False
    return True


@jax.jit
def _row_keys(seed, row_ids):
    """Row b's random stream: fold_in(PRNGKey(seed), row_ids[b])."""
    base = jax.random.PRNGKey(seed)
    return jax.vmap(lambda r: jax.random.fold_in(base, r))(row_ids)


@functools.partial(jax.jit, static_argnames=("layers", "shape", "dtype", "sharding"))
def _new_cache(layers, shape, dtype, sharding):
    """shape = (B, KV, S, hd) of one value array; keys are stored [B, KV, hd, S]."""
    rows, kv, capacity, head_dim = shape
    keys = tuple(jnp.zeros((rows, kv, head_dim, capacity), dtype) for _ in range(layers))
    values = tuple(jnp.zeros(shape, dtype) for _ in range(layers))
    return (*constrain(keys, values, sharding), jnp.zeros((rows, capacity), bool))


@functools.partial(jax.jit, static_argnames=("graphdef", "sharding", "window", "backend", "block", "shards"),
                   donate_argnames=("cache_k", "cache_v", "valid"))
def _prefill(graphdef, params, weights, cache_k, cache_v, valid, prefix, write_index, row_start, ids, positions,
             counts, visual_index, visual_embeds, deepstack, sharding, window, backend: SamplerBackend, block,
             shards=1):
    """One row group: the chunk ids [g, W] of the cache rows RowGroup(row_start, g / shards,
    shards).order(B) (rows [row_start, row_start + g / shards) of each device's block of rows)
    written into their cache rows at `write_index`, in place (the caches are donated); with `prefix`
    (SharedPrefix, None for a prompt prefill) the rows also attend to their prompts'
    prefixes. Returns (logits [g, V] of each row's last chunk token, caches, valid)."""
    lang = _merge(graphdef, params).language
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
def _copy_rows(cache_k, cache_v, valid, index, sharding):
    """The copied layout: prompt cache rows gathered to one copy per sample."""
    keys = tuple(layer[index] for layer in cache_k)
    values = tuple(layer[index] for layer in cache_v)
    return (*constrain(keys, values, sharding), valid[index])


@functools.partial(jax.jit, static_argnames=("axis", "extra", "sharding"))
def _grow_layer(layer, axis, extra, sharding):
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
            out.append(_grow_layer(layer, axis, extra, sharding))
            layer.delete()
        return tuple(out)

    keys = grow(cache_k, 3, shardings and shardings.keys)
    values = grow(cache_v, 2, shardings and shardings.values)
    return keys, values, _grow_layer(valid, 1, extra, None)


@dataclasses.dataclass(frozen=True)
class _DecodeCarry:
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
        return _DecodeCarry(np.int32(0), np.full((rows, max_steps), -1, np.int32),
                            np.zeros((rows, max_steps), np.float32), np.zeros(rows, np.int32),
                            budgets <= 0, np.zeros(rows, bool), np.int32(write_index),
                            next_position.astype(np.int32))


jax.tree_util.register_dataclass(_DecodeCarry, data_fields=[f.name for f in dataclasses.fields(_DecodeCarry)],
                                 meta_fields=[])


@functools.partial(jax.jit, static_argnames=("graphdef", "sharding", "backend"),
                   donate_argnames=("cache_k", "cache_v", "valid"))
def _decode(graphdef, params, weights, cache_k, cache_v, valid, prefix, logits, budgets, stop_ids, row_keys,
            temperature, top_p, top_k, carry: _DecodeCarry, max_steps, sharding, backend: SamplerBackend):
    """Samples until every row is done, `max_steps` tokens were emitted, or the suffix cache is
    full (the caller grows it and calls again with the returned carry); every step attends to
    the row's prompt in `prefix` and to its own suffix. The first call (step 0)
    samples from the prefill's `logits`; see the module docstring for the log-prob convention."""
    lang = _merge(graphdef, params).language
    capacity = valid.shape[1]

    def keys_at(step):
        return jax.vmap(lambda k: jax.random.fold_in(k, step))(row_keys)

    def emit(c: _DecodeCarry, logits, active) -> _DecodeCarry:
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


# ----------------------------------------------------------------------------- host side
@dataclasses.dataclass(frozen=True)
class _Batch:
    ids: np.ndarray  # [Bp, P]
    positions: np.ndarray  # [3, Bp, P]
    counts: np.ndarray  # [Bp] valid chunk tokens
    visual_index: np.ndarray | None
    pixel_values: np.ndarray | None
    grids: np.ndarray | None


def chunk_width(chunks: Sequence[ModelInputs | None], min_bucket: int) -> int:
    """The bucketed width of a prefill over `chunks` (all rows write the same slots)."""
    return bucket(max([c.length for c in chunks if c is not None] + [1]), min_bucket)


def _collate(chunks: Sequence[ModelInputs | None], rows: int, width: int) -> _Batch:
    """Right-padded chunk batch of `width`; vision items ordered row by row (images, then videos)."""
    counts = np.array([0 if c is None else c.length for c in chunks] + [0] * (rows - len(chunks)))
    ids = np.zeros((rows, width), np.int32)
    positions = np.zeros((3, rows, width), np.int32)
    for b, c in enumerate(chunks):
        if c is not None and c.length:
            ids[b, :c.length] = c.input_ids
            positions[:, b, :c.length] = c.position_ids
    visual_index, pixels, grids = collate_vision(chunks, rows, width)
    return _Batch(ids, positions, counts, visual_index, pixels, grids)


def group_rows(rows: int, per_prompt: int, width: int, token_budget: int) -> int:
    """Rows per prefill call (of one device's block when the rows are split over devices): the largest
    group of at most `token_budget` chunk tokens (one row when even one row exceeds it) that
    holds whole prompts (a multiple of `per_prompt`, a power-of-two count of prompts) or a
    divisor of `per_prompt`; it divides `rows`."""
    prompts = max(rows // per_prompt, 1)
    sizes = {per_prompt << j for j in range(prompts.bit_length()) if prompts % (1 << j) == 0}
    sizes |= {d for d in range(1, per_prompt + 1) if per_prompt % d == 0}
    fitting = [g for g in sizes if g * width <= token_budget and rows % g == 0]
    return max(fitting) if fitting else 1


def prefill_group(rows: int, per_prompt: int, width: int, shards: int, token_budget: int) -> int:
    """Rows per prefill call of `rows` rows (`per_prompt` per prompt) of `width` tokens split
    over `shards` devices: the same group_rows of each device's rows, at most `token_budget`
    chunk tokens in all (at least one row per device). The budget counts the whole group: on an
    fsdp mesh XLA computes a layer's matmuls for all of the group's tokens on every device
    (partial sums over the split weight, then all-reduced)."""
    return shards * group_rows(rows // shards, per_prompt, width, token_budget // shards)


def _has_vision(chunk: ModelInputs) -> bool:
    return bool(len(chunk.pixel_values) or len(chunk.pixel_values_videos))


def _text_slice(chunk: ModelInputs, start: int, stop: int) -> ModelInputs:
    """Tokens [start, stop) of a text-only chunk, with their own positions."""
    positions = chunk.position_ids[:, start:stop]
    return dataclasses.replace(chunk, input_ids=chunk.input_ids[start:stop],
                               mm_token_type_ids=chunk.mm_token_type_ids[start:stop],
                               loss_mask=chunk.loss_mask[start:stop], position_ids=positions,
                               next_position=int(positions.max()) + 1)


@jax.jit
def _pick_rows(take, new, old):
    """Rows of `new` where `take` [B] is set, else of `old` ([B, V] logits)."""
    return jnp.where(take[:, None], new, old)


def _prepend(token: int, position: int, chunk: ModelInputs | None) -> ModelInputs:
    head = encode_ids([token], position, trainable=True)
    return head if chunk is None else head.extend(chunk)


class Sampler:
    """`Sampler(model, config)`; `generate(prompts, ...)` then `extend(state, chunks, ...)`."""

    def __init__(self, model: Qwen3VL, config: SamplerConfig = SamplerConfig(), mesh=None):
        for field in ("attention_block_bytes", "prefill_tokens"):
            if getattr(config, field) < 0:
                raise ValueError(f"SamplerConfig.{field}={getattr(config, field)} "
                                 "must be >= 0 (0 = the backend's default)")
        if config.prefill_window not in PREFILL_WINDOWS:
            raise ValueError(f"SamplerConfig.prefill_window={config.prefill_window!r}: expected one of "
                             f"{PREFILL_WINDOWS}")
        self.model = model
        self.config = config
        self.mesh = mesh
        graphdef, self.params = nnx.split(model)
        self.graphdef = _HashOnce(graphdef)
        text = model.config.text
        self.cache_dtype = jnp.dtype(config.cache_dtype or model.config.dtype)
        self._layout = (text.num_hidden_layers, text.num_key_value_heads, text.head_dim)
        self._weights = None
        self.backend = backend_policy(prefill_score_bytes=config.attention_block_bytes,
                                      prefill_tokens=config.prefill_tokens)

    @property
    def weights(self) -> DecodeWeights:
        """Per-layer decoder weights (projections as [out, in]) and the untied lm head as
        [vocab, D], copied once per Sampler.

        The prefill and decode read these instead of slicing the stacked parameters: XLA on
        CPU/GPU copies a slice that feeds a matmul, which inside the decode loop meant
        reading and writing every weight once more per token; the [vocab, D] head multiplies
        ~1.4x faster at 8-32 rows on XLA:CPU. Costs one copy of the decoder layers (and of an
        untied head) while the Sampler lives (build a new Sampler after a weight update)."""
        if self._weights is None:
            self._weights = _decode_weights(self.graphdef, self.params, _output_axis_whole(self.model))
        return self._weights

    # -- public -------------------------------------------------------------------------
    def generate(self, prompts: Sequence[ModelInputs], num_samples: int = 1, *, seed: int = 0,
                 row_ids: Sequence[int] | None = None, reserve: Sequence[tuple[int, int]] = (),
                 shape: PromptShape = PromptShape(), **knobs) -> tuple[SampleOutput, SamplerState]:
        """Prefills each prompt once (vision included) into the prompt cache, then decodes
        `num_samples` samples of each (row p * num_samples + g) together: with
        config.shared_prefix they all read the prompt's one copy of its keys and values, and
        each writes only its own suffix cache. `reserve`: the later turns of the episode,
        (chunk tokens, new tokens) per extend at their longest; the suffix cache is sized up
        front so that none of them grows it (kv_cache.episode_capacity). Row b draws from the random stream
        fold_in(PRNGKey(seed), row_ids[b]) (default: b), so a row's samples do not depend on
        which other rows share the call (multi-host rollouts). `shape`: fixed prompt-prefill
        sizes (see PromptShape); a call whose prompts exceed them uses its own buckets."""
        if not prompts:
            raise ValueError("generate: no prompts")
        if num_samples < 1:
            raise ValueError(f"generate: num_samples={num_samples} must be >= 1")
        k = self._knobs(knobs)
        prompt_rows = max(bucket(len(prompts), self.config.min_batch_bucket), shape.rows)
        width = max(chunk_width(prompts, self.config.min_chunk_bucket), shape.width)
        prefix_k, prefix_v, prefix_valid = self._empty_cache(prompt_rows, width)
        logits, prefix_k, prefix_v, prefix_valid = self._prefill(prefix_k, prefix_v, prefix_valid, None, 0,
                                                                 list(prompts), prompt_rows, width,
                                                                 shape.frames_per_row)
        rows = prompt_rows * num_samples
        total = len(prompts) * num_samples
        logits = jnp.repeat(logits, num_samples, axis=0)
        if not self.config.shared_prefix and num_samples > 1:
            index = jnp.repeat(jnp.arange(prompt_rows), num_samples)
            prefix_k, prefix_v, prefix_valid = _copy_rows(prefix_k, prefix_v, prefix_valid, index,
                                                          self._sharding(rows, width))
        prefix = SharedPrefix(prefix_k, prefix_v, prefix_valid)
        capacity = episode_capacity([(0, k["max_new_tokens"]), *reserve], self.config.min_chunk_bucket,
                                    self.config.cache_multiple)
        cache_k, cache_v, valid = self._empty_cache(rows, capacity)
        next_position = np.zeros(rows, np.int32)
        next_position[:total] = np.repeat([p.next_position for p in prompts], num_samples)
        budgets = np.zeros(rows, np.int32)
        budgets[:total] = k["max_new_tokens"]
        return self._decode(prefix, cache_k, cache_v, valid, 0, logits, next_position, budgets, total, seed, k,
                            row_ids=row_ids)

    def extend(self, state: SamplerState, chunks: Sequence[ModelInputs | None], *, seed: int = 0,
               row_ids: Sequence[int] | None = None, **knobs) -> tuple[SampleOutput, SamplerState]:
        """Feeds each row's pending token plus its new chunk (None = the row sits this turn
        out) into its suffix cache, in row groups of at most the prefill token budget, then
        decodes again. Chunk b must start at state.chunk_start[b]. Consumes `state`."""
        if len(chunks) != state.num_rows:
            raise ValueError(f"extend: {len(chunks)} chunks for {state.num_rows} rows")
        k = self._knobs(knobs)
        rows = state.next_position.shape[0]
        full: list[ModelInputs | None] = []
        for b, chunk in enumerate(chunks):
            if chunk is None:
                full.append(None)
                continue
            start = int(state.chunk_start[b])
            if chunk.length and int(chunk.position_ids.min()) != start:
                raise ValueError(f"extend: row {b} chunk starts at position "
                                 f"{int(chunk.position_ids.min())}, expected {start}")
            full.append(_prepend(int(state.pending[b]), int(state.next_position[b]), chunk)
                        if state.pending[b] >= 0 else chunk)
        width = chunk_width(full, self.config.min_chunk_bucket)
        piece = self.config.extend_width
        text_only = all(c is None or not _has_vision(c) for c in full)
        if piece and text_only:  # the turn's chunks in pieces of one width
            width = piece * -(-max([c.length for c in full if c is not None] + [1]) // piece)
        cache_k, cache_v, valid = state.cache_k, state.cache_v, state.valid
        new_capacity = self._capacity(state.write_index + width, k["max_new_tokens"])
        if new_capacity > valid.shape[1]:
            cache_k, cache_v, valid = self._grow(cache_k, cache_v, valid, new_capacity)
        if piece and text_only:
            logits = None
            for start in range(0, width, piece):
                part = [None if c is None or c.length <= start else _text_slice(c, start, start + piece)
                        for c in full]
                out, cache_k, cache_v, valid = self._prefill(cache_k, cache_v, valid, state.prefix,
                                                             state.write_index + start, part, rows, piece)
                ends_here = np.array([c is not None and start < c.length <= start + piece for c in full]
                                     + [False] * (rows - len(full)))
                logits = out if logits is None else _pick_rows(ends_here, out, logits)
        else:
            logits, cache_k, cache_v, valid = self._prefill(cache_k, cache_v, valid, state.prefix,
                                                            state.write_index, full, rows, width)
        takes_part = np.array([c is not None for c in full] + [False] * (rows - len(full)))
        next_position = np.array([(int(c.next_position) if c is not None else int(state.next_position[b]))
                                  for b, c in enumerate(full)] + [0] * (rows - len(full)), np.int32)
        budgets = np.where(takes_part, k["max_new_tokens"], 0).astype(np.int32)
        return self._decode(state.prefix, cache_k, cache_v, valid, state.write_index + width, logits,
                            next_position, budgets, state.num_rows, seed, k, keep_pending=state.pending,
                            takes_part=takes_part, row_ids=row_ids)

    def compile_counts(self) -> dict[str, int]:
        return {name: fn._cache_size() for name, fn in
                (("vision", _vision), ("prefill", _prefill), ("decode", _decode),
                 ("copy", _copy_rows), ("grow", _grow_layer), ("cache", _new_cache))}

    # -- internals ----------------------------------------------------------------------
    def _knobs(self, knobs: dict) -> dict:
        c = self.config
        unknown = set(knobs) - {"max_new_tokens", "temperature", "top_p", "top_k", "stop_ids"}
        if unknown:
            raise TypeError(f"unknown sampling arguments {sorted(unknown)}")
        out = dict(max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p,
                   top_k=c.top_k, stop_ids=c.stop_ids)
        out.update({k: v for k, v in knobs.items() if v is not None})
        if out["max_new_tokens"] < 1:
            raise ValueError(f"max_new_tokens={out['max_new_tokens']} must be >= 1")
        if out["temperature"] < 0 or not 0 < out["top_p"] <= 1:
            raise ValueError(f"temperature={out['temperature']} must be >= 0 and top_p={out['top_p']} in (0, 1]")
        if len(out["stop_ids"]) > MAX_STOP_IDS:
            raise ValueError(f"at most {MAX_STOP_IDS} stop ids, got {len(out['stop_ids'])}")
        return out

    def _sharding(self, rows: int, capacity: int):
        layers, kv, hd = self._layout
        return cache_sharding(self.mesh, CacheSpec(layers, rows, capacity, kv, hd, self.cache_dtype.name))

    def _capacity(self, chunk_end: int, max_new_tokens: int) -> int:
        """Suffix slots for a chunk ending at suffix slot `chunk_end` and the start of its decode."""
        return first_capacity(chunk_end, max_new_tokens, self.config.cache_multiple)

    def _grow(self, cache_k, cache_v, valid, new_capacity: int):
        rows, capacity = valid.shape
        return grow_suffix(cache_k, cache_v, valid, new_capacity - capacity, self._sharding(rows, new_capacity))

    def _empty_cache(self, rows: int, capacity: int):
        layers, kv, hd = self._layout
        return _new_cache(layers, (rows, kv, capacity, hd), self.cache_dtype, self._sharding(rows, capacity))

    def row_shards(self, rows: int, prompts: int) -> int:
        layers, kv, hd = self._layout
        spec = CacheSpec(layers, rows, 16, kv, hd, self.cache_dtype.name)
        return row_shards(cache_sharding(self.mesh, spec), spec, prompts)

    def prefill_group(self, rows: int, per_prompt: int, width: int, shards: int = 1) -> int:
        return prefill_group(rows, per_prompt, width, shards, self.backend.prefill_tokens)

    def prefill_block(self, rows: int) -> int:
        return self.backend.prefill_block(rows, self.model.config.text.num_attention_heads,
                                          self.model.config.attention_block)

    def _prefill(self, cache_k, cache_v, valid, prefix: SharedPrefix | None, write_index: int,
                 chunks: list[ModelInputs | None], rows: int, width: int, frames_per_row: int = 0):
        """Writes `chunks` (one per row, None = nothing) at `write_index` in row groups of at
        most the token budget, each group taking the same rows of every device's
        block of rows. Returns (logits [rows, V], caches, valid)."""
        prompts = rows if prefix is None else prefix.valid.shape[0]
        per_prompt = rows // prompts
        shards = self.row_shards(rows, prompts)
        group = self.prefill_group(rows, per_prompt, width, shards)
        capacity = valid.shape[1]
        # attend only to the slots in use (bucketed, so few compiled variants)
        window = capacity
        if self.config.prefill_window == "used":
            window = min(bucket(write_index + width, 16, self.config.cache_multiple), capacity)
        block = self.prefill_block(group)
        chunks = list(chunks) + [None] * (rows - len(chunks))
        logits, order = [], []
        for start in range(0, rows // shards, group // shards):
            index = RowGroup(start, group // shards, shards).order(rows)
            part = [chunks[r] for r in index]
            order.append(index)
            if group < rows and not any(c is not None and c.length for c in part):
                logits.append(jnp.zeros((group, self.model.config.text.vocab_size), jnp.float32))
                continue  # padding rows / rows sitting the turn out: nothing to write
            batch = _collate(part, group, width)
            embeds = deepstack = None
            if batch.pixel_values is not None:
                pixels, grids = pad_frames_to_buckets(batch.pixel_values, batch.grids, group * frames_per_row)
                layout = vision_layout(grids, self.model.config.vision)
                embeds, deepstack = _vision(self.graphdef, self.params, pixels, layout.device_arrays())
            out, cache_k, cache_v, valid = _prefill(
                self.graphdef, self.params, self.weights, cache_k, cache_v, valid, prefix, np.int32(write_index),
                np.int32(start), batch.ids, batch.positions, batch.counts.astype(np.int32), batch.visual_index,
                embeds, deepstack, self._sharding(rows, capacity), window, self.backend, block, shards)
            logits.append(out)
        if len(logits) == 1:
            return logits[0], cache_k, cache_v, valid
        inverse = np.argsort(np.concatenate(order))
        return jnp.concatenate(logits)[inverse], cache_k, cache_v, valid

    def _decode(self, prefix: SharedPrefix, cache_k, cache_v, valid, write_index, logits, next_position,
                budgets, num_rows, seed, k, keep_pending=None, takes_part=None, row_ids=None):
        rows = next_position.shape[0]
        stop = np.full(MAX_STOP_IDS, -2, np.int32)
        stop[:len(k["stop_ids"])] = k["stop_ids"]
        ids = np.arange(rows, dtype=np.int32)
        if row_ids is not None:
            if len(row_ids) != num_rows:
                raise ValueError(f"row_ids: {len(row_ids)} ids for {num_rows} rows")
            ids[:num_rows] = row_ids  # padding rows keep any id: their budget is 0
        if not 0 <= int(seed) < 2**32:
            raise ValueError(f"seed={seed} must be in [0, 2**32)")
        row_keys = _row_keys(np.uint32(seed), ids)
        steps = bucket(k["max_new_tokens"], 16)
        carry = _DecodeCarry.start(budgets, steps, write_index, next_position)
        knobs = (np.float32(k["temperature"]), np.float32(k["top_p"]), np.int32(k["top_k"]))
        while True:  # one segment per suffix size: grow it (at most double) when the slots run out
            carry, cache_k, cache_v, valid = _decode(
                self.graphdef, self.params, self.weights, cache_k, cache_v, valid, prefix, logits, budgets, stop,
                row_keys, *knobs, carry, steps, self._sharding(rows, valid.shape[1]), self.backend)
            n_gen, done = np.asarray(carry.n_gen), np.asarray(carry.done)
            if done.all() or int(carry.step) >= steps:
                break
            left = int(np.max(np.where(done, 0, budgets - n_gen)))
            cache_k, cache_v, valid = self._grow(cache_k, cache_v, valid, grown_capacity(
                valid.shape[1], int(carry.write_index), left, self.config.cache_multiple))
        tokens, logps = np.asarray(carry.tokens), np.asarray(carry.logps)
        finished, write_out, next_out = np.asarray(carry.finished), carry.write_index, carry.next_position
        pending = np.where(n_gen > 0, tokens[np.arange(rows), np.maximum(n_gen - 1, 0)], -1)
        if keep_pending is not None:
            # rows that sat this turn out keep their earlier pending token
            pending = np.where(takes_part, pending, keep_pending)
        result = SampleOutput(
            tokens=[tokens[b, :n_gen[b]].tolist() for b in range(num_rows)],
            logprobs=[logps[b, :n_gen[b]] for b in range(num_rows)],
            finished=finished[:num_rows], lengths=n_gen[:num_rows])
        state = SamplerState(prefix, cache_k, cache_v, valid, int(write_out), np.asarray(next_out),
                             pending.astype(np.int64), num_rows)
        return result, state


def generate(model: Qwen3VL, input_ids: Sequence[Sequence[int]], max_new_tokens: int,
             temperature: float = 0.0, stop_ids: Sequence[int] = (), seed: int = 0,
             top_p: float = 1.0, top_k: int = 0) -> SampleOutput:
    """Text-only batch (a list of token-id lists of any lengths) -> SampleOutput."""
    prompts = [encode_ids(list(ids), 0, trainable=False) for ids in input_ids]
    result, _ = Sampler(model).generate(prompts, max_new_tokens=max_new_tokens,
                                        temperature=temperature, stop_ids=tuple(stop_ids),
                                        seed=seed, top_p=top_p, top_k=top_k)
    return result
