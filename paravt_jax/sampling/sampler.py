"""A jitted KV-cache sampler for multimodal, multi-turn, batched rollouts.

Three jit boundaries, each compiled once per bucket and then reused:
  vision   — every image/video item of a row group's new chunks in one pass (once per prompt,
             however many samples share it), or one pass per shard of rows when a mesh
             splits the cache rows (Sampler.vision_inputs; programs.py);
  prefill  — a right-padded chunk per row written into the cache at each row's own offset
             (prefill.py);
  decode   — one `lax.while_loop` that samples, feeds the token back and stops when every
             row hit a stop id or its budget (decode.py).
Shapes are bucketed (chunk length, batch, cache capacity, decode steps) so that a steady run
over varied prompts and turns compiles nothing new; caches are donated between calls. The
per-call settings are a SamplingParams (params.py); the host-side batches are
sampling/chunks.py's; the cache and its capacity schedule kv_cache.py's; the log-prob
convention is decode.py's.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from paravt_jax.config import ConfigValueError, set_by
from paravt_jax.infra import distributed as dist
from paravt_jax.infra.buckets import bucket
from paravt_jax.models.qwen3_vl.model import Qwen3VL
from paravt_jax.models.qwen3_vl.text import KVCache
from paravt_jax.sampling import decode as decode_program
from paravt_jax.sampling import pages, programs, refill, turns, writes
from paravt_jax.sampling import prefill as prefill_program
from paravt_jax.sampling.backend import DecodeWeights, backend_policy
from paravt_jax.sampling.calls import PromptShape, SampleOutput, call_rows, call_width
from paravt_jax.sampling.chunks import (
    collate,
    pack_rows,
    prefill_group,
    with_pending,
)
from paravt_jax.sampling.decode import DecodeCarry, DecodeInputs, DecodePlan
from paravt_jax.sampling.kv_cache import (
    CacheSpec,
    RowGroup,
    cache_sharding,
    episode_capacity,
    grown_capacity,
    row_shards,
    turn_capacity,
)
from paravt_jax.sampling.params import SamplingParams
from paravt_jax.sampling.prefill import PackedChunk, PackedPlan, PrefillChunk, PrefillPlan
from paravt_jax.sampling.programs import grow_suffix
from paravt_jax.sampling.vision_pass import VisionInputs, packed_vision, vision_sharding, vision_split
from paravt_jax.text.inputs import ModelInputs, encode_ids
from paravt_jax.train.batch import shard_vision

PREFILL_WINDOWS = ("used", "capacity")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """How a Sampler lays out its work (buckets, cache, row groups); what each call samples is
    its SamplingParams."""
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
    # The key block of a decode step's bounded read (decode_window "used"): one loop iteration
    # per filled block, at most one block read past the fill; 0 = the backend's default (512)
    decode_block: int = 0
    # True: the samples of a prompt share one copy of its keys and values; False: every sample
    # holds its own copy (the copied layout, kept as the measured baseline of bench/sampler.py)
    shared_prefix: bool = True
    # What a prefill attends: "used" = the cache slots in use, bucketed (one compiled program
    # per bucket the write pointer reaches); "capacity" = every slot of the cache (one program
    # per chunk width: the steady shapes of an RL run, at the cost of attending empty slots)
    prefill_window: str = set_by("used", "rl.shapes for RL rollouts; the caller")
    # What a decode step attends: "used" = each row that still samples, its prompt and the
    # suffix up to the last filled block (blockwise, one program for every fill: the reserved
    # episode capacity is not read while empty); "capacity" = every slot of the suffix for every
    # row (the earlier read, kept as the measured baseline of bench/decode.py)
    decode_window: str = "used"
    # Where a decode step reads the cache: "contiguous" = the prompt and suffix caches in place (two
    # partial attentions merged); "paged" = each decode call copies them into pages of `decode_page`
    # slots (sampling/pages.py: a prompt's full pages shared by its samples, each row read up to
    # its own length) and every step writes and reads there (the contiguous caches are written
    # too: the prefills and the growth stay contiguous). The pages double the decode's cache
    # memory; unsharded samplers only; same greedy tokens and log-probs (tests)
    decode_cache: str = "contiguous"
    # The paged read (pages.decode_kernel): "auto" = the Pallas paged kernel on TPU / GPU, the
    # XLA read elsewhere; "xla"; "paged_tpu" / "paged_gpu" (an error off their platform)
    decode_kernel: str = "auto"
    decode_page: int = 16
    # > 0: an extend whose chunks hold no image writes them in pieces of this many tokens,
    # one prefill call each (one compiled program, however long the turn's tool responses);
    # 0: one call at the chunks' power-of-two bucket
    extend_width: int = set_by(0, "rl.shapes for RL rollouts; the caller")
    # True: on a mesh that splits the cache rows, each device encodes only the frames of its own
    # rows' chunks (a vision pass per shard of rows, as the train step's); False: every device
    # encodes every frame of a row group (the replicated pass, the measured baseline of
    # bench/rollout_shards.py)
    vision_shards: bool = True
    # True: on a mesh that splits the cache rows, a prefill's hidden states are split by rows too
    # (each device its own rows' tokens, each layer's weights gathered when it starts, as the train
    # step's layers); False: every device computes every token of the row group against its part
    # of the weights (the measured baseline of bench/program_bytes.py --program prefill)
    prefill_row_split: bool = True
    # True: on a mesh, the sampler's copies of the MLP weights are split as tensor parallelism (gate
    # and up by their output, down by its input: a layer all-reduces one [rows, D] output) and the
    # untied lm head by the vocabulary (backend.WeightLayout); False: as the parameters are (their
    # contraction axis split: every decode layer all-reduces [rows, 2 x intermediate] partial sums,
    # the head [rows, vocab]), the measured baseline of bench/program_bytes.py --program decode
    decode_weight_split: bool = True
    # True: a generate() call's prompts are prefilled packed, several prompts a row of the call's
    # width (sampling/chunks.py `pack_rows`), only their own tokens computed, and their keys and
    # values scattered into the prompt cache (prefill.packed_prefill): a call of short prompts
    # (a sub-agent's crop, a prompt of few overview frames) does not compute its rows' padding.
    # False: one right-padded row per prompt. The same cache either way; the attention's sums run
    # in other blocks (other bits). Unsharded samplers only
    prompt_packing: bool = False
    # True: a packed prompt prefill's vision pass runs over the fewest of a quarter, half or all of
    # the call's fixed frames that hold its frames (vision_pass.vision_floors), its features padded with
    # zero rows to the fixed count; False: over the fixed count (blank frames encoded too). The same
    # features for the real frames either way
    vision_buckets: bool = True

    def unsharded_only(self) -> tuple[str, ...]:
        """The settings on which this sampler runs only on one device (the packed prompt rows and the
        paged decode's pools are not split over a mesh), each as `field=value`."""
        return tuple(name for name, on in (("prompt_packing=True", self.prompt_packing),
                                           ("decode_cache='paged'", self.decode_cache == "paged")) if on)

    def check_devices(self, devices: int, prefix: str = "SamplerConfig.") -> None:
        """Refuses the settings of `unsharded_only` on a mesh of `devices` > 1, naming each field
        with `prefix` (the config section that holds this sampler)."""
        if devices > 1 and (fields := self.unsharded_only()):
            raise ConfigValueError(f"{' and '.join(prefix + f for f in fields)} run unsharded only (the packed "
                                   f"prompt rows and the page pools are not split over a mesh), and the mesh has "
                                   f"{devices} devices: set them off, or sample on one device")


# The packed prefill's call shapes whose every row count is compiled (Sampler._packed_prefill)
PACKED_SHAPES: set = set()


def packed_rows(rows: int) -> tuple[int, ...]:
    """The row counts a packed prompt prefill of `rows` prompt rows takes (Sampler._packed_prefill):
    the fewest of a quarter, half or all of them that hold its prompts, so that a run's calls
    compile at most three programs a call shape, all when the shape is first used."""
    return tuple(sorted({-(-rows // 4), -(-rows // 2), rows}))


def empty_rows(chunk: PackedChunk, packed: int, rows: int) -> PackedChunk:
    """A packed chunk of `packed` rows holding no token, with `chunk`'s vision features: the
    program of that row count, run once so that it is compiled (its cache rows are dropped)."""
    width = chunk.ids.shape[1]
    zeros = np.zeros((packed, width), np.int32)
    index = None if chunk.visual_index is None else np.full((packed, width), -1, np.int32)
    return PackedChunk(zeros, np.zeros((3, packed, width), np.int32), zeros, index, chunk.visual_embeds,
                       chunk.deepstack, np.full(packed * width, rows, np.int32), np.zeros(packed * width, np.int32),
                       np.zeros_like(chunk.last))


@dataclasses.dataclass(frozen=True)
class SamplerState:
    """Where each row's episode stands. Rows are prompt-major (row p * F + f, F = rows per
    prompt: the samples with a shared prefix, 1 in the copied layout). `prefix` holds each
    prompt's keys and values once (keys [P, KV heads, head_dim, Sp], values
    [P, KV heads, Sp, head_dim], valid [P, Sp]); the per-row `suffix` cache holds everything
    after the prompt: one array per layer, keys [B, KV heads, head_dim, S], values
    [B, KV heads, S, head_dim]. All rows share the suffix write pointer `write_index`;
    `suffix.valid` [B, S] marks the suffix slots that hold each row's real tokens. `pending`
    is the last sampled token, not yet in the cache (-1 when none); the next chunk of row b
    must be encoded with start_position = chunk_start[b]."""
    prefix: KVCache
    suffix: KVCache
    write_index: int
    next_position: np.ndarray  # [B] position of the pending token (or of the next token)
    pending: np.ndarray  # [B]
    num_rows: int

    @property
    def capacity(self) -> int:
        """Slots a row attends: its prompt's prefix plus its suffix."""
        return self.prefix.capacity + self.suffix.capacity

    @property
    def chunk_start(self) -> np.ndarray:
        return self.next_position + (self.pending >= 0)

    def cached_tokens(self) -> np.ndarray:
        """[B] tokens in each row's cache (its prompt's prefix + its own suffix)."""
        per_prompt = np.asarray(self.prefix.valid).sum(1)
        rows = self.suffix.valid.shape[0]
        return per_prompt.repeat(rows // per_prompt.shape[0]) + np.asarray(self.suffix.valid).sum(1)


class Sampler:
    """`Sampler(model, config)`; `generate(prompts, ...)` then `extend(state, chunks, ...)`. On a
    mesh (`mesh`, or the one the model's parameters lie on) the caches split their rows over
    its batch axes and each device encodes its own rows' frames."""

    def __init__(self, model: Qwen3VL, config: SamplerConfig = SamplerConfig(), mesh=None):
        for field in ("attention_block_bytes", "prefill_tokens", "decode_block"):
            if getattr(config, field) < 0:
                raise ValueError(f"SamplerConfig.{field}={getattr(config, field)} "
                                 "must be >= 0 (0 = the backend's default)")
        if config.decode_window not in decode_program.DECODE_WINDOWS:
            raise ValueError(f"SamplerConfig.decode_window={config.decode_window!r}: expected one of "
                             f"{decode_program.DECODE_WINDOWS}")
        if config.decode_cache not in decode_program.DECODE_CACHES:
            raise ValueError(f"SamplerConfig.decode_cache={config.decode_cache!r}: expected one of "
                             f"{decode_program.DECODE_CACHES}")
        if config.decode_page < 1:
            raise ValueError(f"SamplerConfig.decode_page={config.decode_page} must be >= 1")
        kernel = pages.decode_kernel(config.decode_kernel, "SamplerConfig.decode_kernel")
        if config.prefill_window not in PREFILL_WINDOWS:
            raise ValueError(f"SamplerConfig.prefill_window={config.prefill_window!r}: expected one of "
                             f"{PREFILL_WINDOWS}")
        self.model = model
        self.config = config
        # the mesh the model's parameters lie on unless given: without one, a multi-device model's
        # caches and vision pass would be replicated on every device (no row split)
        self.mesh = mesh if mesh is not None else dist.model_mesh(model)
        graphdef, self.params = nnx.split(model)
        self.graphdef = programs.HashOnce(graphdef)
        text = model.config.text
        self.cache_dtype = jnp.dtype(config.cache_dtype or model.config.dtype)
        self._layout = (text.num_hidden_layers, text.num_key_value_heads, text.head_dim)
        self._weights = None
        self.backend = backend_policy(prefill_score_bytes=config.attention_block_bytes,
                                      prefill_tokens=config.prefill_tokens, decode_block=config.decode_block)
        self.decode_kernel = None  # the paged read, resolved (None: the contiguous read)
        if config.decode_cache == "paged":
            if config.decode_window != "used":
                raise ValueError(f"SamplerConfig.decode_cache='paged' reads each row up to its length: "
                                 f"decode_window={config.decode_window!r} must be 'used'")
            self.decode_kernel = kernel
        config.check_devices(1 if self.mesh is None else self.mesh.size)

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
            layout = programs.weight_layout(self.params, self.model.config, self.config.decode_weight_split)
            self._weights = programs.decode_weights(self.graphdef, self.params, layout,
                                                    self.model.config.text.num_hidden_layers)
        return self._weights

    # -- public -------------------------------------------------------------------------
    def generate(self, prompts: Sequence[ModelInputs], num_samples: int = 1, *,
                 sampling: SamplingParams = SamplingParams(), seed: int = 0,
                 row_ids: Sequence[int] | None = None, reserve: Sequence[tuple[int, int]] = (),
                 shape: PromptShape = PromptShape()) -> tuple[SampleOutput, SamplerState]:
        """Prefills each prompt once (vision included) into the prompt cache, then decodes
        `num_samples` samples of each (row p * num_samples + g) together, as `sampling` says:
        with config.shared_prefix they all read the prompt's one copy of its keys and values,
        and each writes only its own suffix cache. `reserve`: the later turns of the episode,
        (chunk tokens, new tokens) per extend at their longest; the suffix cache is sized up
        front so that none of them grows it (kv_cache.episode_capacity). Row b draws from the
        random stream fold_in(PRNGKey(seed), row_ids[b]) (default: b), so a row's samples do
        not depend on which other rows share the call (multi-host rollouts). `shape`: fixed
        prompt-prefill sizes (see PromptShape); a call whose prompts exceed them uses its own
        buckets."""
        prefix, logits, suffix, next_position, budgets, total = self.prompt_rows(prompts, num_samples, sampling,
                                                                                 reserve, shape)
        return self._decode(prefix, suffix, 0, logits, next_position, budgets, total, seed, sampling,
                            row_ids=row_ids)

    def prompt_rows(self, prompts: Sequence[ModelInputs], num_samples: int, sampling: SamplingParams,
                    reserve: Sequence[tuple[int, int]], shape: PromptShape, spare_prompts: int = 0):
        """`generate`'s start: the prompts prefilled once, their rows (prompt-major) and an empty
        suffix cache sized for the episode (`spare_prompts`: that many empty prompts more, after
        the prefill, their rows padding rows). Returns (prefix, logits [rows, V], suffix,
        next_position [rows], budgets [rows]: 0 for padding rows, the number of real rows)."""
        if not prompts:
            raise ValueError("generate: no prompts")
        if num_samples < 1:
            raise ValueError(f"generate: num_samples={num_samples} must be >= 1")
        prompt_rows = call_rows(len(prompts), shape, self.config.min_batch_bucket)
        width = call_width(prompts, shape, self.config.min_chunk_bucket)
        logits, prefix = self.prompt_prefill(list(prompts), prompt_rows, width, shape.frames_per_row)
        if spare_prompts:
            prompt_rows += spare_prompts
            prefix, logits = programs.pad_rows(prefix, logits, spare_prompts, self.cache_shardings(prompt_rows, width))
        rows = prompt_rows * num_samples
        total = len(prompts) * num_samples
        logits = jnp.repeat(logits, num_samples, axis=0)
        if not self.config.shared_prefix and num_samples > 1:
            index = jnp.repeat(jnp.arange(prompt_rows), num_samples)
            prefix = programs.copy_rows(prefix, index, self.cache_shardings(rows, width))
        capacity = episode_capacity([(0, sampling.max_new_tokens), *reserve], self.config.min_chunk_bucket,
                                    self.config.cache_multiple)
        next_position = np.zeros(rows, np.int32)
        next_position[:total] = np.repeat([p.next_position for p in prompts], num_samples)
        budgets = np.zeros(rows, np.int32)
        budgets[:total] = sampling.max_new_tokens
        return prefix, logits, self.empty_cache(rows, capacity), next_position, budgets, total

    def extend(self, state: SamplerState, chunks: Sequence[ModelInputs | None], *,
               sampling: SamplingParams = SamplingParams(), seed: int = 0,
               row_ids: Sequence[int] | None = None) -> tuple[SampleOutput, SamplerState]:
        """Feeds each row's pending token plus its new chunk (None = the row sits this turn
        out) into its suffix cache, in row groups of at most the prefill token budget, then
        decodes again as `sampling` says. Chunk b must start at state.chunk_start[b].
        Consumes `state`."""
        if len(chunks) != state.num_rows:
            raise ValueError(f"extend: {len(chunks)} chunks for {state.num_rows} rows")
        rows = state.next_position.shape[0]
        full = [None if chunk is None else
                with_pending(chunk, int(state.pending[b]), int(state.next_position[b]), b, "extend")
                for b, chunk in enumerate(chunks)]
        suffix = state.suffix
        width = writes.write_width(self, full)
        capacity = turn_capacity(suffix.capacity, state.write_index + width, sampling.max_new_tokens,
                                 self.config.cache_multiple)
        if capacity > suffix.capacity:
            suffix = self._grow(suffix, capacity)
        logits, suffix = writes.write_chunks(self, suffix, state.prefix, state.write_index, full, width)
        takes_part = np.array([c is not None for c in full] + [False] * (rows - len(full)))
        next_position = np.array([(int(c.next_position) if c is not None else int(state.next_position[b]))
                                  for b, c in enumerate(full)] + [0] * (rows - len(full)), np.int32)
        budgets = np.where(takes_part, sampling.max_new_tokens, 0).astype(np.int32)
        return self._decode(state.prefix, suffix, state.write_index + width, logits, next_position, budgets,
                            state.num_rows, seed, sampling, keep_pending=state.pending, takes_part=takes_part,
                            row_ids=row_ids)

    def start_turns(self, prompts: Sequence[ModelInputs], num_samples: int = 1, *,
                    sampling: SamplingParams = SamplingParams(), seed: int = 0,
                    row_ids: Sequence[int] | None = None, reserve: Sequence[tuple[int, int]] = (),
                    shape: PromptShape = PromptShape(), refill_at: int = 0, spare_rows: int = 0) -> turns.Turns:
        """`generate`'s rows as a refilled decode of many episodes' turns (sampling/turns.py): each
        row's turn ends on its own (`decode_turns`) and the row's next turn starts as soon as its
        chunk is written (`extend_turns`), while the other rows decode. Each row draws its turns
        from the random streams of `generate` and `extend` (the seed of the row's turn), so the
        tokens are theirs, greedy or sampled. `refill_at`: `decode_turns` returns once that many
        rows ended their turns (0: a quarter of the rows). `spare_rows`: at least that many rows
        more, in no turn, for other work (`admit_turns`). The contiguous decode only."""
        return turns.start(self, prompts, num_samples, sampling=sampling, seed=seed, row_ids=row_ids,
                           reserve=reserve, shape=shape, refill_at=refill_at, spare_rows=spare_rows)

    def decode_turns(self, state: turns.Turns) -> list[turns.TurnEnd]:
        """Decodes `state`'s rows until `refill_at` of them ended their turns (or all did), and
        returns those turns (see start_turns)."""
        return turns.decode(self, state)

    def extend_turns(self, state: turns.Turns, chunks: dict[int, ModelInputs], *, budget: dict[int, int],
                     seed: dict[int, int]) -> None:
        """Writes each row's `chunks[row]` (its pending token in front) at the row's own suffix
        slot and starts the row's next turn: `budget[row]` tokens from the stream of `seed[row]`
        (see start_turns). The other rows are not written to."""
        turns.extend(self, state, chunks, budget, seed)

    def admit_turns(self, state: turns.Turns, prompts: dict[int, ModelInputs], *, budget: dict[int, int],
                    seed: dict[int, int], stream: dict[int, int]) -> None:
        """Gives each free row (not in a turn: its episode over, or a spare row) in `prompts` a
        prompt of its own: written into the row's emptied suffix from slot 0, decoded from the
        next `decode_turns` without the row's shared prompt, `budget[row]` tokens drawn from
        fold_in(PRNGKey(seed[row]), stream[row]) as `generate` draws them (see sampling/turns.py).
        Its turn ends like any other (`decode_turns`); the other rows are not written to."""
        turns.admit(self, state, prompts, budget, seed, stream)

    def sample_queued(self, prompts: Sequence[ModelInputs], slots: int, *,
                      sampling: SamplingParams = SamplingParams(), seed: int = 0,
                      row_ids: Sequence[int] | None = None, shape: PromptShape = PromptShape(),
                      refill_at: int = 0) -> SampleOutput:
        """One sample of each prompt, one turn each (independent calls: a tool round's sub-agent
        prompts), through `slots` decode rows kept busy: a row whose sample ends takes the next
        waiting prompt, prefilled into that row's prompt cache while its suffix restarts at slot 0
        (DecodePlan.refill), so the call decodes about sum(tokens) / slots steps instead of, in
        calls of `slots` prompts one after another, each call's longest sample. The decode stops
        for a refill once `refill_at` rows are free and prompts wait (0: a quarter of the rows;
        refilling row by row costs a prefill and a host round trip per row, measured slower on a
        CPU: bench/queued.py). Prompt i draws its k-th
        token from fold_in(fold_in(PRNGKey(seed), row_ids[i]), k) (default row id: i), whichever
        row it ran in and when: the tokens of `generate` over the same prompts, greedy or sampled
        (the log-probs to the bits of the prefill's sums). `shape` fixes the prefill and the rows as
        in generate (rows: `slots` when shape.rows is 0). The contiguous decode only."""
        return refill.sample_queued(self, prompts, slots, sampling=sampling, seed=seed, row_ids=row_ids, shape=shape,
                                    refill_at=refill_at)

    def compile_counts(self) -> dict[str, int]:
        return {name: fn._cache_size() for name, fn in
                (("vision", programs.vision), ("prefill", prefill_program.prefill),
                 ("packed_prefill", prefill_program.packed_prefill),
                 ("decode", decode_program.decode), ("copy", programs.copy_rows), ("grow", programs.grow_layer),
                 ("admit", programs.admit_rows),
                 ("cache", programs.new_cache))}

    def paged_plan(self) -> pages.PagedPlan | None:
        """The decode's paged read (None: contiguous), read in blocks of about backend.decode_block slots."""
        if self.decode_kernel is None:
            return None
        page = self.config.decode_page
        return pages.PagedPlan(page, self.decode_kernel, max(self.backend.decode_block // page, 1))

    # -- internals ----------------------------------------------------------------------
    def cache_shardings(self, rows: int, capacity: int):
        layers, kv, hd = self._layout
        return cache_sharding(self.mesh, CacheSpec(layers, rows, capacity, kv, hd, self.cache_dtype.name))

    def _grow(self, cache: KVCache, new_capacity: int) -> KVCache:
        rows, capacity = cache.valid.shape
        return grow_suffix(cache, new_capacity - capacity, self.cache_shardings(rows, new_capacity))

    def empty_cache(self, rows: int, capacity: int) -> KVCache:
        layers, kv, hd = self._layout
        return programs.new_cache(layers, (rows, kv, capacity, hd), self.cache_dtype,
                                  self.cache_shardings(rows, capacity))

    def row_shards(self, rows: int, prompts: int) -> int:
        layers, kv, hd = self._layout
        spec = CacheSpec(layers, rows, 16, kv, hd, self.cache_dtype.name)
        return row_shards(cache_sharding(self.mesh, spec), spec, prompts)

    def prefill_group(self, rows: int, per_prompt: int, width: int, shards: int = 1) -> int:
        return prefill_group(rows, per_prompt, width, shards, self.backend.prefill_tokens)

    def prefill_block(self, rows: int) -> int:
        return self.backend.prefill_block(rows, self.model.config.text.num_attention_heads,
                                          self.model.config.attention_block)

    def prefill_plan(self, rows: int, capacity: int, write_index: int, width: int, group: int,
                     shards: int) -> PrefillPlan:
        """The static arguments of a prefill of `group` rows (of `rows`) writing `width` tokens
        at `write_index` into a cache of `capacity` slots."""
        window = capacity  # "used": attend only to the slots in use (bucketed, so few compiled variants)
        if self.config.prefill_window == "used":
            window = min(bucket(write_index + width, 16, self.config.cache_multiple), capacity)
        return PrefillPlan(self.cache_shardings(rows, capacity), self.backend, window, self.prefill_block(group),
                           shards, self.config.prefill_row_split)

    def prefill(self, cache: KVCache, prefix: KVCache | None, write_index: int, chunks: list[ModelInputs | None],
                 width: int, frames_per_row: int = 0, prefix_rows: np.ndarray | None = None
                 ) -> tuple[jax.Array, KVCache]:
        """Writes `chunks` (one per row, None = nothing) at `write_index` in row groups of at
        most the token budget, each group taking the same rows of every device's block of
        rows (`prefix_rows`: see writes.write_chunks). Returns (logits [rows, V], the cache)."""
        rows = cache.valid.shape[0]
        prompts = rows if prefix is None else prefix.valid.shape[0]
        per_row = np.ndim(write_index) == 1  # each row at its own slot: one group of the rows that write
        if prefix_rows is not None and not per_row:
            raise ValueError("_prefill: prefix_rows takes a write slot per row")
        if per_row:
            return writes.prefill_rows(self, cache, prefix, np.asarray(write_index), chunks, width, prefix_rows)
        shards = self.row_shards(rows, prompts)
        group = self.prefill_group(rows, rows // prompts, width, shards)
        plan = self.prefill_plan(rows, cache.capacity, write_index, width, group, shards)
        chunks = list(chunks) + [None] * (rows - len(chunks))
        logits, order = [], []
        for start in range(0, rows // shards, group // shards):
            index = RowGroup(start, group // shards, shards).order(rows)
            part = [chunks[r] for r in index]
            order.append(index)
            if group < rows and not any(c is not None and c.length for c in part):
                logits.append(jnp.zeros((group, self.model.config.text.vocab_size), jnp.float32))
                continue  # padding rows / rows sitting the turn out: nothing to write
            chunk = self.prefill_chunk(part, group, width, frames_per_row, write_index, start, shards)
            out, cache = prefill_program.prefill(self.graphdef, self.params, self.weights, cache, prefix, chunk, plan)
            logits.append(out)
        if len(logits) == 1:
            return logits[0], cache
        inverse = np.argsort(np.concatenate(order))
        return jnp.concatenate(logits)[inverse], cache

    def prompt_prefill(self, prompts: list[ModelInputs], rows: int, width: int, frames_per_row: int
                        ) -> tuple[jax.Array, KVCache]:
        """A prompt cache of `rows` x `width` slots holding `prompts` in its first rows, packed
        (config.prompt_packing) or a right-padded row each. Returns (logits [rows, V], the cache)."""
        if self.config.prompt_packing:
            return self._packed_prefill(prompts, rows, width, frames_per_row)
        return self.prefill(self.empty_cache(rows, width), None, 0, prompts, width, frames_per_row)

    def _packed_prefill(self, prompts: list[ModelInputs], rows: int, width: int, frames_per_row: int
                        ) -> tuple[jax.Array, KVCache]:
        """The prompts packed into rows of `width` (at least a quarter of `rows` rows, so that a
        run's calls take few row counts), prefilled at once into a prompt cache of `rows` x
        `width` slots (prefill.packed_prefill). Returns (logits [rows, V], the cache)."""
        places, used = pack_rows([p.length for p in prompts], width)
        packed = min(count for count in packed_rows(rows) if count >= used)
        chunk = self.packed_chunk(prompts, places, packed, width, rows * frames_per_row, rows)
        # the first call of this shape (in this process: a run builds a Sampler a step) compiles
        # every row count
        shape = (self.graphdef, rows, width, self.cache_dtype.name, None if chunk.visual_embeds is None else
                 (chunk.visual_embeds.shape, chunk.visual_embeds.dtype.name))
        if shape not in PACKED_SHAPES:
            PACKED_SHAPES.add(shape)
            for other in packed_rows(rows):
                if other != packed:
                    self._run_packed(empty_rows(chunk, other, rows), rows, width)
        return self._run_packed(chunk, rows, width)

    def _run_packed(self, chunk: PackedChunk, rows: int, width: int) -> tuple[jax.Array, KVCache]:
        plan = PackedPlan(self.backend, rows, width, self.cache_dtype.name, self.prefill_block(chunk.ids.shape[0]))
        return prefill_program.packed_prefill(self.graphdef, self.params, self.weights, chunk, plan)

    def packed_chunk(self, prompts: list[ModelInputs], places: list[tuple[int, int]], packed: int, width: int,
                     frames: int, rows: int) -> PackedChunk:
        """The packed rows of `prompts` placed at `places` ((row, offset) each, `packed` rows of
        `width`), their vision pass padded to at least `frames` frames, and each token's cache
        row and slot in a prompt cache of `rows` rows."""
        ids = np.zeros((packed, width), np.int32)
        positions = np.zeros((3, packed, width), np.int32)
        segments = np.zeros((packed, width), np.int32)
        slot_rows = np.full((packed, width), rows, np.int32)
        slot_index = np.zeros((packed, width), np.int32)
        last = np.zeros(rows, np.int32)
        for p, (prompt, (row, start)) in enumerate(zip(prompts, places)):
            stop = start + prompt.length
            ids[row, start:stop] = prompt.input_ids
            positions[:, row, start:stop] = prompt.position_ids
            segments[row, start:stop] = p + 1
            slot_rows[row, start:stop] = p
            slot_index[row, start:stop] = np.arange(prompt.length)
            last[p] = row * width + max(stop - 1, start)
        placements = [(row, start, prompt) for prompt, (row, start) in zip(prompts, places)]
        visual_index, embeds, deepstack = packed_vision(self.graphdef, self.params, prompts, placements, packed,
                                                        width, self.model.config.vision, frames,
                                                        self.config.vision_buckets)
        return PackedChunk(ids, positions, segments, visual_index, embeds, deepstack, slot_rows.reshape(-1),
                           slot_index.reshape(-1), last)

    def vision_inputs(self, part: list[ModelInputs | None], group: int, width: int, frames_per_row: int,
                      shards: int = 1) -> VisionInputs | None:
        """The vision pass of one row group's chunks (None without frames), each size's frames
        padded to a power of two and to at least `frames_per_row` per row. shards = S > 1 (the
        group's rows in S blocks, one per device block of cache rows, RowGroup order) and
        config.vision_shards: one pass per block, its arrays with a leading S axis placed on
        that block's devices; else one pass over every frame, on every device."""
        split = vision_split(self.config, self.mesh, shards)
        placements = [(b, 0, chunk) for b, chunk in enumerate(part)]
        index, pixels, meta = shard_vision(placements, group, width, self.model.config.vision,
                                           group * frames_per_row, split)
        if pixels is None:
            return None
        if split == 1:
            return VisionInputs(index, pixels, meta, None)
        pixels, meta = jax.tree.map(lambda x: jax.device_put(x, vision_sharding(self.mesh, x.ndim, split)),
                                    (pixels, meta))
        return VisionInputs(index, pixels, meta, self.mesh)

    def prefill_chunk(self, part: list[ModelInputs | None], group: int, width: int, frames_per_row: int,
                      write_index: int, row_start: int, shards: int = 1) -> PrefillChunk:
        """One row group's chunk batch, its vision inputs encoded (`vision_inputs`)."""
        batch = collate(part, group, width)
        visual_index = embeds = deepstack = None
        vision = self.vision_inputs(part, group, width, frames_per_row, shards)
        if vision is not None:
            visual_index = vision.visual_index
            embeds, deepstack = programs.vision(self.graphdef, self.params, vision.pixel_values, vision.meta,
                                                vision.mesh)
        return PrefillChunk(batch.ids, batch.positions, batch.counts.astype(np.int32), visual_index, embeds,
                            deepstack, np.asarray(write_index, np.int32), np.int32(row_start))

    def _decode(self, prefix: KVCache, suffix: KVCache, write_index, logits, next_position, budgets, num_rows,
                seed, sampling: SamplingParams, keep_pending=None, takes_part=None, row_ids=None):
        rows = next_position.shape[0]
        ids = np.arange(rows, dtype=np.int32)
        if row_ids is not None:
            if len(row_ids) != num_rows:
                raise ValueError(f"row_ids: {len(row_ids)} ids for {num_rows} rows")
            ids[:num_rows] = row_ids  # padding rows keep any id: their budget is 0
        if not 0 <= int(seed) < 2**32:
            raise ValueError(f"seed={seed} must be in [0, 2**32)")
        steps = bucket(sampling.max_new_tokens, 16)
        inputs = DecodeInputs.of(logits, budgets, decode_program.row_keys(np.uint32(seed), ids), sampling, steps)
        carry = DecodeCarry.start(budgets, steps, write_index, next_position)
        while True:  # one segment per suffix size: grow it (at most double) when the slots run out
            plan = DecodePlan(self.cache_shardings(rows, suffix.capacity), self.backend, self.config.decode_window,
                              self.paged_plan(), truncation=sampling.truncates)
            carry, suffix = decode_program.decode(self.graphdef, self.params, self.weights, suffix, prefix, inputs,
                                                  carry, plan)
            n_gen, done = np.asarray(carry.n_gen), np.asarray(carry.done)
            if done.all() or int(carry.step) >= steps:
                break
            # the segment stopped because the suffix is full (write_index == capacity)
            left = int(np.max(np.where(done, 0, budgets - n_gen)))
            suffix = self._grow(suffix, grown_capacity(suffix.capacity, left, self.config.cache_multiple))
        tokens, logps = np.asarray(carry.tokens), np.asarray(carry.logps)
        pending = np.where(n_gen > 0, tokens[np.arange(rows), np.maximum(n_gen - 1, 0)], -1)
        if keep_pending is not None:
            # rows that sat this turn out keep their earlier pending token
            pending = np.where(takes_part, pending, keep_pending)
        result = SampleOutput(
            tokens=[tokens[b, :n_gen[b]].tolist() for b in range(num_rows)],
            logprobs=[logps[b, :n_gen[b]] for b in range(num_rows)],
            finished=np.asarray(carry.finished)[:num_rows], lengths=n_gen[:num_rows], row_steps=rows * int(carry.step))
        state = SamplerState(prefix, suffix, int(carry.write_index), np.asarray(carry.next_position),
                             pending.astype(np.int64), num_rows)
        return result, state


def generate(model: Qwen3VL, input_ids: Sequence[Sequence[int]], sampling: SamplingParams = SamplingParams(),
             seed: int = 0) -> SampleOutput:
    """Text-only batch (a list of token-id lists of any lengths) -> SampleOutput."""
    prompts = [encode_ids(list(ids), 0, trainable=False) for ids in input_ids]
    result, _ = Sampler(model).generate(prompts, sampling=sampling, seed=seed)
    return result
