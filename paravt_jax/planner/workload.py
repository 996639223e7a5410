"""The planner's workload: the recipe's episodes in tokens, counted with the run's tokenizer on
the prompts and tool responses agent/rollout.py builds (black frames of the planned sizes), and
the rows, micro-batches and sampler calls one RL step makes of them."""
from __future__ import annotations

import dataclasses

from paravt_jax.agent.dispatch import CropResult, CropTask
from paravt_jax.agent.responses import frames_responses, images_first_messages, subagent_prompt, summary_text
from paravt_jax.agent.rollout import Episode, episode_turns, prompt_inputs, response_chunk, turn_prefix
from paravt_jax.agent.tools import TOOL_NAME, CropRequest, ToolCall
from paravt_jax.data.sft_examples import blank_overview
from paravt_jax.infra.buckets import bucket, fit
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig, load_config, preset
from paravt_jax.planner.memory import PrefillCall
from paravt_jax.rl.shapes import StepShapes, step_shapes
from paravt_jax.run_config import SECTIONS, RunConfig, builtin_assets
from paravt_jax.sampling.calls import call_rows
from paravt_jax.sampling.kv_cache import capacity_after, episode_capacity, first_capacity
from paravt_jax.sampling.params import SamplingParams
from paravt_jax.sft.frames import largest_frames
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs, encode
from paravt_jax.text.tokenizer import Tokenizer, TokenizerError
from paravt_jax.train.batch import plan_micro_batches
from paravt_jax.video.frames import PATCH
from paravt_jax.video.reader import Clip, VideoMetadata, blank_clip

PACK_MIN_LENGTH, PACK_MULTIPLE = 16, 256  # train/batch.pack defaults: the train length bucket


class PlanError(ValueError):
    """Bad planner input (mesh string, device count, config field); the message names it."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """Shapes of one RL step derived from the config (worst case over nFrames gating)."""
    prompts_per_step: int  # B
    samples_per_prompt: int  # G
    rollout_rows: int  # B * G
    sampler_rows: int  # rows of the rollout KV cache (power-of-two bucket of B * G)
    micro_batches: int
    micro_batch_rows: int  # rows of the largest micro-batch
    packed: bool  # token-budget micro-batches: rows carry segment ids
    episodes_per_row: int  # episodes packed into one row (1 unless the width fits several)
    max_tokens_per_micro_batch: int  # rl.max_tokens_per_micro_batch (0: rl.micro_batches equal groups)
    overview_frames: int  # K (the largest gated choice when gating is on)
    frame_size: tuple[int, int]  # overview frame (h, w) after smart_resize
    frame_tokens: int  # LLM tokens per overview frame
    crop_frames: int  # frames per crop_video call (the dispatcher's max_frames)
    crop_frame_size: tuple[int, int]
    crop_frame_tokens: int
    calls_per_turn: int
    prompt_tokens: int
    response_tokens: int  # tool responses appended per tool round (all calls of a row)
    sequence_tokens: int  # whole episode: prompt + (max_turns + 1) turns + max_turns responses
    train_length: int  # packed length bucket of the train step
    patches_per_row: int  # vision patches of one training row (frames as images, replicated)
    cache_capacity: int  # final rollout cache capacity (slots)
    cache_capacity_before_growth: int  # the capacity copied from during the last growth (0 = none)
    prefill_width: int  # first prefill chunk width
    chunk_bucket: int  # SamplerConfig.min_chunk_bucket: prefill widths are multiples of it
    prefill_capacity: int  # cache capacity at the first prefill
    extend_width: int  # chunk width of a tool-response extend
    subagent_rows: int  # sub-agent prompts per tool round (0 unless mode == subagent)
    subagent_prompt_tokens: int
    subagent_capacity: int
    # rl.share_prompts: the train step's rows also carry parent segments (its program takes
    # parent_ids); the plan still counts every episode whole, an upper bound on the shared rows
    shared_prompts: bool = False


# ----------------------------------------------------------------------------- config
def model_config(run: RunConfig) -> tuple[str, Qwen3VLConfig]:
    """(name, model config) with the run's dtypes and remat, as the command line builds it."""
    m = run.model
    if m.checkpoint:
        return m.checkpoint, load_config(m.checkpoint).replace(**m.knobs()).validate()
    return m.preset, preset(m.preset, **m.knobs())


