"""The multi-turn agent rollout: generate, parse the turn's tool calls, run every crop of
every row concurrently, answer them (sub-agent summaries or the frames themselves), extend
each row's cache with its tool responses and generate again, up to `max_turns` rounds.

Each finished row becomes one `Rollout`: the whole token sequence with its model inputs,
behaviour log-probs, the loss mask (1 only on policy-generated tokens), the structural-token
mask, the completion text for the rewards, and per-episode metadata.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from paravt_jax.agent.dispatch import CropDispatcher, CropResult, CropTask, DispatchConfig
from paravt_jax.agent.protocol import THINK_PREFIX, PromptFormat, ToolProtocol
from paravt_jax.agent.responses import frames_responses, images_first_messages, subagent_prompt, summary_text
from paravt_jax.agent.tools import CropRequest, cap_errors, lenient_window, parse_tool_calls
from paravt_jax.config import checked, integer, one_of, set_by, validate
from paravt_jax.models.qwen3_vl.rope import IMAGE, VIDEO
from paravt_jax.sampling.params import SamplingParams
from paravt_jax.sampling.sampler import PromptShape, SampleOutput, Sampler
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs, encode, encode_ids
from paravt_jax.text.tokenizer import Tokenizer
from paravt_jax.video.frames import FACTOR
from paravt_jax.video.reader import Clip, VideoError, read_frames, read_video_item

MODES = ("subagent", "frames", "sequential")
ANSWER_TAGS = ("<answer>", "</answer>")


@dataclasses.dataclass(frozen=True)
class Episode:
    episode_id: str
    question: str
    answer: str
    question_type: str
    video_path: str  # the episode's own video: the only file any crop may open
    nframes: int = 64  # K overview frames (nFrames gating decides it); 0: sampled at PromptFormat.overview_fps
    system_prompt: str = ""  # the data row's own system message ("" = none)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """One episode: its mode, budgets and sampling, its prompt's layout (`prompt`) and its tool
    protocol (`protocol`; agent/protocol.py, training() by default)."""
    mode: str = checked("subagent", one_of(MODES))
    max_turns: int = checked(3, integer(0))  # tool rounds
    max_new_tokens: int = checked(512, integer(1))  # per assistant turn
    # the summary budget; a summary cut there ends in " [truncated]"
    subagent_max_tokens: int = checked(512, integer(1))
    temperature: float = set_by(0.7, "rl.step.temperature: rollouts sample at the log-prob temperature")
    top_p: float = 1.0
    top_k: int = 0
    prompt: PromptFormat = PromptFormat.training()
    protocol: ToolProtocol = ToolProtocol.training()
    seed: int = set_by(0, "the run's seed and the step index")
    # Index of this call's first row in the whole step's batch (multi-host: the rows of the
    # processes before this one). Random streams follow a row's place in the step's batch, not
    # in this call, so splitting the episodes over processes samples the same rollouts.
    row_offset: int = set_by(0, "this process's share of the step's prompts")
    # Fixed prompt-prefill sizes of the episodes' prompts and of the sub-agent calls (which
    # then run in batches of subagent_shape.rows); zeros: each call's own buckets.
    prompt_shape: PromptShape = set_by(PromptShape(), "rl.shapes")
    subagent_shape: PromptShape = set_by(PromptShape(), "rl.shapes")

    def __post_init__(self):
        validate(self)


@dataclasses.dataclass(frozen=True)
class SubTrajectory:
    """One sub-agent call: its prompt + summary (loss mask on the summary) and log-probs."""
    row: int
    inputs: ModelInputs
    logprobs: np.ndarray


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One executed call as the episode log keeps it: the assistant turn that made it, the
    window as the call reads (`tools.lenient_window`; the model's numbers, any size), the window
    the dispatcher cut (validated and clamped; None when the call was refused or named another
    tool than crop_video), the source timestamps of the crop's frames (references into the
    episode's video, not pixels) and the tool response's text (the sub-agent summary, the
    frames' caption, a text tool's answer, or the error)."""
    turn: int
    asked: tuple[float, float]
    window: tuple[float, float] | None
    frame_times: tuple[float, ...]
    response: str


