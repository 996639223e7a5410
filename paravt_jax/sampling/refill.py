"""A refilled decode's host side (`Sampler.sample_queued`): many single-turn prompts through a
few decode rows, a row taking the next waiting prompt as its sample ends (DecodePlan.refill:
each row its own suffix slots and token columns), the next prompts prefilled as a call of the
same fixed shape and moved into the freed rows (programs.admit_rows)."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from paravt_jax.infra.buckets import bucket
from paravt_jax.sampling import decode as decode_program
from paravt_jax.sampling import programs
from paravt_jax.sampling.calls import PromptShape, SampleOutput, call_rows, call_width
from paravt_jax.sampling.decode import DecodeCarry, DecodeInputs, DecodePlan
from paravt_jax.sampling.kv_cache import episode_capacity
from paravt_jax.sampling.params import SamplingParams
from paravt_jax.text.inputs import ModelInputs


@dataclasses.dataclass
class Rows:
    """Which prompt each decode row samples (-1: none), its random stream and its budget."""
    owner: np.ndarray
    stream: np.ndarray
    budgets: np.ndarray

    @staticmethod
    def empty(rows: int) -> Rows:
        return Rows(np.full(rows, -1), np.zeros(rows, np.int64), np.zeros(rows, np.int32))


@dataclasses.dataclass
class Samples:
    """Each prompt's sample as its row ends: tokens, log-probs, whether a stop id ended it."""
    tokens: list
    logprobs: list
    finished: np.ndarray

    @staticmethod
    def of(prompts: int) -> Samples:
        return Samples([None] * prompts, [None] * prompts, np.zeros(prompts, bool))

    def collect(self, carry: DecodeCarry, rows: Rows) -> None:
        """Takes the samples of the rows that ended since the last call and frees those rows."""
        ended = np.flatnonzero(np.asarray(carry.done) & (rows.owner >= 0))
        if not ended.size:
            return
        n_gen, tokens, logps, hit = (np.asarray(a) for a in (carry.n_gen, carry.tokens, carry.logps, carry.finished))
        for b in ended:
            i = rows.owner[b]
            self.tokens[i], self.logprobs[i] = tokens[b, :n_gen[b]].tolist(), logps[b, :n_gen[b]].copy()
            self.finished[i] = hit[b]
        rows.owner[ended] = -1
        rows.budgets[ended] = 0


def check_arguments(sampler, prompts: Sequence[ModelInputs], slots: int, seed: int, row_ids, refill_at: int
                    ) -> list[int]:
    """Refuses what a refilled call cannot run; returns each prompt's row id."""
    if not prompts:
        raise ValueError("sample_queued: no prompts")
    if slots < 1 or refill_at < 0:
        raise ValueError(f"sample_queued: slots={slots} must be >= 1 and refill_at={refill_at} >= 0")
    if sampler.decode_kernel is not None:
        raise ValueError("sample_queued: SamplerConfig.decode_cache='paged' copies the caches into pages "
                         "once per decode call; a refilled decode runs on the contiguous caches")
    ids = list(range(len(prompts))) if row_ids is None else [int(i) for i in row_ids]
    if len(ids) != len(prompts):
        raise ValueError(f"row_ids: {len(ids)} ids for {len(prompts)} prompts")
    if not 0 <= int(seed) < 2**32:
        raise ValueError(f"seed={seed} must be in [0, 2**32)")
    return ids


def sample_queued(sampler, prompts: Sequence[ModelInputs], slots: int, *, sampling: SamplingParams, seed: int,
                  row_ids: Sequence[int] | None, shape: PromptShape, refill_at: int) -> SampleOutput:
    """`Sampler.sample_queued` (see there) on `sampler`."""
    ids = check_arguments(sampler, prompts, slots, seed, row_ids, refill_at)
    config = sampler.config
    count = call_rows(slots, shape, config.min_batch_bucket)
    refill_at = refill_at or max(count // 4, 1)
    width = call_width(prompts, shape, config.min_chunk_bucket)
    budget = sampling.max_new_tokens
    capacity = episode_capacity([(0, budget)], config.min_chunk_bucket, config.cache_multiple)
    steps = bucket(budget, 16)
    rows, samples = Rows.empty(count), Samples.of(len(prompts))
    carry = DecodeCarry.start(rows.budgets, steps, np.zeros(count, np.int32), np.zeros(count, np.int32))
    queue = list(range(len(prompts)))[::-1]  # popped from the end: prompt order
    prefix = suffix = logits = keys = None
    plan = DecodePlan(sampler.cache_shardings(count, capacity), sampler.backend, config.decode_window,
                      truncation=sampling.truncates, refill=True)
    while True:
        free = np.flatnonzero(rows.owner < 0)
        admitted = [queue.pop() for _ in range(min(len(free), len(queue)))]
        if admitted:  # the next prompts prefilled at the call's shape and moved into free rows
            target = free[:len(admitted)]
            fresh_logits, fresh = sampler.prompt_prefill([prompts[i] for i in admitted], count, width,
                                                         shape.frames_per_row)
            if prefix is None:  # the first prefill: every row free, the prompts in row order
                prefix, logits, suffix = fresh, fresh_logits, sampler.empty_cache(count, capacity)
            else:
                index = np.full(count, count, np.int32)
                index[:len(admitted)] = target
                prefix, suffix, logits = programs.admit_rows(prefix, suffix, logits, fresh, fresh_logits, index,
                                                             sampler.cache_shardings(count, width), plan.sharding)
            rows.owner[target], rows.budgets[target] = admitted, budget
            rows.stream[target] = [ids[i] for i in admitted]
            keys = decode_program.row_keys(np.uint32(seed), rows.stream)  # only when the rows' prompts change
            carry = carry.restart(target, np.array([prompts[i].next_position for i in admitted], np.int32))
        if (rows.owner < 0).all():
            break
        # decode until refill_at more rows are free (while prompts wait), else until every row is done
        stop_when_done = int((rows.owner < 0).sum()) + min(refill_at, len(queue)) if queue else count + 1
        inputs = DecodeInputs.of(logits, rows.budgets, keys, sampling, steps, stop_when_done)
        carry, suffix = decode_program.decode(sampler.graphdef, sampler.params, sampler.weights, suffix, prefix,
                                              inputs, carry, plan)
        samples.collect(carry, rows)
    return SampleOutput(tokens=samples.tokens, logprobs=samples.logprobs, finished=samples.finished,
                        lengths=np.array([len(t) for t in samples.tokens], np.int32),
                        row_steps=count * int(carry.step))
