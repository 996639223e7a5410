"""The multi-turn agent rollout: generate, parse the turn's tool calls, run every call of
every row concurrently, answer them (sub-agent summaries or the frames themselves), extend
each row's cache with its tool responses and generate again, up to `max_turns` rounds
(`RolloutLoop`, one method per phase of a round; `run_rollouts` runs it).

Each finished row becomes one `Rollout` (agent/records.py): the whole token sequence with its
model inputs, behaviour log-probs, the loss mask (1 only on policy-generated tokens), the
structural-token mask, the completion text for the rewards, and per-episode metadata. A row's
state while it is generated is a `Row` (agent/rows.py).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from paravt_jax.agent.dispatch import CropDispatcher, CropResult, DispatchConfig
from paravt_jax.agent.protocol import THINK_PREFIX, PromptFormat, ToolProtocol
from paravt_jax.agent.records import CallRecord, Episode, Rollout, SubTrajectory
from paravt_jax.agent.responses import (
    answer_caption,
    frames_responses,
    images_first_messages,
    subagent_answers,
    subagent_prompts,
    subagent_responses,
    summarize,
)
from paravt_jax.agent.rows import Answer, Row, RowCalls
from paravt_jax.config import checked, integer, one_of, refuse, set_by, validate
from paravt_jax.sampling.calls import PromptShape, SampleOutput
from paravt_jax.sampling.params import SamplingParams
from paravt_jax.sampling.sampler import Sampler, SamplerState
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs, encode
from paravt_jax.text.tokenizer import Tokenizer
from paravt_jax.video.frames import FACTOR
from paravt_jax.video.reader import Clip, VideoError, read_frames, read_video_item

# The rollout's public names; the records are agent/records.py's, imported from here too.
__all__ = ["MODES", "CallRecord", "Episode", "Rollout", "RolloutConfig", "RolloutLoop", "SubTrajectory",
           "episode_turns", "overview_prompts", "prompt_inputs", "response_chunk", "response_tokens_bound",
           "run_rollouts", "sampling_params", "turn_prefix", "FRAME_TEXT_TOKENS", "RESPONSE_TEXT_TOKENS"]

MODES = ("subagent", "frames", "sequential")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """One episode: its mode, budgets and sampling, its prompt's layout (`prompt`) and its tool
    protocol (`protocol`; agent/protocol.py, training() by default)."""
    mode: str = checked("subagent", one_of(MODES))
    max_turns: int = checked(3, integer(0))  # tool rounds
    max_new_tokens: int = checked(512, integer(1))  # per assistant turn
    # the summary budget; a summary cut there ends in " [truncated]"
    subagent_max_tokens: int = checked(512, integer(1))
    # True: a round's sub-agent prompts beyond subagent_shape.rows wait for a free row of one
    # call, taking it as a summary ends (Sampler.sample_queued); False: calls of
    # subagent_shape.rows prompts one after another, each as long as its longest summary
    subagent_refill: bool = False
    # True: each row's turns run on their own (Sampler.start_turns): a row whose turn ends has its
    # calls answered and its next turn started while the other rows decode, instead of every
    # row waiting for the round's longest turn; the same rollouts (tokens, calls, responses)
    turn_refill: bool = False
    # with turn_refill in subagent mode: a round's sub-agent prompts take the turns' free rows
    # (the rows of ended episodes, and subagent_spare_rows more rows kept for them) and decode
    # beside the other rows' turns (Sampler.admit_turns); those that find no free row run in
    # calls of their own at once, as all of them do without it
    subagent_in_turns: bool = False
    subagent_spare_rows: int = checked(0, integer(0))
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
        if self.subagent_in_turns and not (self.turn_refill and self.mode == "subagent"):
            raise refuse("subagent_in_turns", True, "needs turn_refill=True and mode='subagent'")
        if self.subagent_spare_rows and not self.subagent_in_turns:
            raise refuse("subagent_spare_rows", self.subagent_spare_rows, "needs subagent_in_turns=True")
        if self.subagent_in_turns and self.subagent_max_tokens > self.max_new_tokens:
            raise refuse("subagent_in_turns", True, f"the summaries decode in the turns' rows, whose columns hold "
                         f"max_new_tokens={self.max_new_tokens} tokens: subagent_max_tokens="
                         f"{self.subagent_max_tokens} must not exceed it")


# ----------------------------------------------------------------------------- prompts
def prompt_inputs(episode: Episode, clip: Clip, tokenizer: Tokenizer, prompt: PromptFormat,
                  schemas: Sequence[dict] | None = None) -> ModelInputs:
    """The episode's ParaVT prompt over its overview `clip`: system message (the tools'
    `schemas`; None: crop_video's in the prompt's layout; none when the prompt or the episode
    offers no tools), the frames (timestamped or bare, or
    one video item), the question with the video-path line, and the generation prompt with the
    turn's forced prefix."""
    if schemas is None:
        schemas = (chat.crop_video_tool(layout=prompt.tool_layout),)
    offered = prompt.tools and episode.tools
    tools = tuple(schemas) if offered else ()
    if prompt.system_prompt is not None:
        tools, system = (), prompt.system_prompt
    else:
        system = episode.system_prompt
    video_name = os.path.basename(episode.video_path) if offered else None
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