@dataclasses.dataclass(frozen=True)
class Rollout:
    episode: Episode
    sample: int  # 0..G-1
    inputs: ModelInputs  # the whole sequence; inputs.loss_mask is 1 on generated tokens only
    logprobs: np.ndarray  # [L] behaviour log-probs, 0 where loss_mask is 0
    # [L] 1 on generated <think> </think> <tool_call> </tool_call> <answer> </answer> tokens
    structural_mask: np.ndarray
    prompt_length: int
    completion: str  # everything after the prompt (turns and tool responses)
    generated_text: str  # only the policy-generated tokens: what the released reward code scores
    # Every assistant turn as the model's context shows it: the turn's forced prefix (e.g. the
    # "<think>\n" of think_prefix, which is prompt, not generated) followed by its generated
    # tokens; tool responses and chat template excluded. What the format and anchor rewards read.
    turn_texts: tuple[str, ...]
    calls_per_turn: tuple[int, ...]
    turns: int  # assistant turns generated
    errors: tuple[str, ...]  # parse, validation, decode and overflow errors, in order
    subagents: tuple[SubTrajectory, ...]
    truncated: bool  # the last turn hit its token budget without a stop token
    overview_times: tuple[float, ...] = ()  # source timestamps of the K overview frames
    calls: tuple[CallRecord, ...] = ()  # every executed call, in order (the episode log's)

    @property
    def nframes(self) -> int:
        return self.episode.nframes

    @property
    def num_tool_calls(self) -> int:
        return int(sum(self.calls_per_turn))

    @property
    def assistant_text(self) -> str:
        """The assistant turns, concatenated in order (see `turn_texts`)."""
        return "".join(self.turn_texts)


# ----------------------------------------------------------------------------- helpers
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
    ids = inputs.input_ids[start:]
    keep = ~np.isin(inputs.mm_token_type_ids[start:], (IMAGE, VIDEO))
    return tokenizer.decode(ids[keep])


@dataclasses.dataclass
class _Row:
    """One rollout being generated (the mutable record `_finish` turns into a `Rollout`)."""
    episode: Episode
    sample: int
    inputs: ModelInputs
    logprobs: list[np.ndarray]
    prompt_length: int
    # The row's random stream: its place in the step's batch (skipped episodes keep their slots).
    stream: int
    duration: float  # the episode video's, which the crops are validated against
    calls: list[int] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    subagents: list[SubTrajectory] = dataclasses.field(default_factory=list)
    turn_texts: list[str] = dataclasses.field(default_factory=list)
    call_records: list[CallRecord] = dataclasses.field(default_factory=list)
    overview_times: tuple[float, ...] = ()
    prefix: str = ""  # the forced start of the turn being generated
    turns: int = 0
    active: bool = True
    truncated: bool = False

    def add_generated(self, tokens: list[int], logprobs: np.ndarray, finished: bool, tokenizer: Tokenizer):
        self.inputs = self.inputs.extend(encode_ids(tokens, self.inputs.next_position, trainable=True))
        self.logprobs.append(np.asarray(logprobs, np.float32))
        self.turn_texts.append(self.prefix + tokenizer.decode(tokens))
        self.turns += 1
        self.truncated = not finished

    def add_calls(self, calls: _RowCalls):
        self.errors += calls.errors
        self.calls.append(len(calls.tasks))

    def add_answer(self, answer: _Answer):
        result = answer.result
        if not result.ok:
            self.errors.append(result.error)
        if answer.trajectory is not None:
            self.subagents.append(answer.trajectory)
        self.call_records.append(call_record(result, self.turns - 1, answer.caption))

    def add_chunk(self, chunk: ModelInputs):
        self.inputs = self.inputs.extend(chunk)
        self.logprobs.append(np.zeros(chunk.length, np.float32))


@dataclasses.dataclass(frozen=True)
class _RowCalls:
    """One row's part of a tool round: the crops it runs (its first max_parallel calls) and
    the errors of its turn (malformed blocks, calls beyond max_parallel), uncapped."""
    row: int
    tasks: tuple[CropTask, ...]
    errors: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class _Answer:
    """One executed crop answered: the dispatcher's result, the tool-response body (a sub-agent
    summary, a timestamped frames body, or a whole images_first message), the response text
    the episode log keeps, and the sub-agent's trajectory (subagent mode, crop read)."""
    result: CropResult
    body: str | list | chat.Message
    caption: str
    trajectory: SubTrajectory | None = None


@dataclasses.dataclass(frozen=True)
class _Context:
    """What every round of one `run_rollouts` call uses."""
    sampler: Sampler
    tokenizer: Tokenizer
    config: RolloutConfig
    dispatcher: CropDispatcher
    max_parallel: int  # calls executed per turn (1 in sequential mode)


