"""A refilled decode of many episodes' turns (`Sampler.start_turns`, `decode_turns`,
`extend_turns`): the rows of `generate`, each ending its turn on its own. The decode
(DecodePlan.refill: each row its own suffix slots and token columns) returns once a few rows
ended their turns; the caller answers their tool calls and writes each row's responses at that
row's own slot (a prefill with a write slot per row), and the row's next turn starts at the
next decode while the others go on with theirs. A row's turns draw from the streams of
`generate` and `extend` (each turn's seed, the row's id, the token's index in its turn), so the
tokens are the round-by-round rollout's, whichever rows share a decode call.

A row that is not in a turn (its episode over, or one of the spare rows `start_turns` adds)
can take other work (`Sampler.admit_turns`): a whole new prompt, written into the row's own
slots from slot 0 (the row's old slots emptied), which the row then decodes without reading
its group's shared prompt; it draws from the stream `generate` gives that prompt (seed, row
id), so its tokens are those of a call of its own: a tool round's sub-agent prompts decoded in
the episodes' rows, between their turns."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from paravt_jax.infra.buckets import bucket
from paravt_jax.models.qwen3_vl.text import KVCache
from paravt_jax.sampling import decode as decode_program
from paravt_jax.sampling import programs, writes
from paravt_jax.sampling.calls import PromptShape
from paravt_jax.sampling.chunks import with_pending
from paravt_jax.sampling.decode import DecodeCarry, DecodeInputs, DecodePlan
from paravt_jax.sampling.kv_cache import grown_capacity, turn_capacity
from paravt_jax.sampling.params import SamplingParams
from paravt_jax.text.inputs import ModelInputs


@dataclasses.dataclass(frozen=True)
class TurnEnd:
    """One row's turn as it ended: its tokens, their log-probs, whether a stop id ended it."""
    row: int
    tokens: list[int]
    logprobs: np.ndarray
    finished: bool


@dataclasses.dataclass
class Turns:
    """The rows of a refilled multi-turn decode (host side; the caches and logits on device).
    `seeds` [B]: the seed of each row's current turn; `budgets` [B]: its tokens at most;
    `running` [B]: in a turn whose end was not returned yet; `reads_prefix` [B]: the row reads
    its group's prompt (False: it took a prompt of its own, `admit`). `row_steps`: the decode's work so
    far (its rows x the loop steps they ran, busy or idle)."""
    prefix: KVCache
    suffix: KVCache
    logits: jax.Array
    carry: DecodeCarry
    seeds: np.ndarray
    streams: np.ndarray
    budgets: np.ndarray
    running: np.ndarray
    reads_prefix: np.ndarray
    sampling: SamplingParams
    refill_at: int
    num_rows: int
    row_steps: int = 0

    @property
    def rows(self) -> int:
        """The decode's rows: the episodes' (num_rows), padding and spare ones."""
        return self.budgets.shape[0]

    @property
    def steps(self) -> int:
        """The decode's token columns: the longest turn's budget, bucketed."""
        return bucket(self.sampling.max_new_tokens, 16)

    def chunk_start(self) -> np.ndarray:
        """[B] the position of each row's next chunk (after its pending token)."""
        return np.asarray(self.carry.next_position) + 1


