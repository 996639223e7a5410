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
from paravt_jax.agent.tools import cap_errors, lenient_window, parse_tool_calls
from paravt_jax.config import set_by
from paravt_jax.models.qwen3_vl.rope import IMAGE, VIDEO
from paravt_jax.sampling.sampler import PromptShape, Sampler
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs, encode, encode_ids
from paravt_jax.text.tokenizer import Tokenizer
from paravt_jax.video.frames import FACTOR, SIZINGS
from paravt_jax.video.reader import Clip, VideoError, read_frames, read_video_item

MODES = ("subagent", "frames", "sequential")
FRAMES_RESPONSES = ("timestamped", "images_first")
CALL_HANDLING = ("respond", "ignore")
ANSWER_TAGS = ("<answer>", "</answer>")
THINK_PREFIX = "<think>\n"  # the forced start of every assistant turn under think_prefix


@dataclasses.dataclass(frozen=True)
class Episode:
    episode_id: str
    question: str
    answer: str
    question_type: str
    video_path: str  # the episode's own video: the only file any crop may open
    nframes: int = 64  # K overview frames (nFrames gating decides it); 0: sampled at overview_fps
    system_prompt: str = ""  # the data row's own system message ("" = none)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    mode: str = "subagent"
    max_turns: int = 3  # tool rounds
    max_new_tokens: int = 512  # per assistant turn
    temperature: float = set_by(0.7, "rl.step.temperature: rollouts sample at the log-prob temperature")
    top_p: float = 1.0
    top_k: int = 0
    think_prefix: bool = True
    tools: bool = True  # False: no tool schema in the prompt, one turn
    overview_min_pixels: int = 784
    overview_max_pixels: int = 50176
    # single: one resize of each overview frame to [overview_min_pixels, overview_max_pixels] at
    # factor 32 (the evaluation driver's: the processor's budget); two_stage: the reference RL
    # workflow's qwen-vl-utils resize (factor 28) then the Qwen3-VL processor's (factor 32, at
    # least 65,536 pixels; video/frames.py `frame_sizes`)
    overview_sizing: str = "single"
    # Episodes with nframes 0 sample the overview at this rate, at most overview_max_frames
    # frames (the reference's overview when gating is off).
    overview_fps: float = 1.0
    overview_max_frames: int = 64
    # "<t seconds>" text before each overview frame (the RL workflow); False: bare images
    # (the evaluation driver).
    overview_timestamps: bool = True
    # How the overview is sent: "images" (image items; the above) or "video" (one Qwen3-VL video
    # item of overview_video_frames frames whose total pixels lie in the video budget below;
    # the reference's Charades-STA protocol).
    overview_visual: str = "images"
    overview_video_frames: int = 32
    overview_video_min_pixels: int = 4096
    overview_video_max_pixels: int = 25165824
    video_path_line: str = "newline"  # newline | space_if_absent | none (chat.with_video_path)
    tool_layout: str = "flat"  # the injected tool schema: flat (RL workflow) | object (eval, SFT data)
    # Frames-mode tool responses. timestamped: `<tool_response>\nN frames from S s to E s.\n`, the
    # frames each after its `<t seconds>`, `\n</tool_response>`, errors as "Error: reason";
    # images_first (the evaluation driver): the bare frames, then `<tool_response>\nN frames
    # from S.Ss to E.Es.\n</tool_response>`, errors `[Error cropping S.Ss-E.Es]`.
    frames_response: str = "timestamped"
    # malformed: respond = every malformed call block gets an error response, and a turn with
    # malformed blocks only gets its responses and another turn; ignore = malformed blocks are
    # skipped and a turn without a valid call ends the dialog (the evaluation driver, and the
    # RL workflow's parser).
    malformed: str = "respond"
    extra_calls: str = "respond"  # calls beyond max_parallel: respond (an error response) | ignore
    subagent_max_tokens: int = 512  # the summary budget; a summary cut there ends in " [truncated]"
    # final_answer: the last of the max_turns tool rounds ends with its tool responses, then
    # final_answer_instruction (a user message, if any) and one short turn of
    # final_answer_tokens to answer (the evaluation protocol). Without it, calls made after
    # the last round are left unanswered (training).
    final_answer: bool = False
    final_answer_tokens: int = 64
    final_answer_prefix: str = ""
    final_answer_instruction: str = ""
    system_prompt: str | None = None  # replaces the default system message (tool envelope)
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
        if self.mode not in MODES:
            raise ValueError(f"rollout mode {self.mode!r}: expected one of {MODES}")
        if self.max_turns < 0:
            raise ValueError(f"max_turns={self.max_turns} must be >= 0")
        for name, value, allowed in (("frames_response", self.frames_response, FRAMES_RESPONSES),
                                     ("malformed", self.malformed, CALL_HANDLING),
                                     ("extra_calls", self.extra_calls, CALL_HANDLING),
                                     ("video_path_line", self.video_path_line, chat.VIDEO_PATH_LINES),
                                     ("overview_visual", self.overview_visual, chat.VISUALS),
                                     ("tool_layout", self.tool_layout, chat.TOOL_LAYOUTS),
                                     ("overview_sizing", self.overview_sizing, SIZINGS)):
            if value not in allowed:
                raise ValueError(f"rollout {name} {value!r}: expected one of {allowed}")