# ----------------------------------------------------------------------------- engine
def prompt_inputs(episode: Episode, clip: Clip, tokenizer: Tokenizer, prompt: PromptFormat,
                  schemas: Sequence[dict] | None = None) -> ModelInputs:
    """The episode's ParaVT prompt over its overview `clip`: system message (the tools'
    `schemas`; None: crop_video's in the prompt's layout), the frames (timestamped or bare, or
    one video item), the question with the video-path line, and the generation prompt with the
    turn's forced prefix."""
    if schemas is None:
        schemas = (chat.crop_video_tool(layout=prompt.tool_layout),)
    tools = tuple(schemas) if prompt.tools else ()
    if prompt.system_prompt is not None:
        tools, system = (), prompt.system_prompt
    else:
        system = episode.system_prompt
    video_name = os.path.basename(episode.video_path) if prompt.tools else None
    stamped = prompt.overview_timestamps or prompt.overview_visual == "video"
    messages = chat.paravt_messages(episode.question, clip.frames, clip.timestamps if stamped else None,
                                    video_name=video_name, tools=tools, system_text=system,
                                    video_path_line=prompt.video_path_line, visual=prompt.overview_visual)
    return encode(chat.render(messages, add_generation_prompt=True, assistant_prefix=turn_prefix(prompt)),
                  tokenizer)


def response_chunk(bodies: Sequence, errors: Sequence[str], truncated: bool, prefix: str,
                   instruction: str, config: RolloutConfig, tokenizer: Tokenizer,
                   start_position: int) -> ModelInputs:
    """The chunk appended to a row after a tool round: the end of the assistant turn (its
    `<|im_end|>` too when the turn was cut at its budget), one tool-response user turn per
    executed call (`bodies`: sub-agent summaries, frames-mode bodies, or whole images_first
    messages) and per error, an optional user instruction, and the next generation prompt
    with its forced `prefix`."""
    if config.mode != "subagent" and config.protocol.frames_response == "images_first":
        messages = list(bodies) + chat.tool_response_messages(errors)
    else:
        messages = chat.tool_response_messages(list(bodies) + list(errors))
    if instruction:
        messages.append(chat.Message.of("user", instruction))
    close = "<|im_end|>\n" if truncated else "\n"
    segments = [chat.Text(close)] + chat.render(messages, add_generation_prompt=True, assistant_prefix=prefix)
    return encode(segments, tokenizer, start_position=start_position)


def overview_prompts(episodes: Sequence[Episode], tokenizer: Tokenizer, prompt: PromptFormat,
                     pool, schemas: Sequence[dict] | None = None
                     ) -> tuple[list[ModelInputs | None], list[str | None], list[float], list[tuple]]:
    """Reads every episode's K overview frames concurrently and builds its ParaVT prompt
    (`prompt_inputs`, listing the tools' `schemas`). Returns the prompts, the read errors, the
    videos' durations and the overview frames' source timestamps (None / an error / 0 / ()
    for an unreadable video)."""
    def build(ep: Episode):
        pixels = dict(min_pixels=prompt.overview_min_pixels, max_pixels=prompt.overview_max_pixels,
                      sizing=prompt.overview_sizing)
        if prompt.overview_visual == "video":
            clip = read_video_item(ep.video_path, prompt.overview_video_frames,
                                   prompt.overview_video_min_pixels, prompt.overview_video_max_pixels)
        elif ep.nframes > 0:
            clip = read_frames(ep.video_path, nframes=ep.nframes, **pixels)
        else:
            clip = read_frames(ep.video_path, fps=prompt.overview_fps, max_frames=prompt.overview_max_frames,
                               **pixels)
        times = tuple(round(float(t), 3) for t in clip.timestamps)
        return prompt_inputs(ep, clip, tokenizer, prompt, schemas), clip.metadata.duration, times

    prompts, errors, durations, timestamps = [], [], [], []
    for ep, future in [(ep, pool.submit(build, ep)) for ep in episodes]:
        try:
            inputs, duration, times = future.result()
            prompts.append(inputs)
            errors.append(None)
            durations.append(duration)
            timestamps.append(times)
        except (VideoError, ValueError) as e:
            prompts.append(None)
            errors.append(f"{ep.episode_id}: {e}")
            durations.append(0.0)
            timestamps.append(())
    return prompts, errors, durations, timestamps