def rl_settings(run: RunConfig):
    """(the run's RLConfig, notes): RLConfig's defaults without an `rl` section, with a note."""
    if run.rl is None:
        return SECTIONS["rl"](), ("the config has no `rl` section: RLConfig defaults are planned",)
    return run.rl, ()


@dataclasses.dataclass(frozen=True)
class Assumptions:
    """What neither the config nor the prompt builders fix, taken at a stated value (printed
    with the plan; `--question_tokens`, `--video_seconds` change them)."""
    question_tokens: int = 128  # question text of one dataset row
    video_seconds: float = 3600.0  # source video length: the digits of every "<t seconds>"
    source_frame: tuple[int, int] = (720, 1280)  # decoded frame (h, w) before smart_resize: 16:9
    source_fps: float = 30.0
    video_name: str = "video_000000.mp4"  # the basename the video-path line shows

    def text(self) -> str:
        h, w = self.source_frame
        return (f"question {self.question_tokens} tokens; {self.video_seconds:g} s video of {w}x{h} at "
                f"{self.source_fps:g} fps named {self.video_name}")


def plan_tokenizer(run: RunConfig):
    """(tokenizer, which) of the run: the checkpoint's tokenizer files when model.checkpoint
    holds them, else the built-in tokenizer (created with the built-in assets if missing, as
    a run creates it)."""
    checkpoint = run.model.checkpoint
    if checkpoint:
        try:
            return Tokenizer.from_directory(checkpoint), f"the checkpoint's ({checkpoint})"
        except TokenizerError as e:
            raise PlanError(f"config.model.checkpoint: {e}") from None
    assets = builtin_assets(run)
    return Tokenizer.from_directory(assets.model_dir), f"the built-in BPE ({assets.model_dir})"


@dataclasses.dataclass(frozen=True)
class EpisodeTokens:
    """Token counts of one full-budget episode, from the rollout's own prompt builders."""
    overview: Clip  # the overview as the rollout would read it (black frames)
    crop: Clip  # one crop_video call's frames
    prompt: ModelInputs
    response: ModelInputs  # the chunk after one tool round (all calls answered)
    final_response: ModelInputs | None  # the chunk before the final-answer turn
    subagent_prompt: ModelInputs | None
    summary_tokens: int  # generated tokens of one summary inside a response (subagent mode)
    question_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return self.prompt.length + self.question_tokens

    def response_tokens(self, calls: int, final: bool = False) -> int:
        chunk = self.final_response if final else self.response
        return chunk.length + calls * self.summary_tokens


def episode_tokens(rl, tokenizer, assumptions: Assumptions = Assumptions()) -> EpisodeTokens:
    """One episode's prompt, tool-response chunks and sub-agent prompt built by
    agent/rollout.py's builders on black frames of the sizes `read_frames` would return
    (video/reader.py `blank_clip`): every turn uses its whole budget (no stop token), every
    round makes max_parallel valid calls of max_frames frames each, every summary uses its
    whole budget. The question text is empty here; `question_tokens` is added to the prompt."""
    r, d = rl.rollout, rl.dispatch
    p, protocol = r.prompt, r.protocol
    if p.overview_visual != "images":
        raise PlanError(f"rl.rollout.prompt.overview_visual={p.overview_visual!r}: the planner sizes image overviews "
                        "only")
    a = assumptions
    meta = VideoMetadata(a.video_name, a.source_fps, max(1, round(a.video_seconds * a.source_fps)), *a.source_frame)
    pixels = dict(min_pixels=p.overview_min_pixels, max_pixels=p.overview_max_pixels, sizing=p.overview_sizing)
    frames = max(rl.nframes_choices) if rl.nframes_gating else rl.default_nframes
    if frames > 0:
        overview = blank_clip(meta, nframes=frames, **pixels)
    else:
        overview = blank_clip(meta, fps=p.overview_fps, max_frames=p.overview_max_frames, **pixels)
    episode = Episode("plan", "", "", "", a.video_name, nframes=frames)
    prompt = prompt_inputs(episode, overview, tokenizer, p)
    # One crop window of max_frames frames at the dispatcher's rate, at the video's end (the
    # longest timestamps).
    span = (d.max_frames + 1) / d.fps
    start, end = max(0.0, meta.duration - span - 1.0), meta.duration - 1.0
    crop = blank_clip(meta, fps=d.fps, start=start, end=end, min_frames=d.min_frames, max_frames=d.max_frames,
                      min_pixels=d.min_pixels, max_pixels=d.max_pixels, sizing=d.sizing)
    calls = (1 if r.mode == "sequential" else d.max_parallel) if p.tools else 0
    call = ToolCall(TOOL_NAME, {"video_path": a.video_name, "start_time": start, "end_time": end})
    results = [CropResult(CropTask(0, k, a.video_name, meta.duration, call), CropRequest(start, end), crop,
                          None, 0.0, 0.0) for k in range(calls)]
    summary_tokens, sub_prompt = 0, None
    if r.mode == "subagent":
        summary_tokens = r.subagent_max_tokens  # counted as generated; the text adds its marker
        bodies = [summary_text([], False, tokenizer)] * calls
        sub_prompt = subagent_prompt(crop, start, end, tokenizer) if calls else None
    elif protocol.frames_response == "images_first":
        bodies = images_first_messages(results)
    else:
        bodies = frames_responses(results)
    response = response_chunk(bodies, [], True, turn_prefix(p), "", r, tokenizer, prompt.next_position)
    final = (response_chunk(bodies, [], True, protocol.final_answer_prefix, protocol.final_answer_instruction, r,
                            tokenizer, prompt.next_position) if protocol.final_answer else None)
    return EpisodeTokens(overview, crop, prompt, response, final, sub_prompt, summary_tokens, a.question_tokens)