@dataclasses.dataclass(frozen=True)
class SubTrajectory:
    """One sub-agent call: its prompt + summary (loss mask on the summary) and log-probs."""
    row: int
    inputs: ModelInputs
    logprobs: np.ndarray


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One executed crop call as the episode log keeps it: the assistant turn that made it, the
    window as the call reads (`tools.lenient_window`; the model's numbers, any size), the window
    the dispatcher cut (validated and clamped; None when the call was refused), the source
    timestamps of the crop's frames (references into the episode's video, not pixels) and the
    tool response's text (the sub-agent summary, the frames' caption, or the error)."""
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
    episode: Episode
    sample: int
    inputs: ModelInputs
    logprobs: list[np.ndarray]
    prompt_length: int
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

    def add_generated(self, tokens: list[int], logprobs: np.ndarray, tokenizer: Tokenizer):
        self.inputs = self.inputs.extend(encode_ids(tokens, self.inputs.next_position, trainable=True))
        self.logprobs.append(np.asarray(logprobs, np.float32))
        self.turn_texts.append(self.prefix + tokenizer.decode(tokens))
        self.turns += 1

    def add_chunk(self, chunk: ModelInputs):
        self.inputs = self.inputs.extend(chunk)
        self.logprobs.append(np.zeros(chunk.length, np.float32))


# ----------------------------------------------------------------------------- engine
def prompt_inputs(episode: Episode, clip: Clip, tokenizer: Tokenizer, config: RolloutConfig) -> ModelInputs:
    """The episode's ParaVT prompt over its overview `clip`: system message (tool schema),
    the frames (timestamped or bare, or one video item), the question with the video-path
    line, and the generation prompt with the turn's forced prefix."""
    tools = (chat.crop_video_tool(layout=config.tool_layout),) if config.tools else ()
    if config.system_prompt is not None:
        tools, system = (), config.system_prompt
    else:
        system = episode.system_prompt
    video_name = os.path.basename(episode.video_path) if config.tools else None
    stamped = config.overview_timestamps or config.overview_visual == "video"
    messages = chat.paravt_messages(episode.question, clip.frames, clip.timestamps if stamped else None,
                                    video_name=video_name, tools=tools, system_text=system,
                                    video_path_line=config.video_path_line, visual=config.overview_visual)
    prefix = THINK_PREFIX if config.think_prefix else ""
    return encode(chat.render(messages, add_generation_prompt=True, assistant_prefix=prefix), tokenizer)


def subagent_prompt(clip: Clip, start: float, end: float, tokenizer: Tokenizer) -> ModelInputs:
    """One sub-agent's prompt: the crop's bare frames, then the segment instruction."""
    content = tuple(chat.frames_as_images(clip.frames, None)) + (chat.Text(chat.segment_instruction(start, end)),)
    return encode(chat.render([chat.Message("user", content)], add_generation_prompt=True), tokenizer)