def _responses_subagent(results: list[CropResult], sampler: Sampler, tokenizer: Tokenizer,
                        config: RolloutConfig, seed: int, stream_ids: Sequence[int] | None = None
                        ) -> tuple[list, list[SubTrajectory | None]]:
    """All sub-agent prompts of the turn (one per call answered with frames) in one batched
    sampler call (same weights), or in calls of config.subagent_shape.rows rows when set;
    stream_ids[i]: the random stream of results[i]'s summary (default: its place in the turn's
    crops), so the summaries do not depend on how the calls split them. A text tool's answer
    is its own response."""
    texts: list = [None] * len(results)
    trajectories: list[SubTrajectory | None] = [None] * len(results)
    ok = [i for i, r in enumerate(results) if r.ok and r.clip is not None]
    streams = list(range(len(results))) if stream_ids is None else list(stream_ids)
    size = config.subagent_shape.rows or max(len(ok), 1)
    for start in range(0, len(ok), size):
        part = ok[start:start + size]
        prompts = [subagent_prompt(results[i].clip, results[i].request.start, results[i].request.end, tokenizer)
                   for i in part]
        out, _ = sampler.generate(prompts, sampling=sampling_params(config, tokenizer, config.subagent_max_tokens),
                                  seed=seed, row_ids=[streams[i] for i in part], shape=config.subagent_shape)
        for j, i in enumerate(part):
            tokens = out.tokens[j]
            texts[i] = summary_text(tokens, bool(out.finished[j]), tokenizer)
            seq = prompts[j].extend(encode_ids(tokens, prompts[j].next_position, trainable=True))
            logps = np.concatenate([np.zeros(prompts[j].length, np.float32), out.logprobs[j]])
            trajectories[i] = SubTrajectory(results[i].task.row, seq, logps)
    for i, r in enumerate(results):
        if not r.ok:
            texts[i] = f"Error: {r.error}"
        elif r.clip is None:
            texts[i] = r.text
    return texts, trajectories


# Tokens of a tool response around its content (tags, the frames' text, chat markers), an
# upper bound: a reserve that falls short only makes an extend grow the suffix.
RESPONSE_TEXT_TOKENS, FRAME_TEXT_TOKENS = 64, 16


def response_tokens_bound(config: RolloutConfig, dispatch: DispatchConfig, max_parallel: int) -> int:
    """Most tokens one row's tool responses of one round can take: sub-agent summaries of
    subagent_max_tokens, or crops of max_frames frames at max_pixels."""
    if config.mode == "subagent":
        body = config.subagent_max_tokens
    else:
        body = dispatch.max_frames * (dispatch.max_pixels // FACTOR**2 + FRAME_TEXT_TOKENS)
    return max_parallel * (body + RESPONSE_TEXT_TOKENS) + RESPONSE_TEXT_TOKENS


def episode_turns(config: RolloutConfig, dispatch: DispatchConfig, max_parallel: int) -> list[tuple[int, int]]:
    """(chunk tokens, new tokens) of each extend of one episode at its longest (the
    sampler's `reserve`)."""
    if not config.prompt.tools:
        return []
    response = response_tokens_bound(config, dispatch, max_parallel)
    turns = [(response, config.max_new_tokens)] * config.max_turns
    if config.protocol.final_answer and turns:
        turns[-1] = (response, config.protocol.final_answer_tokens)
    return turns


def turn_prefix(prompt: PromptFormat) -> str:
    """The forced start of every assistant turn (except the final-answer turn)."""
    return THINK_PREFIX if prompt.think_prefix else ""


def sampling_params(config: RolloutConfig, tokenizer: Tokenizer, max_new_tokens: int) -> SamplingParams:
    """The sampler settings of every call (the policy's turns and the sub-agents): each turn
    ends at the end of its assistant message or after `max_new_tokens` tokens."""
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=config.temperature, top_p=config.top_p,
                          top_k=config.top_k, stop_ids=(tokenizer.special.im_end,))


