"""One row of a rollout batch while it is generated: its token sequence so far, log-probs, turns,
calls, errors and sub-agent trajectories (`Row`, which `finish` turns into a `Rollout`), and
what one tool round gives it: the calls it asked (`RowCalls`) and each executed call's answer
(`Answer`). The loop over all rows is agent/rollout.py's `RolloutLoop`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from paravt_jax.agent.dispatch import CropResult, CropTask
from paravt_jax.agent.protocol import ToolProtocol
from paravt_jax.agent.records import CallRecord, Episode, Rollout, SubTrajectory
from paravt_jax.agent.tools import CropRequest, cap_errors, lenient_window, parse_tool_calls
from paravt_jax.models.qwen3_vl.rope import IMAGE, VIDEO
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs, encode_ids
from paravt_jax.text.tokenizer import Tokenizer

ANSWER_TAGS = ("<answer>", "</answer>")


@dataclasses.dataclass(frozen=True)
class RowCalls:
    """One row's part of a tool round: the crops it runs (its first max_parallel calls) and
    the errors of its turn (malformed blocks, calls beyond max_parallel), uncapped."""
    row: int
    tasks: tuple[CropTask, ...]
    errors: tuple[str, ...]

    def error_responses(self, cap: int) -> list[str]:
        """The errors as their tool responses read, at most `cap` (`tools.cap_errors`)."""
        return [f"Error: {e}" for e in cap_errors(list(self.errors), cap)]


@dataclasses.dataclass(frozen=True)
class Answer:
    """One executed crop answered: the dispatcher's result, the tool-response body (a sub-agent
    summary, a timestamped frames body, or a whole images_first message), the response text
    the episode log keeps, and the sub-agent's trajectory (subagent mode, crop read)."""
    result: CropResult
    body: str | list | chat.Message
    caption: str
    trajectory: SubTrajectory | None = None