def summary_text(tokens: Sequence[int], finished: bool, tokenizer: Tokenizer) -> str:
    """A sub-agent's answer as its tool response shows it: the decoded summary, and a summary
    that reached its budget without the stop token marked " [truncated]" (the text the
    reference keeps of a longer summary: its first tokens, with the marker)."""
    body = [t for t in tokens if t != tokenizer.special.im_end]
    return tokenizer.decode(body, skip_special_tokens=True).strip() + ("" if finished else " [truncated]")


def response_chunk(bodies: Sequence, errors: Sequence[str], truncated: bool, prefix: str,
                   instruction: str, config: RolloutConfig, tokenizer: Tokenizer,
                   start_position: int) -> ModelInputs:
    """The chunk appended to a row after a tool round: the end of the assistant turn (its
    `<|im_end|>` too when the turn was cut at its budget), one tool-response user turn per
    executed call (`bodies`: sub-agent summaries, frames-mode bodies, or whole images_first
    messages) and per error, an optional user instruction, and the next generation prompt
    with its forced `prefix`."""
    if config.mode != "subagent" and config.frames_response == "images_first":
        messages = list(bodies) + chat.tool_response_messages(errors)
    else:
        messages = chat.tool_response_messages(list(bodies) + list(errors))
    if instruction:
        messages.append(chat.Message.of("user", instruction))
    close = "<|im_end|>\n" if truncated else "\n"
    segments = [chat.Text(close)] + chat.render(messages, add_generation_prompt=True, assistant_prefix=prefix)
    return encode(segments, tokenizer, start_position=start_position)


def overview_prompts(episodes: Sequence[Episode], tokenizer: Tokenizer, config: RolloutConfig,
                     pool) -> tuple[list[ModelInputs | None], list[str | None], list[float], list[tuple]]:
    """Reads every episode's K overview frames concurrently and builds its ParaVT prompt.
    Returns the prompts, the read errors, the videos' durations and the overview frames'
    source timestamps (None / an error / 0 / () for an unreadable video)."""
    def build(ep: Episode):
        pixels = dict(min_pixels=config.overview_min_pixels, max_pixels=config.overview_max_pixels,
                      sizing=config.overview_sizing)
        if config.overview_visual == "video":
            clip = read_video_item(ep.video_path, config.overview_video_frames,
                                   config.overview_video_min_pixels, config.overview_video_max_pixels)
        elif ep.nframes > 0:
            clip = read_frames(ep.video_path, nframes=ep.nframes, **pixels)
        else:
            clip = read_frames(ep.video_path, fps=config.overview_fps, max_frames=config.overview_max_frames,
                               **pixels)
        times = tuple(round(float(t), 3) for t in clip.timestamps)
        return prompt_inputs(ep, clip, tokenizer, config), clip.metadata.duration, times

    prompts, errors, durations, timestamps = [], [], [], []
    for ep, future in [(ep, pool.submit(build, ep)) for ep in episodes]:
        try:
            prompt, duration, times = future.result()
            prompts.append(prompt)
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
    """All sub-agent prompts of the turn in one batched sampler call (same weights), or in
    calls of config.subagent_shape.rows rows when set; stream_ids[i]: the random stream of
    results[i]'s summary (default: its place in the turn's crops), so the summaries do not
    depend on how the calls split them."""
    texts: list = [None] * len(results)
    trajectories: list[SubTrajectory | None] = [None] * len(results)
    ok = [i for i, r in enumerate(results) if r.ok]
    streams = list(range(len(results))) if stream_ids is None else list(stream_ids)
    size = config.subagent_shape.rows or max(len(ok), 1)
    for start in range(0, len(ok), size):
        part = ok[start:start + size]
        prompts = [subagent_prompt(results[i].clip, results[i].request.start, results[i].request.end, tokenizer)
                   for i in part]
        out, _ = sampler.generate(prompts, max_new_tokens=config.subagent_max_tokens,
                                  temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                                  stop_ids=(tokenizer.special.im_end,), seed=seed,
                                  row_ids=[streams[i] for i in part], shape=config.subagent_shape)
        for j, i in enumerate(part):
            tokens = out.tokens[j]
            texts[i] = summary_text(tokens, bool(out.finished[j]), tokenizer)
            seq = prompts[j].extend(encode_ids(tokens, prompts[j].next_position, trainable=True))
            logps = np.concatenate([np.zeros(prompts[j].length, np.float32), out.logprobs[j]])
            trajectories[i] = SubTrajectory(results[i].task.row, seq, logps)
    for i, r in enumerate(results):
        if not r.ok:
            texts[i] = f"Error: {r.error}"
    return texts, trajectories