def run_rollouts(sampler: Sampler, tokenizer: Tokenizer, episodes: Sequence[Episode],
                 num_samples: int, config: RolloutConfig, dispatcher: CropDispatcher
                 ) -> tuple[list[Rollout], list[str]]:
    """Runs `num_samples` rollouts of every episode (rows ordered episode-major). Returns the
    rollouts and the episodes skipped because their video could not be read."""
    max_parallel = 1 if config.mode == "sequential" else dispatcher.config.max_parallel
    context = _Context(sampler, tokenizer, config, dispatcher, max_parallel)
    prompts, rows, skipped = _start_rows(episodes, num_samples, context)
    if not rows:
        return [], skipped
    row_ids = [row.stream for row in rows]
    sampling = sampling_params(config, tokenizer, config.max_new_tokens)
    out, state = sampler.generate(prompts, num_samples=num_samples, sampling=sampling,
                                  seed=config.seed, row_ids=row_ids,
                                  # the suffix cache sized for the whole episode: no extend grows it
                                  reserve=episode_turns(config, dispatcher.config, max_parallel),
                                  shape=config.prompt_shape)
    for turn in range(config.max_turns + 1):
        _add_turn(rows, [b for b, row in enumerate(rows) if row.active], out, tokenizer)
        if not config.prompt.tools:
            break
        asked = _parse_round(rows, out, context)
        if not asked or turn == config.max_turns:  # nothing asked, or no rounds left to answer it
            break
        last_round = config.protocol.final_answer and turn == config.max_turns - 1
        answers = _answer_round(rows, asked, turn, context)
        chunks = _response_chunks(rows, asked, answers, state.chunk_start, last_round, context)
        budget = config.protocol.final_answer_tokens if last_round else config.max_new_tokens
        out, state = sampler.extend(state, chunks, sampling=sampling.with_budget(budget),
                                    seed=config.seed + turn + 1, row_ids=row_ids)
        if last_round:  # the forced answer ends every row that was still asking
            _add_turn(rows, [calls.row for calls in asked], out, tokenizer)
            break
    return [_finish(row, tokenizer) for row in rows], skipped


def _start_rows(episodes: Sequence[Episode], num_samples: int, context: _Context
                ) -> tuple[list[ModelInputs], list[_Row], list[str]]:
    """The prompts of the readable episodes, their `num_samples` rows each (episode-major) and
    the read errors of the others."""
    config = context.config
    prompts, errors, durations, overview_times = overview_prompts(
        episodes, context.tokenizer, config.prompt, context.dispatcher,
        context.dispatcher.schemas(config.prompt.tool_layout))
    kept = [i for i, prompt in enumerate(prompts) if prompt is not None]
    rows = [_Row(episodes[i], g, prompts[i], [np.zeros(prompts[i].length, np.float32)], prompts[i].length,
                 stream=config.row_offset + i * num_samples + g, duration=durations[i],
                 overview_times=overview_times[i], prefix=turn_prefix(config.prompt))
            for i in kept for g in range(num_samples)]
    return [prompts[i] for i in kept], rows, [e for e in errors if e is not None]


def _add_turn(rows: list[_Row], indices: Sequence[int], out: SampleOutput, tokenizer: Tokenizer):
    """Appends the turn just generated to each of the rows at `indices`."""
    for b in indices:
        rows[b].add_generated(out.tokens[b], out.logprobs[b], bool(out.finished[b]), tokenizer)


def _parse_round(rows: list[_Row], out: SampleOutput, context: _Context) -> list[_RowCalls]:
    """The calls of every active row's latest turn (`_row_calls`), recorded on the rows; a row
    that asked nothing is done."""
    asked = []
    for b, row in enumerate(rows):
        if not row.active:
            continue
        calls = _row_calls(b, row, context.tokenizer.decode(out.tokens[b]), context.config, context.max_parallel)
        if calls is None:
            row.active = False
            continue
        row.add_calls(calls)
        asked.append(calls)
    return asked


def _row_calls(b: int, row: _Row, text: str, config: RolloutConfig, max_parallel: int) -> _RowCalls | None:
    """Row b's tool round from its turn's `text`: crop tasks for its first max_parallel calls
    and its errors (malformed blocks and calls beyond max_parallel, each unless ignored);
    None when there is nothing to respond to."""
    parsed = parse_tool_calls(text, all_or_nothing=config.protocol.malformed == "reference")
    errors = list(parsed.errors) if config.protocol.malformed == "respond" else []
    if not parsed.calls and not errors:
        return None
    if config.protocol.extra_calls == "respond":
        errors += [f"call {number} was not executed: at most {max_parallel} crop_video calls run per turn"
                   for number in range(max_parallel + 1, len(parsed.calls) + 1)]
    tasks = tuple(CropTask(b, k, row.episode.video_path, row.duration, call)
                  for k, call in enumerate(parsed.calls[:max_parallel]))
    return _RowCalls(b, tasks, tuple(errors))


