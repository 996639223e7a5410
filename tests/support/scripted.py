"""A scripted stand-in for `paravt_jax.sampling.Sampler`, so that the rollout, the evaluation
driver and the RL step's phases are tested without compiling a model program.

What it scripts:
  * the policy's turns: every row of a main `generate` call (a prompt of the episode, rows
    prompt-major like the real sampler's: row p * num_samples + g) reads its own list of turn
    texts, the first at `generate`, the next one at each `extend` that gives the row a chunk.
    `script` is either a list of those lists, indexed by the row's place in the call, or a
    function (decoded prompt text, sample index g) -> the row's turns, for callers that run
    several main calls (the driver's batches) or should pick turns by the question;
  * the sub-agents: a `generate` call whose prompts are sub-agent prompts (they hold the crop's
    segment instruction, `chat.segment_instruction`) answers each with `summary`, a text or a
    function of the sub-agent prompt's text.

How it behaves like the real sampler (sampler.py): the call signatures are the real ones
(tests/unit/test_orchestration.py compares them with `inspect.signature`, so a change of the
real sampler's parameters breaks this fake loudly); each generated row is the script's text
encoded, followed by the first of `sampling.stop_ids` (the turn's end), cut at
`sampling.max_new_tokens` (then `finished` is False, as when the real decode runs out of its
budget); every generated token has log-prob `logprob`; rows without a chunk in an `extend`
generate nothing (budget 0). Positions are tracked as the real `SamplerState` tracks them: the
last sampled token is pending at `next_position`, a row's next chunk must start at
`chunk_start` (a chunk that starts elsewhere is refused with the real sampler's message), and
`extend` refuses a chunk list that does not have one entry per row. A row asked for a turn its
script does not have fails the test with the row and the turn.

Every call is recorded in `calls` (kind, rows, seed, row_ids, budget, prompt shape), which is
what tests read for batching, random streams and budgets.

The turns of a refilled rollout (`start_turns`, `decode_turns`, `extend_turns`, as the real
sampler's): `start_turns` records a "policy" call; `decode_turns` ends the `refill_at` rows in a
turn (1 by default) whose turn text is shortest (ties: the lower row), so that rows end out of
order and a row's next turn starts while others are in theirs; each `extend_turns` records one
"turn" call per row (rows 1, the row's seed, its stream, its budget); `admit_turns` gives a
free row (a spare one of `start_turns(spare_rows=)`, or one whose turns ended) a sub-agent
prompt, recorded as a "subagent" call of 1 row (its seed, its stream, its budget), whose
`summary` ends like a turn in `decode_turns`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from paravt_jax.sampling.calls import PromptShape, SampleOutput
from paravt_jax.sampling.params import SamplingParams
from paravt_jax.sampling.turns import TurnEnd
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs

# The opening words of every sub-agent prompt's instruction (the text after them varies).
SUBAGENT_MARK = chat.segment_instruction(0.0, 0.0).split("00:00")[0]
Script = Sequence[Sequence[str]] | Callable[[str, int], Sequence[str]]
WHOLE_CALL = PromptShape()  # generate's default: each call's own buckets


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of the fake: kind is "policy" (a main generate), "subagent" or "extend"."""
    kind: str
    rows: int  # rows the call generates for (those with a chunk, in an extend)
    seed: int
    row_ids: tuple[int, ...] | None
    max_new_tokens: int
    shape: PromptShape | None  # generate's prompt shape (None for an extend)


@dataclasses.dataclass(frozen=True)
class ScriptedState:
    """What the rollout reads of a SamplerState: the rows and where each row's next chunk
    starts. `scripts[b]` and `turn[b]`: row b's turns and how many it has generated."""
    num_rows: int
    next_position: np.ndarray  # [B] position of the pending token
    pending: np.ndarray  # [B] last sampled token, -1 when none
    scripts: tuple[tuple[str, ...], ...]
    turn: tuple[int, ...]

    @property
    def chunk_start(self) -> np.ndarray:
        return self.next_position + (self.pending >= 0)


@dataclasses.dataclass
class ScriptedTurns:
    """What the rollout reads of a sampling.turns.Turns (`chunk_start()`), and the rows' scripts:
    `texts[b]`: row b's turn in progress (None: none), started at `starts[b]` with `budgets[b]`."""
    num_rows: int
    next_position: np.ndarray
    scripts: tuple[tuple[str, ...], ...]
    turn: list[int]
    texts: list[str | None]
    starts: np.ndarray
    budgets: list[int]
    streams: list[int]
    sampling: SamplingParams
    refill_at: int

    @property
    def rows(self) -> int:
        return len(self.texts)

    def chunk_start(self) -> np.ndarray:
        return self.next_position + 1