# ----------------------------------------------------------------------------- the loop
def run_rollouts(sampler: Sampler, tokenizer: Tokenizer, episodes: Sequence[Episode],
                 num_samples: int, config: RolloutConfig, dispatcher: CropDispatcher
                 ) -> tuple[list[Rollout], list[str]]:
    """Runs `num_samples` rollouts of every episode (rows ordered episode-major). Returns the
    rollouts and the episodes skipped because their video could not be read."""
    return RolloutLoop(sampler, tokenizer, config, dispatcher).run(episodes, num_samples)


class RolloutLoop:
    """The episode loop over a batch of rows: the policy's `sampler`, the `dispatcher` that
    runs the tools' calls (its tools are what the prompt lists), and the episode's `config`.
    `run` starts the rows and plays their rounds; each round is a method per phase: `parse`
    (each active row's calls), `answer` (every call of the round at once, answered by mode),
    `respond` (each asking row's next chunk) and `extend` (the next turn of every row). The
    rows' state is theirs (`Row`); the loop holds only what every round reads."""

    def __init__(self, sampler: Sampler, tokenizer: Tokenizer, config: RolloutConfig, dispatcher: CropDispatcher):
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.config = config
        self.dispatcher = dispatcher
        self.max_parallel = 1 if config.mode == "sequential" else dispatcher.config.max_parallel  # calls run per turn
        self.sampling = sampling_params(config, tokenizer, config.max_new_tokens)

    def run(self, episodes: Sequence[Episode], num_samples: int) -> tuple[list[Rollout], list[str]]:
        """`run_rollouts`: the rollouts and the skipped episodes' read errors."""
        prompts, rows, skipped = self.start(episodes, num_samples)
        if rows:
            (self.play_refilled if self.config.turn_refill else self.play)(prompts, rows, num_samples)
        return [row.finish(self.tokenizer) for row in rows], skipped

    def start(self, episodes: Sequence[Episode], num_samples: int
              ) -> tuple[list[ModelInputs], list[Row], list[str]]:
        """The prompts of the readable episodes, their `num_samples` rows each (episode-major)
        and the read errors of the others."""
        config = self.config
        schemas = self.dispatcher.schemas(config.prompt.tool_layout)
        prompts, errors, durations, overview_times = overview_prompts(episodes, self.tokenizer, config.prompt,
                                                                      self.dispatcher, schemas)
        kept = [i for i, prompt in enumerate(prompts) if prompt is not None]
        slots = [(i, g) for i in kept for g in range(num_samples)]
        rows = [Row(b, episodes[i], g, prompts[i], stream=config.row_offset + i * num_samples + g,
                    duration=durations[i], overview_times=overview_times[i], prefix=turn_prefix(config.prompt))
                for b, (i, g) in enumerate(slots)]
        return [prompts[i] for i in kept], rows, [e for e in errors if e is not None]

    def play(self, prompts: list[ModelInputs], rows: list[Row], num_samples: int):
        """Generates the rows' first turns, then answers their calls and generates again, round
        by round, until no row asks or no round is left."""
        config = self.config
        out, state = self.generate(prompts, rows, num_samples)
        for turn in range(config.max_turns + 1):
            self.add_turns(rows, [row.index for row in rows if row.active], out)
            asked = self.parse(rows, out) if config.prompt.tools else []
            if not asked or turn == config.max_turns:  # nothing asked, or no rounds left to answer it
                return
            last_round = config.protocol.final_answer and turn == config.max_turns - 1
            chunks = self.respond(rows, asked, self.answer(rows, asked, turn), state.chunk_start, last_round)
            out, state = self.extend(state, chunks, rows, turn, last_round)
            if last_round:  # the forced answer ends every row that was still asking
                self.add_turns(rows, [calls.row for calls in asked], out)
                return

    def play_refilled(self, prompts: list[ModelInputs], rows: list[Row], num_samples: int):
        """`play`, each row on its own (config.turn_refill): the sampler returns the turns that
        ended (a few rows at a time); their rows' calls are answered (a round's calls together,
        seeded by the round as in `play`) and each asking row's responses start its next turn,
        while the other rows go on decoding. With config.subagent_in_turns the round's sub-agent
        prompts decode in the turns' free rows where there are some (`Guests`, `place`), and the
        asking rows' responses follow once their summaries end. Each row's turns, calls and
        responses are `play`'s."""
        config = self.config
        state = self.sampler.start_turns(prompts, num_samples, sampling=self.sampling, seed=config.seed,
                                         row_ids=[row.stream for row in rows],
                                         reserve=episode_turns(config, self.dispatcher.config, self.max_parallel),
                                         shape=config.prompt_shape, spare_rows=config.subagent_spare_rows)
        rounds = [0] * len(rows)  # the rounds answered before each row's current turn
        final: set[int] = set()  # rows in the forced final-answer turn
        guests = Guests(self.tokenizer, set(range(len(rows), state.rows))) if config.subagent_in_turns else None
        while True:
            ends = self.sampler.decode_turns(state)
            if not ends:
                return
            asked, answered = [], []
            for end in ends:
                if guests is not None and end.row in guests.hosts:
                    answered += guests.ended(end)
                    continue
                row = rows[end.row]
                row.add_generated(end.tokens, end.logprobs, end.finished, self.tokenizer)
                calls = None
                if end.row not in final and config.prompt.tools:
                    calls = row.read_calls(self.tokenizer.decode(end.tokens), config.protocol, self.max_parallel)
                if calls is not None and rounds[end.row] < config.max_turns:
                    asked.append(calls)
                elif guests is not None:  # the episode is over: its row takes sub-agent prompts
                    guests.free.add(end.row)
            for turn in sorted({rounds[calls.row] for calls in asked}):  # each round's calls together
                group = [calls for calls in asked if rounds[calls.row] == turn]
                results = self.dispatcher.run([task for calls in group for task in calls.tasks])
                if guests is None:
                    answered.append((turn, group, self.answers(results, [row.stream for row in rows], turn)))
                else:
                    streams = self.subagent_streams([row.stream for row in rows], results)
                    answered += guests.add(Summaries(turn, group, results, subagent_prompts(results, self.tokenizer),
                                                     streams))
            if guests is not None:
                answered += self.place(state, guests)
            chunks, budgets, seeds = {}, {}, {}
            for turn, group, answers in answered:
                last_round = config.protocol.final_answer and turn == config.max_turns - 1
                made = self.respond(rows, group, self.record(rows, group, answers), state.chunk_start(), last_round)
                for calls in group:
                    b = calls.row
                    chunks[b], seeds[b], rounds[b] = made[b], config.seed + turn + 1, turn + 1
                    budgets[b] = config.protocol.final_answer_tokens if last_round else config.max_new_tokens
                    if last_round:
                        final.add(b)
            self.sampler.extend_turns(state, chunks, budget=budgets, seed=seeds)

    def place(self, state, guests: Guests) -> list[tuple]:
        """The waiting sub-agent prompts into the turns' free rows (the lowest first); those that
        find none summarized at once in calls of their own, a round's together. Each is seeded
        and streamed as `answers` runs it. Returns the rounds' answers this completes."""
        config = self.config
        admitted = guests.admit()
        if admitted:
            seeds = {b: config.seed + 1000 * (summaries.turn + 1) for b, (summaries, _) in admitted.items()}
            self.sampler.admit_turns(state, {b: summaries.prompts[i] for b, (summaries, i) in admitted.items()},
                                     budget={b: config.subagent_max_tokens for b in admitted}, seed=seeds,
                                     stream={b: summaries.streams[i] for b, (summaries, i) in admitted.items()})
        answered, waiting = [], guests.take_queue()
        sampling = sampling_params(config, self.tokenizer, config.subagent_max_tokens)
        for turn in sorted({summaries.turn for summaries, _ in waiting}):
            part = [(summaries, i) for summaries, i in waiting if summaries.turn == turn]
            outs = summarize(self.sampler, [s.prompts[i] for s, i in part], [s.streams[i] for s, i in part], sampling,
                             config.subagent_shape, config.seed + 1000 * (turn + 1), config.subagent_refill)
            for (summaries, i), out in zip(part, outs):
                answered += guests.finish(summaries, i, out)
        return answered

    def generate(self, prompts: list[ModelInputs], rows: list[Row], num_samples: int
                 ) -> tuple[SampleOutput, SamplerState]:
        """The first turn of every row, the suffix cache sized for the whole episode (no extend
        grows it)."""
        return self.sampler.generate(prompts, num_samples=num_samples, sampling=self.sampling, seed=self.config.seed,
                                     row_ids=[row.stream for row in rows],
                                     reserve=episode_turns(self.config, self.dispatcher.config, self.max_parallel),
                                     shape=self.config.prompt_shape)

    def add_turns(self, rows: list[Row], indices: Sequence[int], out: SampleOutput):
        """Appends the turn just generated to each of the rows at `indices`."""
        for b in indices:
            rows[b].add_generated(out.tokens[b], out.logprobs[b], bool(out.finished[b]), self.tokenizer)

    def parse(self, rows: list[Row], out: SampleOutput) -> list[RowCalls]:
        """The calls of every active row's latest turn (`Row.read_calls`); a row that asked
        nothing, or whose episode offers no tools, is done."""
        asked = [row.read_calls(self.tokenizer.decode(out.tokens[row.index]), self.config.protocol, self.max_parallel)
                 for row in rows if row.active]
        return [calls for calls in asked if calls is not None]

    def answer(self, rows: list[Row], asked: list[RowCalls], turn: int) -> list[list[Answer]]:
        """Runs every call of the round at once and answers each (`answers`), recorded on the
        rows; the answers grouped as `asked`."""
        results = self.dispatcher.run([task for calls in asked for task in calls.tasks])
        return self.record(rows, asked, self.answers(results, [row.stream for row in rows], turn))

    @staticmethod
    def record(rows: list[Row], asked: list[RowCalls], answers: list[Answer]) -> list[list[Answer]]:
        """`answers` (one per task of `asked`, in order) recorded on their rows; grouped as `asked`."""
        for answer in answers:
            rows[answer.result.task.row].add_answer(answer)
        remaining = iter(answers)
        return [[next(remaining) for _ in calls.tasks] for calls in asked]

    def subagent_streams(self, streams: Sequence[int], results: list[CropResult]) -> list[int]:
        """Each result's sub-agent stream: its row's stream x max_parallel + its call's index."""
        return [streams[r.task.row] * self.max_parallel + r.task.call_index for r in results]

    def answers(self, results: list[CropResult], streams: Sequence[int], turn: int) -> list[Answer]:
        """One answer per call result, by mode: sub-agent summaries (one batched sampler call,
        streams[row] * max_parallel + call index the random stream of each, seeded by the
        round), or the frames themselves (timestamped or images_first)."""
        config = self.config
        if config.mode == "subagent":
            stream_ids = self.subagent_streams(streams, results)
            texts, trajectories = subagent_responses(
                results, self.sampler, self.tokenizer,
                sampling_params(config, self.tokenizer, config.subagent_max_tokens), config.subagent_shape,
                config.seed + 1000 * (turn + 1), stream_ids, config.subagent_refill)
            return [Answer(r, text, text, trajectory) for r, text, trajectory in zip(results, texts, trajectories)]
        images_first = config.protocol.frames_response == "images_first"
        bodies = images_first_messages(results) if images_first else frames_responses(results)
        return [Answer(r, body, answer_caption(r)) for r, body in zip(results, bodies)]

    def respond(self, rows: list[Row], asked: list[RowCalls], answers: list[list[Answer]],
                chunk_start: np.ndarray, last_round: bool) -> list[ModelInputs | None]:
        """Each asking row's next chunk (`response_chunk`: its answers, its capped error
        responses, the final-answer instruction after the last round) appended to it; None for
        the others."""
        config = self.config
        prefix = config.protocol.final_answer_prefix if last_round else turn_prefix(config.prompt)
        instruction = config.protocol.final_answer_instruction if last_round else ""
        chunks: list[ModelInputs | None] = [None] * len(rows)
        for calls, row_answers in zip(asked, answers):
            row = rows[calls.row]
            chunk = response_chunk([a.body for a in row_answers],
                                   calls.error_responses(self.dispatcher.config.max_error_responses), row.truncated,
                                   prefix, instruction, config, self.tokenizer, int(chunk_start[calls.row]))
            row.add_chunk(chunk, prefix)
            chunks[calls.row] = chunk
        return chunks

    def extend(self, state: SamplerState, chunks: list[ModelInputs | None], rows: list[Row], turn: int,
               last_round: bool) -> tuple[SampleOutput, SamplerState]:
        """The next turn of every row given a chunk (the short final answer after the last
        round), seeded by the round."""
        budget = self.config.protocol.final_answer_tokens if last_round else self.config.max_new_tokens
        return self.sampler.extend(state, chunks, sampling=self.sampling.with_budget(budget),
                                   seed=self.config.seed + turn + 1, row_ids=[row.stream for row in rows])