@dataclasses.dataclass
class Row:
    """One rollout being generated: row `index` of the batch, sample `sample` of `episode`."""
    index: int
    episode: Episode
    sample: int
    inputs: ModelInputs
    # The row's random stream: its place in the step's batch (skipped episodes keep their slots).
    stream: int
    duration: float  # the episode video's, which the crops are validated against
    overview_times: tuple[float, ...] = ()
    prefix: str = ""  # the forced start of the turn being generated
    calls: list[int] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    subagents: list[SubTrajectory] = dataclasses.field(default_factory=list)
    turn_texts: list[str] = dataclasses.field(default_factory=list)
    call_records: list[CallRecord] = dataclasses.field(default_factory=list)
    turns: int = 0
    active: bool = True
    truncated: bool = False
    prompt_length: int = dataclasses.field(init=False)
    logprobs: list[np.ndarray] = dataclasses.field(init=False)  # per piece of `inputs`

    def __post_init__(self):
        self.prompt_length = self.inputs.length
        self.logprobs = [np.zeros(self.prompt_length, np.float32)]  # the prompt's: nothing sampled

    def add_generated(self, tokens: list[int], logprobs: np.ndarray, finished: bool, tokenizer: Tokenizer):
        """Appends the turn just generated (its text after the turn's forced prefix)."""
        self.inputs = self.inputs.extend(encode_ids(tokens, self.inputs.next_position, trainable=True))
        self.logprobs.append(np.asarray(logprobs, np.float32))
        self.turn_texts.append(self.prefix + tokenizer.decode(tokens))
        self.turns += 1
        self.truncated = not finished

    def read_calls(self, text: str, protocol: ToolProtocol, max_parallel: int) -> RowCalls | None:
        """The tool round of this row's turn `text`, recorded: crop tasks for its first
        max_parallel calls and its errors (malformed blocks and calls beyond max_parallel, each
        unless the protocol ignores them). None, and the row done, when there is nothing to
        respond to (or the episode offers no tools)."""
        if not self.episode.tools:  # a tool-free prompt: its one turn is the episode
            self.active = False
            return None
        parsed = parse_tool_calls(text, all_or_nothing=protocol.malformed == "reference")
        errors = list(parsed.errors) if protocol.malformed == "respond" else []
        if not parsed.calls and not errors:
            self.active = False
            return None
        if protocol.extra_calls == "respond":
            errors += [f"call {number} was not executed: at most {max_parallel} tool calls run per turn"
                       for number in range(max_parallel + 1, len(parsed.calls) + 1)]
        tasks = tuple(CropTask(self.index, k, self.episode.video_path, self.duration, call)
                      for k, call in enumerate(parsed.calls[:max_parallel]))
        self.errors += errors
        self.calls.append(len(tasks))
        return RowCalls(self.index, tasks, tuple(errors))

    def add_answer(self, answer: Answer):
        """Records one executed call's answer (its error, sub-agent trajectory and log record)."""
        result = answer.result
        if not result.ok:
            self.errors.append(result.error)
        if answer.trajectory is not None:
            self.subagents.append(answer.trajectory)
        self.call_records.append(call_record(result, self.turns - 1, answer.caption))

    def add_chunk(self, chunk: ModelInputs, prefix: str):
        """Appends the round's tool responses (nothing sampled) ending in the next turn's
        forced `prefix`."""
        self.inputs = self.inputs.extend(chunk)
        self.logprobs.append(np.zeros(chunk.length, np.float32))
        self.prefix = prefix

    def finish(self, tokenizer: Tokenizer) -> Rollout:
        inputs = self.inputs
        logprobs = np.concatenate(self.logprobs)
        assert len(logprobs) == inputs.length, (len(logprobs), inputs.length)
        return Rollout(
            episode=self.episode, sample=self.sample, inputs=inputs, logprobs=logprobs,
            structural_mask=structural_positions(inputs.input_ids, inputs.loss_mask, tokenizer),
            prompt_length=self.prompt_length,
            completion=completion_text(inputs, self.prompt_length, tokenizer),
            generated_text=tokenizer.decode(inputs.input_ids[inputs.loss_mask == 1]),
            turn_texts=tuple(self.turn_texts),
            calls_per_turn=tuple(self.calls), turns=self.turns, errors=tuple(self.errors),
            subagents=tuple(self.subagents), truncated=self.truncated, overview_times=self.overview_times,
            calls=tuple(self.call_records))


def call_record(result: CropResult, turn: int, response: str) -> CallRecord:
    """The episode log's record of one executed call (`CallRecord`)."""
    request = result.request
    cut = isinstance(request, CropRequest)  # another tool's request is no window
    return CallRecord(turn=turn, asked=lenient_window(result.task.call),
                      window=(float(request.start), float(request.end)) if cut else None,
                      frame_times=() if result.clip is None else tuple(round(float(t), 3)
                                                                      for t in result.clip.timestamps),
                      response=response)


def structural_positions(ids: np.ndarray, generated: np.ndarray, tokenizer: Tokenizer) -> np.ndarray:
    """Mask of structural-tag tokens inside generated text. Single-token tags match by id;
    multi-token tags (`<answer>`, `</answer>` in Qwen's vocabulary) by character spans."""
    sp = tokenizer.special
    mask = np.isin(ids, np.array(sp.structural)) & generated.astype(bool)
    pieces = [tokenizer.decode([int(t)]) if g else "" for t, g in zip(ids, generated)]
    text = "".join(pieces)
    starts = np.cumsum([0] + [len(p) for p in pieces])
    for tag in ANSWER_TAGS:
        begin = text.find(tag)
        while begin >= 0:
            end = begin + len(tag)
            mask |= (starts[:-1] < end) & (starts[1:] > begin) & generated.astype(bool)
            begin = text.find(tag, end)
    return mask.astype(np.int32)


def completion_text(inputs: ModelInputs, start: int, tokenizer: Tokenizer) -> str:
    """The decoded text after position `start`, images and video left out."""
    ids = inputs.input_ids[start:]
    keep = ~np.isin(inputs.mm_token_type_ids[start:], (IMAGE, VIDEO))
    return tokenizer.decode(ids[keep])