def frames_responses(results: list[CropResult]) -> list:
    """Timestamped layout: each call's response body (text, or text and frames)."""
    out = []
    for r in results:
        if not r.ok:
            out.append(f"Error: {r.error}")
            continue
        clip = r.clip
        out.append([chat.Text(f"{len(clip.frames)} frames from {r.request.start:.1f} s to "
                              f"{r.request.end:.1f} s.\n"),
                    *chat.frames_as_images(clip.frames, clip.timestamps)])
    return out


def images_first_messages(results: list[CropResult]) -> list[chat.Message]:
    """The evaluation driver's layout: one user turn per call, the crop's bare frames BEFORE
    `<tool_response>\nN frames from S.Ss to E.Es.\n</tool_response>`; a failed crop is
    `<tool_response>\n[Error cropping S.Ss-E.Es]\n</tool_response>`. S and E are the window as
    the driver reads the call (`tools.lenient_window`), before clamping to the video."""
    out = []
    for r in results:
        start, end = lenient_window(r.task.call)
        if r.ok:
            text = f"<tool_response>\n{len(r.clip.frames)} frames from {start:.1f}s to {end:.1f}s.\n</tool_response>"
            out.append(chat.Message("user", (*chat.frames_as_images(r.clip.frames, None), chat.Text(text))))
        else:
            out.append(chat.Message.of("user", f"<tool_response>\n[Error cropping {start:.1f}s-{end:.1f}s]\n"
                                               "</tool_response>"))
    return out


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
    if not config.tools:
        return []
    response = response_tokens_bound(config, dispatch, max_parallel)
    turns = [(response, config.max_new_tokens)] * config.max_turns
    if config.final_answer and turns:
        turns[-1] = (response, config.final_answer_tokens)
    return turns