def _patches(inputs: ModelInputs) -> int:
    return int(inputs.pixel_values.shape[0] + inputs.pixel_values_videos.shape[0])


def workload(rl, vision, tokenizer, assumptions: Assumptions = Assumptions(), batch_devices: int = 1) -> Workload:
    """The token and row counts of one RL step: the episode from the rollout's prompt builders
    (`episode_tokens`), every row at the full budget; the KV cache grown as the sampler grows
    it; the train micro-batches from train/batch.py's own plan (`plan_micro_batches`: token
    budget or fixed count) over the packed episode lengths; batch_devices: the devices the
    batch axis splits over (`sharding.batch_devices`), the row multiple of token budgets."""
    r = rl.rollout
    merge_unit = vision.spatial_merge_size**2
    tokens = episode_tokens(rl, tokenizer, assumptions)
    frames = len(tokens.overview.frames)
    frame_size = tuple(int(x) for x in tokens.overview.frames.shape[1:3])
    crop_size = tuple(int(x) for x in tokens.crop.frames.shape[1:3])
    frame_tokens = (frame_size[0] // PATCH) * (frame_size[1] // PATCH) // merge_unit
    crop_tokens = (crop_size[0] // PATCH) * (crop_size[1] // PATCH) // merge_unit
    calls = (1 if r.mode == "sequential" else rl.dispatch.max_parallel) if r.prompt.tools else 0

    prompt = tokens.prompt_tokens
    response = tokens.response_tokens(calls) if calls else 0
    rounds = r.max_turns if calls else 0
    final = calls and r.protocol.final_answer and rounds
    # rounds with tool responses and a full decode turn each; the final-answer round ends with
    # the last responses and a short turn instead
    full_rounds = rounds - 1 if final else rounds
    sequence = prompt + (full_rounds + 1) * r.max_new_tokens + full_rounds * response
    if final:
        sequence += tokens.response_tokens(calls, final=True) + r.protocol.final_answer_tokens

    # The rollout cache, grown exactly as Sampler.generate / Sampler.extend grow it.
    M = r.max_new_tokens
    sampler = rl.sampler  # the trainer's sampler knobs: chunk and cache buckets follow them
    prefill_width = bucket(prompt, sampler.min_chunk_bucket)
    prefill_capacity = first_capacity(prefill_width, M, sampler.cache_multiple)
    capacity, previous = capacity_after(prefill_capacity, prefill_width, M, sampler.cache_multiple)
    write = prefill_width + M - 1
    extend_width = bucket(1 + response, sampler.min_chunk_bucket) if calls else 0  # + the pending token
    turns = [M] * full_rounds + ([r.protocol.final_answer_tokens] if final else [])
    for budget in turns:
        capacity, grew_from = capacity_after(capacity, write + extend_width, budget, sampler.cache_multiple)
        previous = grew_from or previous
        write += extend_width + budget - 1

    rows = rl.prompts_per_step * rl.samples_per_prompt
    sub_rows = sub_prompt = sub_capacity = 0
    if tokens.subagent_prompt is not None:
        sub_rows = rows * calls  # one sub-agent prompt per call of every row; batched by sampler_layout
        sub_prompt = tokens.subagent_prompt.length
        sub_capacity, _ = capacity_after(0, bucket(sub_prompt, sampler.min_chunk_bucket),
                                       r.subagent_max_tokens, sampler.cache_multiple)
    patches = _patches(tokens.prompt) + (full_rounds * _patches(tokens.response)
                                         + (_patches(tokens.final_response) if final else 0))
    # rl.shapes' fixed packed width when the episode fits it (pack falls back to its bucket)
    train_width = planned_shapes(rl).train_width
    width = train_width if train_width >= sequence else bucket(sequence, PACK_MIN_LENGTH, PACK_MULTIPLE)
    try:
        micro = plan_micro_batches([sequence] * rows, width, rl.micro_batches, rl.max_tokens_per_micro_batch,
                                   batch_devices, full_rows=train_width > 0)
    except ValueError as e:
        raise PlanError(f"rl.micro_batches={rl.micro_batches} / rl.max_tokens_per_micro_batch="
                        f"{rl.max_tokens_per_micro_batch}: {e}") from None
    per_row = max(sum(1 for p in placements if p[0] == row) for placements in micro.placements
                  for row in {p[0] for p in placements})
    return Workload(
        prompts_per_step=rl.prompts_per_step, samples_per_prompt=rl.samples_per_prompt,
        rollout_rows=rows, sampler_rows=bucket(rows, sampler.min_batch_bucket),
        micro_batches=len(micro.rows), micro_batch_rows=max(micro.rows), packed=micro.packed,
        episodes_per_row=per_row, max_tokens_per_micro_batch=rl.max_tokens_per_micro_batch,
        overview_frames=frames, frame_size=frame_size, frame_tokens=frame_tokens,
        crop_frames=len(tokens.crop.frames), crop_frame_size=crop_size, crop_frame_tokens=crop_tokens,
        calls_per_turn=calls, prompt_tokens=prompt, response_tokens=response,
        sequence_tokens=sequence, train_length=micro.width,
        patches_per_row=per_row * patches, cache_capacity=capacity, cache_capacity_before_growth=previous,
        prefill_width=prefill_width, chunk_bucket=sampler.min_chunk_bucket, prefill_capacity=prefill_capacity,
        extend_width=extend_width,
        subagent_rows=sub_rows, subagent_prompt_tokens=sub_prompt, subagent_capacity=sub_capacity,
        shared_prompts=bool(rl.share_prompts and micro.packed))


# ----------------------------------------------------------------------------- SFT
@dataclasses.dataclass(frozen=True)
class SFTWorkload:
    """Shapes of one cold-start SFT step's largest micro-batch: rows of `train_length` tokens
    packed with as many of the largest-vision examples as fit (the overview at its most frames
    and the question, no other text: the most frames a row can hold under the recipe)."""
    examples: int  # examples a step (sft.batch_size)
    frames_per_example: int  # sampled video frames of one overview (the fps cap or the largest K)
    visual: str  # images | video
    frame_size: tuple[int, int]  # (h, w) after the recipe's sizing
    frame_tokens: int  # LLM tokens of one vision frame (an image, or a video item's temporal group)
    example_tokens: int  # one example: its overview and the question
    examples_per_row: int
    micro_batches: int
    micro_batch_rows: int  # rows of the largest micro-batch
    packed: bool
    max_tokens_per_micro_batch: int
    train_length: int
    row_frames: int  # vision frames of one row (every row as full as the largest micro-batch's fullest)
    patches_per_row: int
    shared_prompts: bool = False  # SFT rows never share a prompt (RL's Workload.shared_prompts)

    # what train_batch_spec and activation_estimate read: one frame size, the row's frames
    @property
    def overview_frames(self) -> int:
        return self.row_frames

    @property
    def crop_frame_size(self) -> tuple[int, int]:
        return self.frame_size


def sft_workload(sft, vision, tokenizer, assumptions: Assumptions = Assumptions(),
                 batch_devices: int = 1) -> SFTWorkload:
    """The rows and micro-batches of one SFT step (`sft`: an SFTConfig). One example is
    sft_examples' own overview (black frames of the recipe's sampling and sizing, from the
    assumed video) and the question, encoded as sft_inputs encodes it; the step's examples are
    packed by train/batch.py's own plan (`plan_micro_batches`, as sft/trainer.py calls it). Each
    row of the largest micro-batch is counted with the most examples a row holds, their frames
    in its vision pass: an upper bound on a micro-batch's vision inputs (a row of any data holds
    at most `train_length` tokens, and shorter text only packs more overviews into it)."""
    a = assumptions
    meta = VideoMetadata(a.video_name, a.source_fps, max(1, round(a.video_seconds * a.source_fps)), *a.source_frame)
    spec = largest_frames(sft)
    clip = blank_overview(meta, spec)
    messages = [chat.Message("user", (*spec.overview(clip), chat.Text(""))), chat.Message.of("assistant", "")]
    inputs = encode(chat.render(messages), tokenizer)
    example = inputs.length + a.question_tokens
    grid = inputs.video_grid_thw if spec.visual == "video" else inputs.image_grid_thw
    frames = int(sum(t for t, _, _ in grid))  # vision frames: images, or a video item's temporal groups
    size = tuple(int(x) for x in clip.frames.shape[1:3])
    frame_tokens = (size[0] // PATCH) * (size[1] // PATCH) // vision.spatial_merge_size**2
    width = sft.train_width if sft.train_width >= example else bucket(example, PACK_MIN_LENGTH, PACK_MULTIPLE)
    try:
        micro = plan_micro_batches([example] * sft.batch_size, width, sft.micro_batches,
                                   sft.max_tokens_per_micro_batch, batch_devices, full_rows=sft.train_width > 0)
    except ValueError as e:
        raise PlanError(f"sft.micro_batches={sft.micro_batches} / sft.max_tokens_per_micro_batch="
                        f"{sft.max_tokens_per_micro_batch}: {e}") from None
    per_row = max(1, micro.width // example) if micro.packed else 1
    return SFTWorkload(
        examples=sft.batch_size, frames_per_example=len(clip.frames), visual=spec.visual, frame_size=size,
        frame_tokens=frame_tokens, example_tokens=example, examples_per_row=per_row,
        micro_batches=len(micro.rows), micro_batch_rows=max(micro.rows), packed=micro.packed,
        max_tokens_per_micro_batch=sft.max_tokens_per_micro_batch, train_length=micro.width,
        row_frames=per_row * frames, patches_per_row=per_row * _patches(inputs))


# ----------------------------------------------------------------------------- sampler calls
@dataclasses.dataclass(frozen=True)
class SamplerLayout:
    """The rollout's caches and calls as rl/trainer.py runs the sampler with the step's
    `rl.shapes` (rl/shapes.py, `step_shapes`): one prompt cache per prompt (shared by its G
    samples) at least `prompt_width` wide, one suffix cache per row sized for the whole episode
    up front (generate(reserve=...) from agent/rollout.episode_turns: never grown), the turn's
    tool responses written in pieces of `extend_width` tokens when they are text, and the
    sub-agent prompts of a tool round in `subagent_calls` calls of `subagent_rows` rows each
    (agent/responses.py `subagent_responses`), one call's caches alive at a time; with
    `rl.rollout.subagent_refill` those calls are the waves of one call whose rows are refilled
    (Sampler.sample_queued: at full budget every summary ends at once, so the same steps), a
    second prompt cache alive while a wave's prompts move in (`subagent_refill`)."""
    prompt_rows: int  # prompts, bucketed (prefix rows)
    rows: int  # prompt_rows x G (suffix rows)
    prefix_slots: int
    suffix_slots: int
    extend_width: int  # tokens of one tool-response prefill (a piece, or the bucketed chunk)
    subagent_rows: int  # rows of one sub-agent call
    subagent_prefix_slots: int
    subagent_suffix_slots: int
    prompt_frames: int = 0  # overview frames per prompt of the first prefill's vision pass
    extend_pieces: int = 1  # tool-response prefills per tool round (text written in pieces)
    subagent_calls: int = 0  # sub-agent calls per tool round
    subagent_frames: int = 0  # crop frames per sub-agent row of its vision pass
    policy: str = "per_call"  # rl.shapes.policy
    subagent_refill: bool = False  # the sub-agent calls refill one call's rows (a second prompt cache)


def planned_shapes(rl) -> StepShapes:
    """rl/shapes.py's `step_shapes` for the step's prompts on one process (the planner plans
    the rollout of all prompts over the whole mesh)."""
    return step_shapes(rl, rl.prompts_per_step)


def sampler_layout(rl, work: Workload) -> SamplerLayout:
    r, sampler = rl.rollout, rl.sampler
    if r.turn_refill:  # its refilled decode and its extends of one group of every row are other programs
        raise PlanError("rl.rollout.turn_refill=True: the planner compiles the round-by-round rollout's decode and "
                        "extends (at full budget every row's turn ends at once, where a refill changes nothing); "
                        "plan with it off")
    shapes = planned_shapes(rl)
    calls = work.calls_per_turn
    prompt_rows = call_rows(rl.prompts_per_step, shapes.prompt, sampler.min_batch_bucket)
    turns = [(0, r.max_new_tokens)] + episode_turns(r, rl.dispatch, max(calls, 1))
    suffix = episode_capacity(turns, sampler.min_chunk_bucket, sampler.cache_multiple)
    extend, pieces = work.extend_width, 1
    text_responses = work.subagent_rows > 0  # sub-agent summaries: text only (frames mode: images)
    if extend and shapes.extend_width and text_responses:  # Sampler.extend's fixed-width pieces
        extend, pieces = shapes.extend_width, -(-(1 + work.response_tokens) // shapes.extend_width)
    sub_rows = sub_calls = sub_prefix = sub_suffix = 0
    if work.subagent_rows:
        # subagent_responses: calls of subagent_shape.rows rows (all the round's prompts in one
        # call when 0), each of exactly those rows when it fits them (Sampler.generate, call_rows)
        per_call = shapes.subagent.rows or work.subagent_rows
        sub_calls = -(-work.subagent_rows // per_call)
        sub_rows = call_rows(min(per_call, work.subagent_rows), shapes.subagent, sampler.min_batch_bucket)
        sub_prefix = fit(work.subagent_prompt_tokens, shapes.subagent.width, sampler.min_chunk_bucket)
        sub_suffix = episode_capacity([(0, r.subagent_max_tokens)], sampler.min_chunk_bucket, sampler.cache_multiple)
    return SamplerLayout(prompt_rows, prompt_rows * rl.samples_per_prompt,
                         max(work.prefill_width, shapes.prompt.width), suffix, extend, sub_rows, sub_prefix,
                         sub_suffix, prompt_frames=max(work.overview_frames, shapes.prompt.frames_per_row),
                         extend_pieces=pieces, subagent_calls=sub_calls,
                         subagent_frames=max(work.crop_frames, shapes.subagent.frames_per_row),
                         policy=rl.shapes.policy, subagent_refill=bool(r.subagent_refill and sub_calls > 1))


def sampler_calls(layout: SamplerLayout, work: Workload, rl):
    """(prefill calls, decode shapes) of one rollout: the prompt prefill, the tool-response
    extend, the sub-agent prompt prefill; the main decode."""
    calls = [PrefillCall("first prompt prefill", layout.prompt_rows, layout.prefix_slots, layout.prefix_slots,
                         visual_tokens_per_row=layout.prompt_frames * work.frame_tokens)]
    if layout.extend_width:
        frames_mode = work.subagent_rows == 0
        calls.append(PrefillCall("tool-response prefill", layout.rows, layout.suffix_slots, layout.extend_width,
                                 prompts=layout.prompt_rows, prefix_slots=layout.prefix_slots,
                                 visual_tokens_per_row=(work.calls_per_turn * work.crop_frames
                                                        * work.crop_frame_tokens if frames_mode else 0)))
    if layout.subagent_rows:
        calls.append(PrefillCall("sub-agent prefill", layout.subagent_rows, layout.subagent_prefix_slots,
                                 layout.subagent_prefix_slots,
                                 visual_tokens_per_row=layout.subagent_frames * work.crop_frame_tokens))
    decode = dict(rows=layout.rows, capacity=layout.suffix_slots, prompts=layout.prompt_rows,
                  prefix_slots=layout.prefix_slots, max_new_tokens=rl.rollout.max_new_tokens,
                  # the rollout's calls (turns and sub-agents alike: agent/rollout.py sampling_params)
                  truncation=SamplingParams(top_p=rl.rollout.top_p, top_k=rl.rollout.top_k).truncates)
    return calls, decode