# ----------------------------------------------------------------------------- sub-agents in the turns' rows
@dataclasses.dataclass
class Summaries:
    """Some rows' calls of round `turn` (`asked`, their crops' `results`), whose sub-agent
    prompts (`prompts`, by result index; `streams` each result's stream) decode in the turns'
    rows; `done[i]`: prompt i's summary as (tokens, log-probs, finished)."""
    turn: int
    asked: list[RowCalls]
    results: list[CropResult]
    prompts: dict[int, ModelInputs]
    streams: list[int]
    done: dict[int, tuple] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Guests:
    """The sub-agent prompts of a turn-refilled rollout (RolloutConfig.subagent_in_turns): the
    rows free for them (`free`: the spare and padding rows, then the rows of ended episodes),
    the prompts waiting for one (`queue`) and the row each decoding prompt is in (`hosts`)."""
    tokenizer: Tokenizer
    free: set[int]
    queue: list[tuple[Summaries, int]] = dataclasses.field(default_factory=list)
    hosts: dict[int, tuple[Summaries, int]] = dataclasses.field(default_factory=dict)

    def add(self, summaries: Summaries) -> list[tuple]:
        """Queues the round's sub-agent prompts; the round's answers at once when it has none."""
        self.queue += [(summaries, i) for i in sorted(summaries.prompts)]
        return self.answered(summaries)

    def admit(self) -> dict[int, tuple[Summaries, int]]:
        """The waiting prompts given the free rows (the lowest row first, in queue order)."""
        admitted = {}
        for b in sorted(self.free)[:len(self.queue)]:
            admitted[b] = self.hosts[b] = self.queue.pop(0)
            self.free.discard(b)
        return admitted

    def take_queue(self) -> list[tuple[Summaries, int]]:
        """The prompts still waiting (no free row was left for them), the queue emptied."""
        waiting, self.queue = self.queue, []
        return waiting

    def ended(self, end) -> list[tuple]:
        """A summary ended in row end.row (freed): its round's answers once all of them ended."""
        summaries, i = self.hosts.pop(end.row)
        self.free.add(end.row)
        return self.finish(summaries, i, (end.tokens, end.logprobs, end.finished))

    def finish(self, summaries: Summaries, i: int, summary: tuple) -> list[tuple]:
        """Prompt i's summary (tokens, log-probs, finished): its round's answers once all ended."""
        summaries.done[i] = summary
        return self.answered(summaries)

    def answered(self, summaries: Summaries) -> list[tuple]:
        """[(turn, asked, answers)] once every prompt of `summaries` has its summary, else []."""
        if len(summaries.done) < len(summaries.prompts):
            return []
        texts, trajectories = subagent_answers(summaries.results, summaries.prompts, summaries.done, self.tokenizer)
        return [(summaries.turn, summaries.asked, [Answer(r, text, text, trajectory) for r, text, trajectory
                                                   in zip(summaries.results, texts, trajectories)])]