def run_rollouts(sampler: Sampler, tokenizer: Tokenizer, episodes: Sequence[Episode],
                 num_samples: int, config: RolloutConfig, dispatcher: CropDispatcher
                 ) -> tuple[list[Rollout], list[str]]:
    """Runs `num_samples` rollouts of every episode (rows ordered episode-major). Returns the
    rollouts and the episodes skipped because their video could not be read."""
    im_end = tokenizer.special.im_end
    knobs = dict(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                 stop_ids=(im_end,))
    prompts, prompt_errors, durations, overview_times = overview_prompts(episodes, tokenizer, config, dispatcher)
    kept = [i for i, p in enumerate(prompts) if p is not None]
    skipped = [e for e in prompt_errors if e is not None]
    if not kept:
        return [], skipped
    eps = [episodes[i] for i in kept]
    think = THINK_PREFIX if config.think_prefix else ""
    rows = [_Row(eps[e], g, prompts[kept[e]], [np.zeros(prompts[kept[e]].length, np.float32)],
                 prompts[kept[e]].length, overview_times=overview_times[kept[e]], prefix=think)
            for e in range(len(eps)) for g in range(num_samples)]
    row_duration = [durations[kept[e]] for e in range(len(eps)) for _ in range(num_samples)]
    # a row's random stream: its place in the step's batch (skipped episodes keep their slots)
    row_ids = [config.row_offset + kept[e] * num_samples + g for e in range(len(eps)) for g in range(num_samples)]
    max_parallel = 1 if config.mode == "sequential" else dispatcher.config.max_parallel
    out, state = sampler.generate([prompts[i] for i in kept], num_samples=num_samples,
                                  max_new_tokens=config.max_new_tokens, seed=config.seed,
                                  row_ids=row_ids, **knobs,
                                  # the suffix cache sized for the whole episode: no extend grows it
                                  reserve=episode_turns(config, dispatcher.config, max_parallel),
                                  shape=config.prompt_shape)
    for turn in range(config.max_turns + 1):
        turn_rows = [b for b, row in enumerate(rows) if row.active]
        for b in turn_rows:
            rows[b].add_generated(out.tokens[b], out.logprobs[b], tokenizer)
            rows[b].truncated = not bool(out.finished[b])
        if not config.tools:
            break
        tasks, pending_errors, per_row = [], {}, {}
        for b in turn_rows:
            row = rows[b]
            parsed = parse_tool_calls(tokenizer.decode(out.tokens[b]))
            block_errors = parsed.errors if config.malformed == "respond" else []
            if not parsed.calls and not block_errors:
                row.active = False
                continue
            errors = list(block_errors)
            executed = parsed.calls[:max_parallel]
            if config.extra_calls == "respond":
                for number in range(max_parallel + 1, len(parsed.calls) + 1):
                    errors.append(f"call {number} was not executed: at most "
                                  f"{max_parallel} crop_video calls run per turn")
            row.errors += errors
            messages = [f"Error: {e}" for e in cap_errors(errors, dispatcher.config.max_error_responses)]
            row.calls.append(len(executed))
            per_row[b] = (len(tasks), len(executed))
            tasks += [CropTask(b, k, row.episode.video_path, row_duration[b], call)
                      for k, call in enumerate(executed)]
            pending_errors[b] = messages
        if not per_row:
            break
        if turn == config.max_turns:  # no rounds left: these calls stay unanswered
            for b in per_row:
                rows[b].active = False
            break
        last_round = config.final_answer and turn == config.max_turns - 1
        results = dispatcher.run(tasks)
        for r in results:
            if not r.ok:
                rows[r.task.row].errors.append(r.error)
        if config.mode == "subagent":
            stream_ids = [row_ids[r.task.row] * max_parallel + r.task.call_index for r in results]
            texts, trajectories = _responses_subagent(results, sampler, tokenizer, config,
                                                      config.seed + 1000 * (turn + 1), stream_ids)
            for t in trajectories:
                if t is not None:
                    rows[t.row].subagents.append(t)
            captions = texts
        elif config.frames_response == "images_first":
            texts = images_first_messages(results)
        else:
            texts = frames_responses(results)
        if config.mode != "subagent":
            captions = [f"{len(r.clip.frames)} frames" if r.ok else f"Error: {r.error}" for r in results]
        for r, caption in zip(results, captions):
            rows[r.task.row].call_records.append(call_record(r, rows[r.task.row].turns - 1, caption))
        chunks: list[ModelInputs | None] = [None] * len(rows)
        for b, (first, count) in per_row.items():
            row = rows[b]
            prefix = think
            if last_round:
                prefix = config.final_answer_prefix
                row.active = False  # after the forced answer this row is done
            row.prefix = prefix
            chunk = response_chunk(texts[first:first + count], pending_errors[b], row.truncated, prefix,
                                   config.final_answer_instruction if last_round else "", config, tokenizer,
                                   int(state.chunk_start[b]))
            row.add_chunk(chunk)
            chunks[b] = chunk
        budget = config.final_answer_tokens if last_round else config.max_new_tokens
        out, state = sampler.extend(state, chunks, max_new_tokens=budget,
                                    seed=config.seed + turn + 1, row_ids=row_ids, **knobs)
        if last_round:
            for b in per_row:
                rows[b].add_generated(out.tokens[b], out.logprobs[b], tokenizer)
                rows[b].truncated = not bool(out.finished[b])
            break
    return [_finish(row, tokenizer) for row in rows], skipped


def call_record(result: CropResult, turn: int, response: str) -> CallRecord:
    """The episode log's record of one executed call (`CallRecord`)."""
    request = result.request
    return CallRecord(turn=turn, asked=lenient_window(result.task.call),
                      window=None if request is None else (float(request.start), float(request.end)),
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