class ScriptedSampler:
    """`ScriptedSampler(tokenizer, script, summary=...)`; `generate` and `extend` as the real
    Sampler's (see the module docstring)."""

    def __init__(self, tokenizer, script: Script, summary: str | Callable[[str], str] =
                 "a blue circle from 10 to 14 seconds", logprob: float = -0.5):
        self.tokenizer = tokenizer
        self.script = script
        self.summary = summary
        self.logprob = logprob
        self.calls: list[Call] = []

    # -- the real sampler's interface ----------------------------------------------------
    def generate(self, prompts: Sequence[ModelInputs], num_samples: int = 1, *,
                 sampling: SamplingParams = SamplingParams(), seed: int = 0,
                 row_ids: Sequence[int] | None = None, reserve: Sequence[tuple[int, int]] = (),
                 shape: PromptShape = WHOLE_CALL) -> tuple[SampleOutput, ScriptedState]:
        if not prompts:
            raise ValueError("generate: no prompts")
        if num_samples < 1:
            raise ValueError(f"generate: num_samples={num_samples} must be >= 1")
        texts = [self.tokenizer.decode(p.input_ids) for p in prompts]
        subagent = [SUBAGENT_MARK in t for t in texts]
        if any(subagent) and not all(subagent):
            raise AssertionError("one generate call mixes sub-agent and policy prompts")
        rows = len(prompts) * num_samples
        self._check_call(rows, seed, row_ids)
        self.calls.append(Call("subagent" if subagent[0] else "policy", rows, seed,
                               None if row_ids is None else tuple(row_ids), sampling.max_new_tokens, shape))
        if subagent[0]:
            turns = [[self.summary(texts[b // num_samples]) if callable(self.summary) else self.summary]
                     for b in range(rows)]
        else:
            turns = [list(self._turns(texts[b // num_samples], b, b % num_samples)) for b in range(rows)]
        for b, script in enumerate(turns):
            if not script:
                raise AssertionError(f"row {b}: its script has no turn")
        out = self._output([script[0] for script in turns], sampling)
        starts = np.array([prompts[b // num_samples].next_position for b in range(rows)], np.int64)
        return out, self._state(starts, out, tuple(map(tuple, turns)), (1,) * rows,
                                np.full(rows, -1, np.int64), np.zeros(rows, bool))

    def extend(self, state: ScriptedState, chunks: Sequence[ModelInputs | None], *,
               sampling: SamplingParams = SamplingParams(), seed: int = 0,
               row_ids: Sequence[int] | None = None) -> tuple[SampleOutput, ScriptedState]:
        if len(chunks) != state.num_rows:
            raise ValueError(f"extend: {len(chunks)} chunks for {state.num_rows} rows")
        takes_part = np.array([c is not None for c in chunks])
        self._check_call(state.num_rows, seed, row_ids)
        for b, chunk in enumerate(chunks):  # refused before anything is generated or recorded
            if chunk is not None and chunk.length and int(chunk.position_ids.min()) != int(state.chunk_start[b]):
                raise ValueError(f"extend: row {b} chunk starts at position {int(chunk.position_ids.min())}, "
                                 f"expected {int(state.chunk_start[b])}")
            if chunk is not None and state.turn[b] >= len(state.scripts[b]):
                raise AssertionError(f"row {b}: turn {state.turn[b] + 1} asked, its script has "
                                     f"{len(state.scripts[b])}")
        self.calls.append(Call("extend", int(takes_part.sum()), seed, None if row_ids is None else tuple(row_ids),
                               sampling.max_new_tokens, None))
        texts = [None if chunk is None else state.scripts[b][state.turn[b]] for b, chunk in enumerate(chunks)]
        turn = tuple(t + int(part) for t, part in zip(state.turn, takes_part))
        starts = np.array([state.next_position[b] if chunk is None else chunk.next_position
                           for b, chunk in enumerate(chunks)], np.int64)
        out = self._output(texts, sampling)
        return out, self._state(starts, out, state.scripts, turn, state.pending, ~takes_part)

    def start_turns(self, prompts: Sequence[ModelInputs], num_samples: int = 1, *,
                    sampling: SamplingParams = SamplingParams(), seed: int = 0,
                    row_ids: Sequence[int] | None = None, reserve: Sequence[tuple[int, int]] = (),
                    shape: PromptShape = WHOLE_CALL, refill_at: int = 0, spare_rows: int = 0) -> ScriptedTurns:
        _, state = self.generate(prompts, num_samples, sampling=sampling, seed=seed, row_ids=row_ids,
                                 reserve=reserve, shape=shape)
        rows, spare = state.num_rows, [None] * spare_rows
        starts = np.array([prompts[b // num_samples].next_position for b in range(rows)] + [0] * spare_rows, np.int64)
        return ScriptedTurns(rows, np.zeros(rows + spare_rows, np.int64), state.scripts + ((),) * spare_rows,
                             [0] * (rows + spare_rows), [script[0] for script in state.scripts] + spare, starts,
                             [sampling.max_new_tokens] * rows + [0] * spare_rows,
                             (list(row_ids) if row_ids is not None else list(range(rows))) + [0] * spare_rows,
                             sampling, refill_at or 1)

    def decode_turns(self, state: ScriptedTurns) -> list[TurnEnd]:
        running = [b for b in range(state.rows) if state.texts[b] is not None]
        ending = sorted(sorted(running, key=lambda b: (len(state.texts[b]), b))[:state.refill_at])
        ends = []
        for b in ending:
            out = self._output([state.texts[b]], state.sampling.with_budget(state.budgets[b]))
            ends.append(TurnEnd(b, out.tokens[0], out.logprobs[0], bool(out.finished[0])))
            state.next_position[b] = state.starts[b] + len(out.tokens[0]) - 1
            state.turn[b] += 1
            state.texts[b] = None
        return ends

    def extend_turns(self, state: ScriptedTurns, chunks: dict[int, ModelInputs], *, budget: dict[int, int],
                     seed: dict[int, int]) -> None:
        for b, chunk in chunks.items():
            if state.texts[b] is not None:
                raise ValueError(f"extend_turns: row {b} has no ended turn to extend")
            if chunk.length and int(chunk.position_ids.min()) != int(state.chunk_start()[b]):
                raise ValueError(f"extend_turns: row {b} chunk starts at position {int(chunk.position_ids.min())}, "
                                 f"expected {int(state.chunk_start()[b])}")
            if state.turn[b] >= len(state.scripts[b]):
                raise AssertionError(f"row {b}: turn {state.turn[b] + 1} asked, its script has "
                                     f"{len(state.scripts[b])}")
            self._check_call(1, seed[b], None)
            self.calls.append(Call("turn", 1, seed[b], (state.streams[b],), budget[b], None))
            state.texts[b], state.starts[b], state.budgets[b] = state.scripts[b][state.turn[b]], chunk.next_position, \
                budget[b]

    def admit_turns(self, state: ScriptedTurns, prompts: dict[int, ModelInputs], *, budget: dict[int, int],
                    seed: dict[int, int], stream: dict[int, int]) -> None:
        for b, prompt in prompts.items():
            if not 0 <= b < state.rows or state.texts[b] is not None:
                raise ValueError(f"admit_turns: row {b} is not a free row (rows 0..{state.rows - 1} not in a turn)")
            text = self.tokenizer.decode(prompt.input_ids)
            if SUBAGENT_MARK not in text:
                raise AssertionError(f"admit_turns: row {b} was given a policy prompt; the fake scripts sub-agents")
            self._check_call(1, seed[b], None)
            self.calls.append(Call("subagent", 1, seed[b], (stream[b],), budget[b], None))
            state.texts[b] = self.summary(text) if callable(self.summary) else self.summary
            state.starts[b], state.budgets[b], state.streams[b] = prompt.next_position, budget[b], stream[b]

    # -- internals ------------------------------------------------------------------------
    def _turns(self, prompt_text: str, row: int, sample: int) -> Sequence[str]:
        if callable(self.script):
            return self.script(prompt_text, sample)
        if row >= len(self.script):
            raise AssertionError(f"row {row} of a policy call: the script has {len(self.script)} rows")
        return self.script[row]

    @staticmethod
    def _check_call(rows: int, seed: int, row_ids) -> None:
        if row_ids is not None and len(row_ids) != rows:
            raise ValueError(f"row_ids: {len(row_ids)} ids for {rows} rows")
        if not 0 <= int(seed) < 2**32:
            raise ValueError(f"seed={seed} must be in [0, 2**32)")

    def _output(self, texts: Sequence[str | None], sampling: SamplingParams) -> SampleOutput:
        """Each text's tokens and the stop token, cut at the budget (None: nothing generated)."""
        tokens = []
        for text in texts:
            if text is None:
                tokens.append([])
                continue
            ids = self.tokenizer.encode(text) + list(sampling.stop_ids[:1])
            tokens.append(ids[:sampling.max_new_tokens])
        finished = np.array([bool(t) and t[-1] in sampling.stop_ids for t in tokens])
        return SampleOutput(tokens, [np.full(len(t), self.logprob, np.float32) for t in tokens], finished,
                            np.array([len(t) for t in tokens]))

    @staticmethod
    def _state(starts: np.ndarray, out: SampleOutput, scripts, turn, pending_before: np.ndarray,
               keep: np.ndarray) -> ScriptedState:
        """The state after a call: a row that generated n tokens from `starts` has its last one
        pending at starts + n - 1; rows in `keep` (no chunk this call) keep their pending token."""
        lengths = np.asarray(out.lengths, np.int64)
        last = np.array([t[-1] if t else -1 for t in out.tokens], np.int64)
        generated = lengths > 0
        next_position = np.where(generated, starts + lengths - 1, starts)
        pending = np.where(keep, pending_before, np.where(generated, last, -1))
        next_position = np.where(keep, starts, next_position)
        return ScriptedState(len(out.tokens), next_position, pending, scripts, turn)