def start(sampler, prompts: Sequence[ModelInputs], num_samples: int, *, sampling: SamplingParams, seed: int,
          row_ids: Sequence[int] | None, reserve: Sequence[tuple[int, int]], shape: PromptShape,
          refill_at: int, spare_rows: int = 0) -> Turns:
    """`Sampler.start_turns` (see there) on `sampler`."""
    if sampler.decode_kernel is not None:
        raise ValueError("start_turns: SamplerConfig.decode_cache='paged' copies the caches into pages once per "
                         "decode call; a refilled decode runs on the contiguous caches")
    if refill_at < 0:
        raise ValueError(f"start_turns: refill_at={refill_at} must be >= 0 (0: a quarter of the rows)")
    if not 0 <= int(seed) < 2**32:
        raise ValueError(f"seed={seed} must be in [0, 2**32)")
    if spare_rows < 0:
        raise ValueError(f"start_turns: spare_rows={spare_rows} must be >= 0")
    prefix, logits, suffix, next_position, budgets, total = sampler.prompt_rows(
        prompts, num_samples, sampling, reserve, shape, spare_prompts=-(-spare_rows // max(num_samples, 1)))
    rows = budgets.shape[0]
    streams = np.arange(rows, dtype=np.int64)
    if row_ids is not None:
        if len(row_ids) != total:
            raise ValueError(f"row_ids: {len(row_ids)} ids for {total} rows")
        streams[:total] = row_ids
    carry = DecodeCarry.start(budgets, bucket(sampling.max_new_tokens, 16), np.zeros(rows, np.int32), next_position)
    return Turns(prefix, suffix, logits, carry, np.full(rows, seed, np.uint32), streams, budgets, budgets > 0,
                 np.ones(rows, bool), sampling, refill_at or max(total // 4, 1), total)


def decode(sampler, state: Turns) -> list[TurnEnd]:
    """`Sampler.decode_turns`: the turns that ended, in row order ([] once no row is in a turn)."""
    rows = state.budgets.shape[0]
    if not state.running.any():
        return []
    keys = decode_program.row_keys(state.seeds, state.streams.astype(np.int32))  # per call: admit changes them
    plan = DecodePlan(sampler.cache_shardings(rows, state.suffix.capacity), sampler.backend,
                      sampler.config.decode_window, truncation=state.sampling.truncates, refill=True)
    while True:
        carry = state.carry  # on the host between calls (start, restart and each call below leave it there)
        stop = int(carry.done.sum()) + min(state.refill_at, int((~carry.done).sum()))
        inputs = DecodeInputs.of(state.logits, state.budgets, keys, state.sampling, state.steps, stop,
                                 state.reads_prefix)
        out, state.suffix = decode_program.decode(sampler.graphdef, sampler.params, sampler.weights, state.suffix,
                                                  state.prefix, inputs, carry, plan)
        state.carry = jax.tree.map(np.asarray, out)  # one transfer a call: the host reads it below
        state.row_steps += rows * int(state.carry.step - carry.step)
        ended = np.flatnonzero(state.carry.done & state.running)
        if ended.size:
            break
        # no turn ended: a row that samples reached the suffix's last slot; grow it (at most double)
        left = int(np.max(np.where(state.carry.done, 0, state.budgets - state.carry.n_gen)))
        state.suffix = sampler._grow(state.suffix, grown_capacity(state.suffix.capacity, left,
                                                                  sampler.config.cache_multiple))
        plan = dataclasses.replace(plan, sharding=sampler.cache_shardings(rows, state.suffix.capacity))
    c = state.carry
    state.running[ended] = False
    return [TurnEnd(int(b), c.tokens[b, :c.n_gen[b]].tolist(), c.logps[b, :c.n_gen[b]].copy(), bool(c.finished[b]))
            for b in ended]


def extend(sampler, state: Turns, chunks: dict[int, ModelInputs], budget: dict[int, int],
           seed: dict[int, int]) -> None:
    """`Sampler.extend_turns` (see there)."""
    if not chunks:
        return
    rows = state.budgets.shape[0]
    carry = state.carry
    n_gen, tokens, position = carry.n_gen, carry.tokens, carry.next_position
    full: list[ModelInputs | None] = [None] * rows
    for b, chunk in chunks.items():
        if not 0 <= b < state.rows or state.running[b] or n_gen[b] < 1:
            raise ValueError(f"extend_turns: row {b} has no ended turn to extend")
        if b not in budget or b not in seed or budget[b] < 1 or not 0 <= int(seed[b]) < 2**32:
            raise ValueError(f"extend_turns: row {b} needs a budget >= 1 and a seed in [0, 2**32)")
        full[b] = with_pending(chunk, int(tokens[b, n_gen[b] - 1]), int(position[b]), b, "extend_turns")
    check_budgets(state, [budget[b] for b in chunks], "extend_turns")
    index, takes = taking(rows, chunks)
    write = carry.write_index
    width = writes.write_width(sampler, full)
    capacity = turn_capacity(state.suffix.capacity, int(write[index].max()) + width, max(budget.values()),
                             sampler.config.cache_multiple)
    if capacity > state.suffix.capacity:
        state.suffix = sampler._grow(state.suffix, capacity)
    slots = np.where(takes, write, state.suffix.capacity).astype(np.int32)  # past the capacity: nothing written
    logits, state.suffix = writes.write_chunks(sampler, state.suffix, state.prefix, slots, full, width,
                                               state.reads_prefix)
    state.logits = programs.pick_rows(takes, logits, state.logits)
    state.carry = carry.restart(index, np.array([full[b].next_position for b in index], np.int32),
                                write[index] + np.array([full[b].length for b in index], np.int32))
    state.budgets[index] = [budget[b] for b in index]
    state.seeds[index] = [seed[b] for b in index]
    state.running[index] = True


def check_budgets(state: Turns, budgets: list[int], call: str) -> None:
    """Refuses a turn's budget beyond the decode's token columns."""
    if max(budgets) > state.steps:
        raise ValueError(f"{call}: a budget of {max(budgets)} tokens exceeds the decode's {state.steps} token "
                         f"columns (start_turns' sampling.max_new_tokens)")


def taking(rows: int, chosen) -> tuple[np.ndarray, np.ndarray]:
    """The rows in `chosen` (row -> anything) sorted, and as a [rows] mask."""
    index = np.array(sorted(chosen))
    takes = np.zeros(rows, bool)
    takes[index] = True
    return index, takes


def admit(sampler, state: Turns, prompts: dict[int, ModelInputs], budget: dict[int, int], seed: dict[int, int],
          stream: dict[int, int]) -> None:
    """`Sampler.admit_turns` (see there)."""
    if not prompts:
        return
    rows = state.budgets.shape[0]
    for b, prompt in prompts.items():
        if not 0 <= b < rows or state.running[b]:
            raise ValueError(f"admit_turns: row {b} is not a free row (rows 0..{rows - 1} not in a turn)")
        if b not in budget or b not in seed or b not in stream or budget[b] < 1 or not 0 <= int(seed[b]) < 2**32:
            raise ValueError(f"admit_turns: row {b} needs a budget >= 1, a seed in [0, 2**32) and a stream")
        if prompt.length < 1:
            raise ValueError(f"admit_turns: row {b}'s prompt is empty")
    check_budgets(state, [budget[b] for b in prompts], "admit_turns")
    index, takes = taking(rows, prompts)
    full = [prompts.get(b) for b in range(rows)]
    width = writes.write_width(sampler, full)
    capacity = turn_capacity(state.suffix.capacity, width, max(budget[b] for b in prompts),
                             sampler.config.cache_multiple)
    if capacity > state.suffix.capacity:
        state.suffix = sampler._grow(state.suffix, capacity)
    state.suffix = programs.forget_rows(state.suffix, takes, sampler.cache_shardings(rows, state.suffix.capacity))
    state.reads_prefix[index] = False
    slots = np.where(takes, 0, state.suffix.capacity).astype(np.int32)  # past the capacity: nothing written
    logits, state.suffix = writes.write_chunks(sampler, state.suffix, state.prefix, slots, full, width,
                                               state.reads_prefix)
    state.logits = programs.pick_rows(takes, logits, state.logits)
    state.carry = state.carry.restart(index, np.array([prompts[b].next_position for b in index], np.int32),
                                      np.array([prompts[b].length for b in index], np.int32))
    state.budgets[index] = [budget[b] for b in index]
    state.seeds[index] = [seed[b] for b in index]
    state.streams[index] = [stream[b] for b in index]
    state.running[index] = True