def _answer_round(rows: list[_Row], asked: list[_RowCalls], turn: int, context: _Context
                  ) -> list[list[_Answer]]:
    """Runs every crop of the round at once and answers each (`_round_answers`), recorded on
    the rows; the answers grouped as `asked`."""
    results = context.dispatcher.run([task for calls in asked for task in calls.tasks])
    answers = _round_answers(results, [row.stream for row in rows], turn, context)
    for answer in answers:
        rows[answer.result.task.row].add_answer(answer)
    remaining = iter(answers)
    return [[next(remaining) for _ in calls.tasks] for calls in asked]


def _round_answers(results: list[CropResult], streams: Sequence[int], turn: int, context: _Context
                  ) -> list[_Answer]:
    """One answer per crop result, by mode: sub-agent summaries (one batched sampler call,
    streams[row] * max_parallel + call index the random stream of each, seeded by the round),
    or the frames themselves (timestamped or images_first)."""
    config = context.config
    if config.mode == "subagent":
        stream_ids = [streams[r.task.row] * context.max_parallel + r.task.call_index for r in results]
        texts, trajectories = _responses_subagent(results, context.sampler, context.tokenizer, config,
                                                  config.seed + 1000 * (turn + 1), stream_ids)
        return [_Answer(r, text, text, trajectory) for r, text, trajectory in zip(results, texts, trajectories)]
    images_first = config.protocol.frames_response == "images_first"
    bodies = images_first_messages(results) if images_first else frames_responses(results)
    return [_Answer(r, body, answer_caption(r)) for r, body in zip(results, bodies)]


def answer_caption(result: CropResult) -> str:
    """A frames-mode answer as the episode log keeps it: the frame count, the text tool's
    answer, or the error."""
    if not result.ok:
        return f"Error: {result.error}"
    return result.text if result.clip is None else f"{len(result.clip.frames)} frames"


def _response_chunks(rows: list[_Row], asked: list[_RowCalls], answers: list[list[_Answer]],
                     chunk_start: np.ndarray, last_round: bool, context: _Context) -> list[ModelInputs | None]:
    """Each asking row's next chunk (`response_chunk`: its answers, its capped error responses,
    the final-answer instruction after the last round) appended to it; None for the others."""
    config = context.config
    prefix = config.protocol.final_answer_prefix if last_round else turn_prefix(config.prompt)
    instruction = config.protocol.final_answer_instruction if last_round else ""
    chunks: list[ModelInputs | None] = [None] * len(rows)
    for calls, row_answers in zip(asked, answers):
        row = rows[calls.row]
        row.prefix = prefix
        errors = [f"Error: {e}" for e in cap_errors(list(calls.errors), context.dispatcher.config.max_error_responses)]
        chunks[calls.row] = response_chunk([a.body for a in row_answers], errors, row.truncated, prefix,
                                           instruction, config, context.tokenizer, int(chunk_start[calls.row]))
        row.add_chunk(chunks[calls.row])
    return chunks


def call_record(result: CropResult, turn: int, response: str) -> CallRecord:
    """The episode log's record of one executed call (`CallRecord`)."""
    request = result.request
    cut = isinstance(request, CropRequest)  # another tool's request is no window
    return CallRecord(turn=turn, asked=lenient_window(result.task.call),
                      window=(float(request.start), float(request.end)) if cut else None,
                      frame_times=() if result.clip is None else tuple(round(float(t), 3)
                                                                      for t in result.clip.timestamps),
                      response=response)


def _finish(row: _Row, tokenizer: Tokenizer) -> Rollout:
    inputs = row.inputs
    logprobs = np.concatenate(row.logprobs)
    assert len(logprobs) == inputs.length, (len(logprobs), inputs.length)
    return Rollout(
        episode=row.episode, sample=row.sample, inputs=inputs, logprobs=logprobs,
        structural_mask=structural_positions(inputs.input_ids, inputs.loss_mask, tokenizer),
        prompt_length=row.prompt_length,
        completion=completion_text(inputs, row.prompt_length, tokenizer),
        generated_text=tokenizer.decode(inputs.input_ids[inputs.loss_mask == 1]),
        turn_texts=tuple(row.turn_texts),
        calls_per_turn=tuple(row.calls), turns=row.turns, errors=tuple(row.errors),
        subagents=tuple(row.subagents), truncated=row.truncated, overview_times=row.overview_times,
        calls=tuple(row.call_records))
