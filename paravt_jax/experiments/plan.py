"""`paravt-jax plan`: per-device memory of the RL trainer and of the sampler, before a run.

    paravt-jax plan --config=configs/paragrpo.py:qwen3vl_8b --mesh=v5p-32
    paravt-jax plan --config=configs/paragrpo.py:tiny --mesh=data=1,fsdp=8,tensor=1 \
        --device_memory_gb=16 --json=runs/plan.json

Nothing is allocated. The model is built with `nnx.eval_shape`, every parameter gets the
NamedSharding that `paravt_jax.sharding` gives it on an `AbstractMesh` of the requested axis
sizes (so any device count can be planned on a laptop), and each array is counted as
`prod(sharding.shard_shape(shape)) * itemsize` bytes per device: a dimension that the mesh
does not divide is replicated, here as in a run. The optimizer state is
`jax.eval_shape(make_optimizer(...).init, params)` (the optimizer train/step.py builds),
its moments sharded like their parameters. The KV caches use the sampler's own `CacheSpec`
and `cache_sharding`.

The workload's token counts come from agent/rollout.py's own prompt and tool-response builders
on black frames of the planned sizes (`episode_tokens`), counted with the run's tokenizer; the
question length and the source video are stated assumptions (`Assumptions`). The trainer's
micro-batches are train/batch.py's own plan (`plan_micro_batches`) of those episodes.
Activations of the largest micro-batch come either from XLA (`--activations=xla`: the real
`TrainStep` gradient function lowered on abstract sharded inputs and compiled;
`memory_analysis().temp_size_in_bytes`; on a CPU machine with fewer devices than the mesh, in
a child process with fake CPU devices) or from a per-layer estimate from the shapes
(`--activations=estimate`, labelled as such; see `activation_estimate`).

Three phases are checked against the device memory:
  trainer  one optimizer step: parameters, gradients, AdamW state, the frozen reference
           (kept when kl_ctl > 0), the micro-batch inputs and its activations;
  sampler  a rollout on its own: parameters, the sampler's copy of the decoder layers and
           of an untied lm head, the KV cache of all B*G rows (and the copy
           alive while it grows), the sub-agent cache, the largest prefill's working set;
  rollout  the sampler as rl/trainer.py runs it: in the trainer's process, with the
           optimizer state and the reference still resident.
Sizes are GiB (2**30 bytes); --device_memory_gb is read as GiB too.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from paravt_jax import sharding as sh
from paravt_jax.config import config_path
from paravt_jax.experiments.programs import (
    DEPTHS,
    TARGETS,
    ProgramSet,
    Target,
    TargetError,
    compile_programs,
    resolve_target,
)
from paravt_jax.experiments.time_plan import TimePlan, format_time_plan, time_plan
from paravt_jax.models.qwen3_vl.attention import DENSE_MAX_SCORE_BYTES
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig, load_config, preset
from paravt_jax.models.qwen3_vl.hf_io import abstract_model
from paravt_jax.sampling.kv_cache import (
    CacheSpec,
    bucket,
    cache_sharding,
    episode_capacity,
    first_capacity,
    grown_capacity,
)
from paravt_jax.text.inputs import ModelInputs
from paravt_jax.video.frames import PATCH
from paravt_jax.video.reader import Clip, VideoMetadata, blank_clip

GIB = 2**30
DEFAULT_CONFIG = config_path("paragrpo") + ":tiny"
ACTIVATION_MODES = ("auto", "xla", "estimate")

# `auto` compiles with XLA up to this size (8b: ~45 s on a 2-core CPU; 32b not measured).
AUTO_XLA_MAX_PARAMETERS = 10_000_000_000
PACK_MIN_LENGTH, PACK_MULTIPLE = 16, 256  # train/batch.pack defaults: the train length bucket


class PlanError(ValueError):
    """Bad planner input (mesh string, device count, config field); the message names it."""


# ----------------------------------------------------------------------------- result types
@dataclasses.dataclass(frozen=True)
class Component:
    """One memory consumer. global_bytes: one logical copy of the arrays (unsharded)."""
    name: str
    per_device_bytes: int
    global_bytes: int
    sharding: str  # a short summary of how it is laid out on the mesh
    estimate: bool = False  # True when the number comes from a formula, not from shapes/XLA
    counted: bool = True  # False: shown for information, not added to the phase total


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    description: str
    components: tuple[Component, ...]
    device_memory_bytes: int
    note: str = ""
    compiler: str = "shapes"  # what produced the working set: "tpu", "xla:cpu", ... or "estimate"
    compile_seconds: float = 0.0

    @property
    def total_bytes(self) -> int:
        return sum(c.per_device_bytes for c in self.components if c.counted)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.device_memory_bytes

    @property
    def headroom_percent(self) -> float:
        return 100.0 * (self.device_memory_bytes - self.total_bytes) / self.device_memory_bytes

    def verdict(self) -> str:
        if self.fits:
            return f"fits (headroom {self.headroom_percent:.1f}%)"
        return (f"does NOT fit (needs {self.total_bytes / GIB:.2f} GiB, "
                f"has {self.device_memory_bytes / GIB:.2f})")


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
    subagent_rows: int  # rows of the sub-agent cache (0 unless mode == subagent)
    subagent_prompt_tokens: int
    subagent_capacity: int


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    preset: str
    parameters: int
    param_dtype: str
    compute_dtype: str
    remat: bool
    mesh: dict[str, int]
    devices: int
    device_memory_gb: float
    activations: str  # "xla" | "estimate"
    target: str  # where the programs were compiled: "tpu" | "cpu-fake" | "local" | "" (estimate)
    workload: Workload
    rows_per_device: int  # rows of the largest micro-batch each device holds (all of them when replicated)
    trainer: Phase
    sampler: Phase
    rollout: Phase
    notes: tuple[str, ...] = ()
    programs: ProgramSet | None = None
    time_plan: TimePlan | None = None

    @property
    def phases(self) -> tuple[Phase, ...]:
        return (self.trainer, self.sampler, self.rollout)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        for key, phase in zip(("trainer", "sampler", "rollout"), self.phases):
            out[key].update(total_bytes=phase.total_bytes, fits=phase.fits,
                            headroom_percent=round(phase.headroom_percent, 2))
        if self.programs is not None:
            for key, programs in (("trainer", self.programs.trainer), ("sampler", self.programs.sampler)):
                for entry, program in zip(out["programs"][key], programs):
                    entry.update(total_bytes=program.total_bytes, working_bytes=program.working_bytes)
        if self.time_plan is not None:
            out["time_plan"] = self.time_plan.to_json()
        return out


# ----------------------------------------------------------------------------- mesh
def parse_mesh(text: str) -> dict[str, int]:
    """`data=1,fsdp=8,tensor=1` -> sizes (one may be -1: the remaining devices)."""
    try:
        return sh.parse_mesh(text)
    except ValueError as e:
        raise PlanError(f"--mesh: {e}; or give a preset name from configs/meshes.py") from None


def resolve_mesh(sizes: Mapping[str, int], devices: int | None) -> dict[str, int]:
    """Fills a -1 axis from `devices` and checks the product; returns positive sizes."""
    try:
        sizes = sh.mesh_sizes(sizes, devices)
    except ValueError as e:
        raise PlanError(str(e)) from None
    free = [axis for axis, size in sizes.items() if size == -1]
    if free:
        raise PlanError(f"mesh {sizes}: axis {free[0]!r} is -1; give --devices=N")
    return sizes


def mesh_preset(name: str) -> tuple[dict[str, int], float]:
    """(axis sizes, device_memory_gb) of a preset in configs/meshes.py."""
    from configs import meshes

    try:
        entry = meshes.get_mesh(name)
        sizes = dict(meshes.mesh_shape(entry))
    except (KeyError, ValueError) as e:
        raise PlanError(f"--mesh={name!r}: {e.args[0] if e.args else e}") from None
    return sizes, float(entry["device_memory_gb"])


def abstract_mesh(sizes: Mapping[str, int]) -> AbstractMesh:
    return AbstractMesh(tuple(int(sizes[a]) for a in sh.MESH_AXES), sh.MESH_AXES)


# ----------------------------------------------------------------------------- config
def model_config(config) -> tuple[str, Qwen3VLConfig]:
    """(name, model config) with the run's dtypes and remat, as jobs.build_model builds it."""
    m = config.model
    knobs = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat=bool(m.remat),
                 scan_layers=bool(m.get("scan_layers", True)), attention=m.get("attention", "auto"),
                 attention_block=int(m.get("attention_block", 512)))
    if m.get("checkpoint", ""):
        return m.checkpoint, load_config(m.checkpoint).replace(**knobs).validate()
    return m.preset, preset(m.preset, **knobs)


def rl_settings(config):
    """The RLConfig rl/trainer.py would get (jobs.rl_config); dataclass defaults without `rl`."""
    from paravt_jax.rl.trainer import RLConfig

    if "rl" not in config:
        return RLConfig(), ("the config has no `rl` section: RLConfig defaults are planned",)
    from paravt_jax.jobs import rl_config

    return rl_config(config), ()


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


def plan_tokenizer(config):
    """(tokenizer, which) of the run: the checkpoint's tokenizer files when model.checkpoint
    holds them, else the built-in tokenizer (created with the built-in assets if missing, as
    a run creates it)."""
    from paravt_jax.text.tokenizer import Tokenizer, TokenizerError

    checkpoint = config.model.get("checkpoint", "")
    if checkpoint:
        try:
            return Tokenizer.from_directory(checkpoint), f"the checkpoint's ({checkpoint})"
        except TokenizerError as e:
            raise PlanError(f"config.model.checkpoint: {e}") from None
    from paravt_jax.jobs import builtin_assets

    assets = builtin_assets(config)
    return Tokenizer.from_directory(assets.model_dir), f"the built-in BPE ({assets.model_dir})"


def _decode_turn(capacity: int, chunk_end: int, budget: int, multiple: int) -> tuple[int, int]:
    """(capacity, the capacity before its last growth or 0) after a chunk ending at
    `chunk_end` and a decode of `budget` tokens, grown as Sampler.extend / Sampler._decode
    grow it (every row using its whole budget); `multiple` is SamplerConfig.cache_multiple."""
    previous = 0
    first = first_capacity(chunk_end, budget, multiple)
    if first > capacity:
        previous, capacity = capacity, first
    last_write = chunk_end + budget - 1  # slots written once the last token is sampled
    while capacity < last_write:
        previous, capacity = capacity, grown_capacity(capacity, capacity, last_write - capacity, multiple)
    return capacity, previous


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
    from paravt_jax.agent.dispatch import CropResult, CropTask
    from paravt_jax.agent.rollout import (
        THINK_PREFIX,
        Episode,
        frames_responses,
        images_first_messages,
        prompt_inputs,
        response_chunk,
        subagent_prompt,
        summary_text,
    )
    from paravt_jax.agent.tools import TOOL_NAME, CropRequest, ToolCall

    r, d = rl.rollout, rl.dispatch
    if r.overview_visual != "images":
        raise PlanError(f"rl.rollout.overview_visual={r.overview_visual!r}: the planner sizes image overviews only")
    a = assumptions
    meta = VideoMetadata(a.video_name, a.source_fps, max(1, round(a.video_seconds * a.source_fps)), *a.source_frame)
    pixels = dict(min_pixels=r.overview_min_pixels, max_pixels=r.overview_max_pixels, sizing=r.overview_sizing)
    frames = max(rl.nframes_choices) if rl.nframes_gating else rl.default_nframes
    if frames > 0:
        overview = blank_clip(meta, nframes=frames, **pixels)
    else:
        overview = blank_clip(meta, fps=r.overview_fps, max_frames=r.overview_max_frames, **pixels)
    episode = Episode("plan", "", "", "", a.video_name, nframes=frames)
    prompt = prompt_inputs(episode, overview, tokenizer, r)
    # One crop window of max_frames frames at the dispatcher's rate, at the video's end (the
    # longest timestamps).
    span = (d.max_frames + 1) / d.fps
    start, end = max(0.0, meta.duration - span - 1.0), meta.duration - 1.0
    crop = blank_clip(meta, fps=d.fps, start=start, end=end, min_frames=d.min_frames, max_frames=d.max_frames,
                      min_pixels=d.min_pixels, max_pixels=d.max_pixels, sizing=d.sizing)
    calls = (1 if r.mode == "sequential" else d.max_parallel) if r.tools else 0
    call = ToolCall(TOOL_NAME, {"video_path": a.video_name, "start_time": start, "end_time": end})
    results = [CropResult(CropTask(0, k, a.video_name, meta.duration, call), CropRequest(start, end), crop,
                          None, 0.0, 0.0) for k in range(calls)]
    summary_tokens, sub_prompt = 0, None
    if r.mode == "subagent":
        summary_tokens = r.subagent_max_tokens  # counted as generated; the text adds its marker
        bodies = [summary_text([], False, tokenizer)] * calls
        sub_prompt = subagent_prompt(crop, start, end, tokenizer) if calls else None
    elif r.frames_response == "images_first":
        bodies = images_first_messages(results)
    else:
        bodies = frames_responses(results)
    think = THINK_PREFIX if r.think_prefix else ""
    response = response_chunk(bodies, [], True, think, "", r, tokenizer, prompt.next_position)
    final = (response_chunk(bodies, [], True, r.final_answer_prefix, r.final_answer_instruction, r, tokenizer,
                            prompt.next_position) if r.final_answer else None)
    return EpisodeTokens(overview, crop, prompt, response, final, sub_prompt, summary_tokens, a.question_tokens)


def _patches(inputs: ModelInputs) -> int:
    return int(inputs.pixel_values.shape[0] + inputs.pixel_values_videos.shape[0])


def workload(rl, vision, tokenizer, assumptions: Assumptions = Assumptions(), batch_devices: int = 1) -> Workload:
    """The token and row counts of one RL step: the episode from the rollout's prompt builders
    (`episode_tokens`), every row at the full budget; the KV cache grown as the sampler grows
    it; the train micro-batches from train/batch.py's own plan (`plan_micro_batches`: token
    budget or fixed count) over the packed episode lengths; batch_devices: the devices the
    batch axis splits over (`sharding.batch_devices`), the row multiple of token budgets."""
    from paravt_jax.train.batch import plan_micro_batches

    r = rl.rollout
    merge_unit = vision.spatial_merge_size**2
    tokens = episode_tokens(rl, tokenizer, assumptions)
    frames = len(tokens.overview.frames)
    frame_size = tuple(int(x) for x in tokens.overview.frames.shape[1:3])
    crop_size = tuple(int(x) for x in tokens.crop.frames.shape[1:3])
    frame_tokens = (frame_size[0] // PATCH) * (frame_size[1] // PATCH) // merge_unit
    crop_tokens = (crop_size[0] // PATCH) * (crop_size[1] // PATCH) // merge_unit
    calls = (1 if r.mode == "sequential" else rl.dispatch.max_parallel) if r.tools else 0

    prompt = tokens.prompt_tokens
    response = tokens.response_tokens(calls) if calls else 0
    rounds = r.max_turns if calls else 0
    final = calls and r.final_answer and rounds
    # rounds with tool responses and a full decode turn each; the final-answer round ends with
    # the last responses and a short turn instead
    full_rounds = rounds - 1 if final else rounds
    sequence = prompt + (full_rounds + 1) * r.max_new_tokens + full_rounds * response
    if final:
        sequence += tokens.response_tokens(calls, final=True) + r.final_answer_tokens

    # The rollout cache, grown exactly as Sampler.generate / Sampler.extend grow it.
    M = r.max_new_tokens
    sampler = rl.sampler  # the trainer's sampler knobs: chunk and cache buckets follow them
    prefill_width = bucket(prompt, sampler.min_chunk_bucket)
    prefill_capacity = first_capacity(prefill_width, M, sampler.cache_multiple)
    capacity, previous = _decode_turn(prefill_capacity, prefill_width, M, sampler.cache_multiple)
    write = prefill_width + M - 1
    extend_width = bucket(1 + response, sampler.min_chunk_bucket) if calls else 0  # + the pending token
    turns = [M] * full_rounds + ([r.final_answer_tokens] if final else [])
    for budget in turns:
        capacity, grew_from = _decode_turn(capacity, write + extend_width, budget, sampler.cache_multiple)
        previous = grew_from or previous
        write += extend_width + budget - 1

    rows = rl.prompts_per_step * rl.samples_per_prompt
    sub_rows = sub_prompt = sub_capacity = 0
    if tokens.subagent_prompt is not None:
        sub_rows = bucket(rows * calls)
        sub_prompt = tokens.subagent_prompt.length
        sub_capacity, _ = _decode_turn(0, bucket(sub_prompt, sampler.min_chunk_bucket),
                                       r.subagent_max_tokens, sampler.cache_multiple)
    patches = _patches(tokens.prompt) + (full_rounds * _patches(tokens.response)
                                         + (_patches(tokens.final_response) if final else 0))
    width = bucket(sequence, PACK_MIN_LENGTH, PACK_MULTIPLE)
    try:
        micro = plan_micro_batches([sequence] * rows, width, rl.micro_batches, rl.max_tokens_per_micro_batch,
                                   batch_devices)
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
        subagent_rows=sub_rows, subagent_prompt_tokens=sub_prompt, subagent_capacity=sub_capacity)


# ----------------------------------------------------------------------------- arrays
def _shard_bytes(shape: Sequence[int], dtype, sharding: NamedSharding | None) -> tuple[int, int]:
    """(per-device bytes, global bytes) of one array."""
    itemsize = jnp.dtype(dtype).itemsize
    total = math.prod(shape) * itemsize
    if sharding is None:
        return total, total
    return math.prod(sharding.shard_shape(tuple(shape))) * itemsize, total


@dataclasses.dataclass(frozen=True)
class TreeBytes:
    per_device: int
    total: int
    leaves: int
    replicated_leaves: int
    replicated_bytes: int  # global bytes of the fully replicated leaves
    axes: tuple[str, ...]  # mesh axes any leaf is sharded over

    def summary(self) -> str:
        if not self.leaves:
            return "-"
        if self.replicated_leaves == self.leaves:
            return "replicated"
        share = 100.0 * (self.total - self.replicated_bytes) / max(self.total, 1)
        return (f"over {','.join(self.axes)}: {share:.1f}% of bytes sharded; "
                f"{self.replicated_leaves}/{self.leaves} leaves replicated")


def tree_bytes(leaves_with_shardings: Sequence[tuple[jax.ShapeDtypeStruct, NamedSharding | None]]) -> TreeBytes:
    per_device = total = replicated = replicated_bytes = 0
    axes: set[str] = set()
    for leaf, sharding in leaves_with_shardings:
        mine, whole = _shard_bytes(leaf.shape, leaf.dtype, sharding)
        per_device += mine
        total += whole
        spec = sharding.spec if sharding is not None else PartitionSpec()
        used = {a for entry in spec if entry is not None
                for a in ((entry,) if isinstance(entry, str) else entry)}
        axes |= used
        if not used:
            replicated += 1
            replicated_bytes += whole
    return TreeBytes(per_device, total, len(leaves_with_shardings), replicated, replicated_bytes,
                     tuple(a for a in sh.MESH_AXES if a in axes))


def abstract_params(config: Qwen3VLConfig):
    """(graphdef, nnx.State of Params holding ShapeDtypeStructs, non-param state)."""
    return nnx.split(abstract_model(config), nnx.Param, ...)


def param_shardings(params, mesh) -> dict[tuple[str, ...], NamedSharding]:
    """Parameter path -> the NamedSharding TrainStep / init_model give it on `mesh`."""
    out = {}
    for path, variable in nnx.to_flat_state(params):
        value = variable.get_value()
        out[tuple(str(p) for p in path)] = sh.named_sharding(mesh, sh.param_axes(variable), value.shape)
    return out


def _param_leaves(params, shardings) -> list[tuple[jax.ShapeDtypeStruct, NamedSharding]]:
    return [(variable.get_value(), shardings[tuple(str(p) for p in path)])
            for path, variable in nnx.to_flat_state(params)]


def optimizer_leaves(opt_state, params, mesh):
    """Each optimizer-state leaf with the sharding TrainStep gives it (`sharding.optimizer_shardings`)."""
    shardings = sh.optimizer_shardings(opt_state, params, mesh)
    return list(zip(jax.tree.leaves(opt_state), jax.tree.leaves(shardings)))


def _spec_text(sharding: NamedSharding) -> str:
    return str(sharding.spec).replace("PartitionSpec", "P")


# ----------------------------------------------------------------------------- activations
def _divided(value: int, parts: int) -> int:
    """value / parts when it divides (the mesh shards it), else value (replicated)."""
    return value // parts if parts > 1 and value % parts == 0 else value


def _rows_per_device(rows: int, mesh) -> int:
    sharding = sh.batch_sharding(mesh, 2, 0, batch_size=rows)
    return sharding.shard_shape((rows, 1))[0]


def _score_extent(config: Qwen3VLConfig, rows: int, heads: int, queries: int, keys: int) -> tuple[int, int, bool]:
    """(queries, keys, dense) of the attention scores live at once: the whole [queries, keys]
    array for dense attention (and for `auto` where it picks dense: a small score array), else
    one [block, block] tile (blockwise; the fused cuDNN/splash kernels are counted alike, an
    estimate: their tiles are not measured here)."""
    implementation = config.attention
    small = rows * heads * queries * keys * 4 <= DENSE_MAX_SCORE_BYTES
    if implementation == "dense" or (implementation == "auto" and small):
        return queries, keys, True
    block = config.attention_block
    return min(block, queries), min(block, keys), False


def _text_layer_bytes(config: Qwen3VLConfig, rows: int, queries: int, keys: int, tensor: int,
                      attention_bytes: int | None = None) -> int:
    """Working set of one decoder layer for `rows` x `queries` tokens attending to `keys`:
    `attention_bytes` per attention score (default: f32 logits + softmax probs in the compute
    dtype) + the bool mask (tiled over the query-head groups), q/k/v before and after norm +
    rotary, the attention output, the MLP's gate/up/product, the norms and residual adds."""
    t = config.text
    c = jnp.dtype(config.dtype).itemsize
    heads = _divided(t.num_attention_heads, tensor)
    kv = _divided(t.num_key_value_heads, tensor)
    mlp = _divided(t.intermediate_size, tensor)
    groups = max(t.num_attention_heads // t.num_key_value_heads, 1)
    per_score = 4 + c if attention_bytes is None else attention_bytes
    score_queries, score_keys, dense = _score_extent(config, rows, heads, queries, keys)
    attention = rows * heads * score_queries * score_keys * per_score
    if dense:  # the [rows, queries, keys] mask, tiled over the query-head groups
        attention += rows * queries * keys * (1 + groups)
    linear = rows * queries * (6 * t.hidden_size + 3 * (heads + 2 * kv) * t.head_dim + 3 * mlp) * c
    return attention + linear


def _vision_block_bytes(config: Qwen3VLConfig, patches: int, image_patches: int, tensor: int) -> int:
    """One ViT block over `patches` patches in images of `image_patches` each: attention
    logits/probs per image, qkv, two layer norms, the MLP, residual adds."""
    v = config.vision
    c = jnp.dtype(config.dtype).itemsize
    heads = _divided(v.num_heads, tensor)
    mlp = _divided(v.intermediate_size, tensor)
    attention = patches * heads * image_patches * (4 + c)
    linear = patches * (8 * v.hidden_size + 2 * mlp) * c
    return attention + linear


def _vision_outputs_bytes(config: Qwen3VLConfig, patches: int) -> int:
    """Merged tokens + DeepStack features handed to the decoder."""
    c = jnp.dtype(config.dtype).itemsize
    merged = patches // config.vision.spatial_merge_size**2
    return (1 + len(config.vision.deepstack_visual_indexes)) * merged * config.text.hidden_size * c


def activation_estimate(config: Qwen3VLConfig, work: Workload, mesh_sizes: Mapping[str, int],
                        logprob_chunk: int = 512) -> int:
    """Per-device activation bytes of one micro-batch's gradient pass, from shapes.

    rows: the micro-batch's rows per device (batch over data x fsdp when it divides); heads,
    KV heads, MLP and vocab per device divided by `tensor` when it divides.
      text, remat off:  L x saved + backward      (every layer's residuals + one layer's backward)
      text, remat on:   L x rows x T x d x c + working   (layer inputs + one layer recomputed
                        and differentiated)
      saved:            one layer (_text_layer_bytes) at 12 + c bytes per attention score (f32
                        scores before and after the mask, f32 softmax, probs in the compute dtype)
      backward:         one layer at 8 bytes per score (f32 d-probs and d-scores)
      working:          one layer at 8 + 2c bytes per score (f32 scores and softmax, d-probs and
                        d-scores in the compute dtype)
    The per-score byte counts are calibrated against XLA's buffer assignment (CPU) of the real
    gradient function for tiny, small125m (remat on and off) and 2b (README: plan section).
      head:             3 x rows x chunk x vocab x 4 (one chunk's f32 logits, softmax and
                        gradient: the chunked log-prob scan recomputes each chunk's logits in
                        its backward pass and keeps only its hidden inputs)
      vision:           the same rule over depth blocks, over ALL patches of the micro-batch
                        (the vision inputs are replicated, not split by rows), + its outputs
    """
    mesh = abstract_mesh(mesh_sizes)
    tensor = mesh_sizes["tensor"]
    t, v = config.text, config.vision
    c = jnp.dtype(config.dtype).itemsize
    rows = _rows_per_device(work.micro_batch_rows, mesh)
    length = work.train_length
    layer = lambda per_score: _text_layer_bytes(config, rows, length, length, tensor, per_score)
    if config.remat:
        text = t.num_hidden_layers * rows * length * t.hidden_size * c + layer(8 + 2 * c)
    else:
        text = t.num_hidden_layers * layer(12 + c) + layer(8)
    chunk = min(logprob_chunk, length)
    head = 3 * chunk * rows * _divided(t.vocab_size, tensor) * 4
    patches = work.micro_batch_rows * work.patches_per_row
    image = (work.frame_size[0] // PATCH) * (work.frame_size[1] // PATCH)
    block = _vision_block_bytes(config, patches, image, tensor)
    saved = patches * v.hidden_size * c if config.remat else block
    vision = v.depth * saved + 2 * block + _vision_outputs_bytes(config, patches)
    return text + head + vision


def prefill_estimate(config: Qwen3VLConfig, rl, work: Workload, mesh_sizes: Mapping[str, int]) -> tuple[int, str]:
    """(bytes, which call) of the largest sampler prefill working set, for ONE row group of
    each call (sampler_calls; at most the token budget in all): one decoder layer
    over the group's chunk attending to its prefix and cache (f32 logits), that layer's K/V,
    the chunk's hidden states, and the vision tower's one-block working set + outputs for the
    group's frames (vision inputs replicated). Forward only, one layer live at a time."""
    from paravt_jax.sampling.backend import backend_policy
    from paravt_jax.sampling.chunks import prefill_group

    mesh = abstract_mesh(mesh_sizes)
    tensor = mesh_sizes["tensor"]
    t = config.text
    c = jnp.dtype(config.dtype).itemsize
    budget = backend_policy("gpu", prefill_tokens=rl.sampler.prefill_tokens).prefill_tokens
    merge_unit = config.vision.spatial_merge_size**2
    frame = (work.frame_size[0] // PATCH) * (work.frame_size[1] // PATCH)
    crop = (work.crop_frame_size[0] // PATCH) * (work.crop_frame_size[1] // PATCH)
    calls, _ = sampler_calls(sampler_layout(rl, work), work, rl)
    best, label = 0, ""
    for call in calls:
        shards = call.rows // _rows_per_device(call.rows, mesh)
        prompts = call.prompts or call.rows
        # every device computes a layer for all of the group's tokens (see sampler.prefill_group)
        group = prefill_group(call.rows, call.rows // prompts, call.width,
                              shards if prompts % shards == 0 else 1, budget)
        keys = call.capacity + call.prefix_slots
        kv = _divided(t.num_key_value_heads, tensor)
        layer = _text_layer_bytes(config, group, call.width, keys, tensor)
        layer += 2 * group * kv * keys * t.head_dim * c + 2 * group * call.width * t.hidden_size * c
        patches = group * call.visual_tokens_per_row * merge_unit
        image = frame if call.name.startswith("first") else crop
        vision_out = _vision_outputs_bytes(config, patches) if patches else 0
        vision = _vision_block_bytes(config, patches, image, tensor) + vision_out if patches else 0
        total = max(layer + vision_out, vision)
        if total > best:
            best, label = total, call.name
    return best, label


def train_batch_spec(config: Qwen3VLConfig, work: Workload, mesh) -> dict:
    """The abstract micro-batch TrainStep.grads receives for the policy loss: token arrays and
    per-token extras split over the batch
    axis as TrainStep._place splits them, vision inputs replicated, the vision layout with
    the shapes vision_layout gives for frames of one size."""
    rows, length = work.micro_batch_rows, work.train_length
    replicated = NamedSharding(mesh, PartitionSpec())

    def tokens(shape, dtype, axis=0):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sh.batch_sharding(mesh, len(shape), axis,
                                                                              batch_size=rows))

    def host(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)

    patches = rows * work.patches_per_row
    image = (work.frame_size[0] // PATCH) * (work.frame_size[1] // PATCH)
    crop = (work.crop_frame_size[0] // PATCH) * (work.crop_frame_size[1] // PATCH)
    overview_images = rows * work.overview_frames
    crop_images = (patches - overview_images * image) // crop if patches > overview_images * image else 0
    counts = {image: overview_images}
    if crop_images:
        counts[crop] = counts.get(crop, 0) + crop_images
    groups = tuple(host((counts[size], size), jnp.int32) for size in sorted(counts))
    meta = (host((patches, 4), jnp.int32), host((patches, 4), jnp.float32), host((patches, 2), jnp.int32),
            groups, host((patches,), jnp.int32))
    return dict(input_ids=tokens((rows, length), jnp.int32),
                attention_mask=tokens((rows, length), jnp.int32),
                position_ids=tokens((3, rows, length), jnp.int32, axis=1),
                loss_mask=tokens((rows, length), jnp.int32),
                advantages=tokens((rows, length), jnp.float32),
                behaviour_logp=tokens((rows, length), jnp.float32),
                prox_logp=tokens((rows, length), jnp.float32),
                visual_index=tokens((rows, length), jnp.int32),
                pixel_values=host((patches, config.vision.patch_dim), jnp.float32),
                vision_meta=meta, **({"segment_ids": tokens((rows, length), jnp.int32)} if work.packed else {}))


CHILD_TIMEOUT_S = 3600
CHILD_FUNCTIONS = ("compile_programs",)  # what on_fake_devices may run


def on_fake_devices(function, args: tuple, devices: int):
    """`function(*args)` in a child Python process with `devices` fake CPU devices (XLA fixes
    the device count when a process starts). `function` is one of this module's XLA
    measurements (CHILD_FUNCTIONS); the arguments (the very config objects, overrides applied)
    go over a pipe as a pickle and the result comes back through a temporary file."""
    import pickle
    import subprocess
    import sys
    import tempfile

    if function.__name__ not in CHILD_FUNCTIONS:
        raise ValueError(f"on_fake_devices: {function.__name__} is not one of {CHILD_FUNCTIONS}")
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        answer = os.path.join(tmp, "result.pickle")
        try:
            done = subprocess.run([sys.executable, "-m", "paravt_jax.experiments.plan", "--xla-child", answer],
                                  input=pickle.dumps((function.__name__, args)), capture_output=True, env=env,
                                  timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PlanError(f"--activations=xla: the compile on {devices} fake CPU devices ran past "
                            f"{CHILD_TIMEOUT_S} s; use --activations=estimate") from None
        if done.returncode != 0 or not os.path.exists(answer):
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-15:]
            raise PlanError(f"--activations=xla: the compile on {devices} fake CPU devices (a child process with "
                            f"XLA_FLAGS=--xla_force_host_platform_device_count={devices}) failed with exit status "
                            f"{done.returncode}:\n" + "\n".join(tail))
        with open(answer, "rb") as f:
            return pickle.load(f)


def _xla_child(answer: str) -> None:
    """The child side of `on_fake_devices`: (function name, args) pickled on stdin, the result
    pickled to `answer`."""
    import pickle
    import sys

    name, args = pickle.loads(sys.stdin.buffer.read())
    if name not in CHILD_FUNCTIONS:
        raise SystemExit(f"child process: {name!r} is not one of {CHILD_FUNCTIONS}")
    result = globals()[name](*args)
    with open(answer, "wb") as f:
        pickle.dump(result, f)


# ----------------------------------------------------------------------------- sampler phase
@dataclasses.dataclass(frozen=True)
class SamplerLayout:
    """The rollout's caches as sampling/sampler.py lays them out: one prompt cache per prompt
    (shared by its G samples), one suffix cache per row sized for the whole episode up front
    (generate(reserve=...) from agent/rollout.episode_turns: never grown), and the sub-agent
    call's caches (its prompts are its prefixes, one sample each)."""
    prompt_rows: int  # prompts, bucketed (prefix rows)
    rows: int  # prompt_rows x G (suffix rows)
    prefix_slots: int
    suffix_slots: int
    extend_width: int
    subagent_rows: int
    subagent_prefix_slots: int
    subagent_suffix_slots: int


def sampler_layout(rl, work: Workload) -> SamplerLayout:
    from paravt_jax.agent.rollout import episode_turns

    r, sampler = rl.rollout, rl.sampler
    calls = work.calls_per_turn
    prompt_rows = bucket(rl.prompts_per_step, sampler.min_batch_bucket)
    turns = [(0, r.max_new_tokens)] + episode_turns(r, rl.dispatch, max(calls, 1))
    suffix = episode_capacity(turns, sampler.min_chunk_bucket, sampler.cache_multiple)
    sub_prefix = sub_suffix = 0
    if work.subagent_rows:
        sub_prefix = bucket(work.subagent_prompt_tokens, sampler.min_chunk_bucket)
        sub_suffix = episode_capacity([(0, r.subagent_max_tokens)], sampler.min_chunk_bucket, sampler.cache_multiple)
    return SamplerLayout(prompt_rows, prompt_rows * rl.samples_per_prompt, work.prefill_width, suffix,
                         work.extend_width, work.subagent_rows, sub_prefix, sub_suffix)


def sampler_calls(layout: SamplerLayout, work: Workload, rl):
    """(prefill calls, decode shapes) of one rollout: the prompt prefill, the tool-response
    extend, the sub-agent prompt prefill; the main decode."""
    from paravt_jax.sampling.memory import PrefillCall

    calls = [PrefillCall("first prompt prefill", layout.prompt_rows, layout.prefix_slots, layout.prefix_slots,
                         visual_tokens_per_row=work.overview_frames * work.frame_tokens)]
    if layout.extend_width:
        frames_mode = work.subagent_rows == 0
        calls.append(PrefillCall("tool-response prefill", layout.rows, layout.suffix_slots, layout.extend_width,
                                 prompts=layout.prompt_rows, prefix_slots=layout.prefix_slots,
                                 visual_tokens_per_row=(work.calls_per_turn * work.crop_frames
                                                        * work.crop_frame_tokens if frames_mode else 0)))
    if layout.subagent_rows:
        calls.append(PrefillCall("sub-agent prefill", layout.subagent_rows, layout.subagent_prefix_slots,
                                 layout.subagent_prefix_slots,
                                 visual_tokens_per_row=work.crop_frames * work.crop_frame_tokens))
    decode = dict(rows=layout.rows, capacity=layout.suffix_slots, prompts=layout.prompt_rows,
                  prefix_slots=layout.prefix_slots, max_new_tokens=rl.rollout.max_new_tokens)
    return calls, decode


def sampler_components(config: Qwen3VLConfig, rl, work: Workload, mesh_sizes: Mapping[str, int],
                       programs: ProgramSet | None) -> tuple[tuple[Component, ...], Component, list[str]]:
    """(cache rows, the largest working set, notes) of the sampler phase."""
    mesh = abstract_mesh(mesh_sizes)
    t = config.text
    cache_dtype = jnp.dtype(rl.sampler.cache_dtype or config.dtype).name
    layout = sampler_layout(rl, work)

    def cache_row(label, rows, capacity):
        spec = CacheSpec(t.num_hidden_layers, rows, capacity, t.num_key_value_heads, t.head_dim, cache_dtype)
        sharding = cache_sharding(mesh, spec)
        keys, _ = _shard_bytes(spec.key_layer_shape, cache_dtype, sharding and sharding.keys)
        values, _ = _shard_bytes(spec.layer_shape, cache_dtype, sharding and sharding.values)
        text = "unsharded" if sharding is None else _spec_text(sharding.values)
        return Component(label, spec.layers * (keys + values), spec.bytes, f"k+v, {spec.layers} layers, values {text}")

    rows = [cache_row(f"prompt KV cache ({layout.prompt_rows} prompts x {layout.prefix_slots} slots, "
                      f"shared by {rl.samples_per_prompt} samples)", layout.prompt_rows, layout.prefix_slots),
            cache_row(f"KV cache ({layout.rows} rows x {layout.suffix_slots} slots after the prompt)",
                      layout.rows, layout.suffix_slots)]
    if layout.subagent_rows:
        prompts = cache_row("sub-agent", layout.subagent_rows, layout.subagent_prefix_slots)
        own = cache_row("sub-agent", layout.subagent_rows, layout.subagent_suffix_slots)
        rows.append(dataclasses.replace(
            prompts, name=f"sub-agent KV cache ({layout.subagent_rows} rows x "
                          f"{layout.subagent_prefix_slots} + {layout.subagent_suffix_slots} slots)",
            per_device_bytes=prompts.per_device_bytes + own.per_device_bytes,
            global_bytes=prompts.global_bytes + own.global_bytes))
    notes = ["no cache growth copy: the rollout sizes each row's cache for its whole episode up front"]
    if programs is not None:
        best = max(programs.sampler, key=lambda p: p.working_bytes)
        notes.append("sampler working sets (temp + the call's own inputs, per device): " + "; ".join(
            f"{p.name} {p.working_bytes / GIB:.2f} GiB ({p.group_rows} rows per call)" for p in programs.sampler))
        working = Component(f"prefill/decode working set ({programs.compiler}, {best.name})", best.working_bytes,
                            best.working_bytes, f"{programs.compiler} buffer assignment")
        code = sum(p.code_bytes for p in programs.sampler)
        rows.append(Component(f"generated code ({programs.compiler}, {len(programs.sampler)} programs)", code, code,
                              "per device"))
    else:
        size, which = prefill_estimate(config, rl, work, mesh_sizes)
        working = Component(f"prefill working set (ESTIMATE, {which})", size, size, "one layer + vision block",
                            estimate=True)
    return tuple(rows), working, notes


# ----------------------------------------------------------------------------- the plan
def plan(config, mesh_sizes: Mapping[str, int], device_memory_gb: float,
         activations: str = "estimate", assumptions: Assumptions = Assumptions(), tokenizer=None,
         target: Target | None = None, depth: str = "auto", chip: str = "") -> MemoryPlan:
    """Per-device memory of the trainer, the sampler and the co-located rollout phase.

    config: an ml_collections config as `paravt-jax train` takes (model, rl sections);
    mesh_sizes: {"data", "fsdp", "tensor"} positive sizes; device_memory_gb: GiB per device;
    activations: "estimate" | "xla" | "auto" (xla when the local devices can host the mesh, or
    they are CPUs (a child process fakes the devices), and the model has at most
    AUTO_XLA_MAX_PARAMETERS parameters); assumptions: what the config does not fix;
    tokenizer: counts the prompt text (default: the run's, `plan_tokenizer`); target: where the
    programs compile (programs.py; default XLA:CPU on fake CPU devices planning gpu kernels);
    depth: full or extrapolated programs (programs.py); chip: the accelerator whose peaks the
    time plan uses (time_plan.CHIPS; "" = no time plan).
    """
    if activations not in ACTIVATION_MODES:
        raise PlanError(f"--activations={activations!r}: expected one of {', '.join(ACTIVATION_MODES)}")
    if device_memory_gb is None or not device_memory_gb > 0:
        raise PlanError(f"--device_memory_gb={device_memory_gb!r} must be > 0")
    sizes = resolve_mesh(mesh_sizes, None)
    memory = int(device_memory_gb * GIB)
    mesh = abstract_mesh(sizes)
    name, model = model_config(config)
    rl, notes = rl_settings(config)
    notes = list(notes)
    which = "given by the caller"
    if tokenizer is None:
        tokenizer, which = plan_tokenizer(config)
    work = workload(rl, model.vision, tokenizer, assumptions, sh.batch_devices(mesh))
    notes.append(f"token counts: agent/rollout.py's prompt and tool-response builders on frames of the planned "
                 f"sizes, every turn, call and summary at its full budget; tokenizer: {which}; assumed "
                 f"{assumptions.text()}")

    # Parameters, gradients, optimizer state, reference: real abstract trees, real shardings.
    from paravt_jax.train.step import make_optimizer

    _, params, _ = abstract_params(model)
    shardings = param_shardings(params, mesh)
    p = tree_bytes(_param_leaves(params, shardings))
    count = sum(math.prod(v.get_value().shape) for _, v in nnx.to_flat_state(params))
    opt_state = jax.eval_shape(make_optimizer(rl.optimizer).init, params)
    o = tree_bytes(optimizer_leaves(opt_state, params, mesh))
    keep_reference = rl.advantage.kl_ctl > 0
    gradient_copies = 2 if work.micro_batches > 1 else 1
    param_row = Component("parameters", p.per_device, p.total, p.summary())
    grad_row = Component("gradients" + (" (accumulator + micro-batch)" if gradient_copies > 1 else ""),
                         gradient_copies * p.per_device, gradient_copies * p.total, "as parameters")
    opt_row = Component(f"optimizer state ({rl.optimizer.name}: mu, nu, counts)", o.per_device, o.total,
                        "as parameters; counts replicated")
    reference_row = Component("frozen reference (kl_ctl > 0)" if keep_reference else
                              "frozen reference (none: kl_ctl = 0)",
                              p.per_device if keep_reference else 0, p.total if keep_reference else 0,
                              "as parameters" if keep_reference else "-")

    per_device_rows = _rows_per_device(work.micro_batch_rows, mesh)
    if per_device_rows == work.micro_batch_rows and sizes["data"] * sizes["fsdp"] > 1:
        notes.append(f"the micro-batch's {work.micro_batch_rows} rows do not divide data x fsdp = "
                     f"{sizes['data'] * sizes['fsdp']}: every device holds all rows (replicated batch)")
    batch = train_batch_spec(model, work, mesh)
    b = tree_bytes([(leaf, leaf.sharding) for leaf in jax.tree.leaves(batch)])
    batch_row = Component(f"micro-batch inputs ({work.micro_batch_rows} rows x {work.train_length})",
                          b.per_device, b.total, "tokens over batch axes; pixels replicated")
    mode = activations
    if mode == "auto":
        local = jax.devices()
        fits_locally = math.prod(sizes.values()) <= len(local) or local[0].platform == "cpu"
        mode = "xla" if (target is not None and target.name == "tpu") or (
            fits_locally and count <= AUTO_XLA_MAX_PARAMETERS) else "estimate"
    programs = None
    if mode == "xla":
        target = target or Target("cpu-fake", "gpu")
        try:
            programs = compile_programs(model, rl, work, sampler_layout(rl, work), sizes, target, depth)
        except TargetError as e:
            raise PlanError(str(e)) from None
        except ValueError as e:  # a kernel the target platform has not (attention.resolve)
            if str(e).startswith("model.attention="):
                raise PlanError(str(e)) from None
            raise
        need = math.prod(sizes.values())
        where = (f" on {need} fake CPU devices (child process)" if target.name == "cpu-fake" and (
            need > jax.device_count() or jax.devices()[0].platform != "cpu") else "")
        notes.append(f"programs: compiled by {programs.compiler}{where} ({target.name}"
                     + (f", topology {target.topology}" + (f" x {target.slices} slices" if target.slices > 1 else "")
                        if target.topology else "")
                     + f"), {programs.depth}; {programs.compile_seconds:.1f} s to compile")
        busiest = max(programs.trainer, key=lambda p: p.temp_bytes)
        temp = busiest.temp_bytes
        act_row = Component(f"activations ({programs.compiler} temp of {busiest.name}, largest micro-batch)", temp,
                            temp, f"{programs.compiler} buffer assignment")
        code = sum(p.code_bytes for p in programs.trainer)
        code_row = Component(f"generated code ({programs.compiler}, {len(programs.trainer)} programs)", code, code,
                             "per device")
    else:
        temp = activation_estimate(model, work, sizes, rl.step.logprob_chunk)
        act_row = Component("activations (ESTIMATE, largest micro-batch)", temp, temp,
                            f"remat {'on' if model.remat else 'off'}; per-layer formula", estimate=True)
        code_row = None
    compiler = programs.compiler if programs else "estimate"
    trainer = Phase("trainer", "one optimizer step", tuple(r for r in (param_row, grad_row, opt_row, reference_row,
                                                                       batch_row, act_row, code_row) if r),
                    memory, compiler=compiler,
                    compile_seconds=sum(p.seconds for p in programs.trainer) if programs else 0.0)

    # Sampler: the KV caches with the sampler's CacheSpec and cache_sharding, laid out as
    # sampling/sampler.py lays them out, and the working sets of its programs.
    cache_rows, prefill_row, sampler_notes = sampler_components(model, rl, work, sizes, programs)
    notes += sampler_notes
    # Sampler.weights: a per-layer copy of the decoder layers and of an untied lm head
    # (dropped before the update)
    layer_leaves = [(variable.get_value(), shardings[tuple(str(x) for x in path)])
                    for path, variable in nnx.to_flat_state(params)
                    if tuple(str(x) for x in path[:2]) in (("language", "layers"), ("language", "lm_head"))]
    lb = tree_bytes(layer_leaves)
    copies_row = Component("decoder layer + lm head copies (Sampler.weights)", lb.per_device, lb.total,
                           "per-layer buffers; sharded as the stacked parameters")
    sampler_rows = (param_row, copies_row, *cache_rows, prefill_row)
    sampler_seconds = sum(p.seconds for p in programs.sampler) if programs else 0.0
    sampler = Phase("sampler", "a rollout on its own (parameters + caches)", sampler_rows, memory,
                    compiler=compiler, compile_seconds=sampler_seconds)
    rollout = Phase("rollout", "the sampler inside rl/trainer.py: optimizer state and reference stay resident",
                    (param_row, opt_row, reference_row, *sampler_rows[1:]), memory, compiler=compiler,
                    compile_seconds=sampler_seconds)
    timing = None
    if programs is not None and chip:
        timing = time_plan(programs, rl, work, sampler_layout(rl, work), model, chip, sizes, per_device_rows)
    return MemoryPlan(
        preset=name, parameters=count, param_dtype=model.param_dtype, compute_dtype=model.dtype,
        remat=model.remat, mesh=sizes, devices=math.prod(sizes.values()), device_memory_gb=float(device_memory_gb),
        activations=mode, target=target.name if programs else "", workload=work, rows_per_device=per_device_rows,
        trainer=trainer, sampler=sampler, rollout=rollout, notes=tuple(notes), programs=programs, time_plan=timing)


# ----------------------------------------------------------------------------- output
def _size(n: int) -> str:
    if n == 0:
        return "0"
    for unit, scale in (("GiB", GIB), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 2**10:.2f} KiB"


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def format_plan(result: MemoryPlan) -> str:
    w = result.workload
    mesh = " ".join(f"{a}={s}" for a, s in result.mesh.items())
    lines = [
        f"paravt-jax memory plan: {result.preset} ({_count(result.parameters)} parameters; "
        f"param {result.param_dtype}, compute {result.compute_dtype}, remat {'on' if result.remat else 'off'})",
        f"mesh {mesh} ({result.devices} devices); device memory {result.device_memory_gb:g} GiB",
        f"workload: {w.prompts_per_step} prompts x {w.samples_per_prompt} samples = {w.rollout_rows} rows "
        f"(sampler {w.sampler_rows}); K <= {w.overview_frames} frames of {w.frame_size[0]}x{w.frame_size[1]} "
        f"({w.frame_tokens} tokens); {w.calls_per_turn} calls per round of {w.crop_frames} frames of "
        f"{w.crop_frame_size[0]}x{w.crop_frame_size[1]} ({w.crop_frame_tokens} tokens)",
        f"tokens: prompt {w.prompt_tokens}, tool responses {w.response_tokens} per round, episode "
        f"{w.sequence_tokens} (train length {w.train_length})"
        + (f"; sub-agent prompt {w.subagent_prompt_tokens}" if w.subagent_rows else ""),
        f"micro-batches: {w.micro_batches} of <= {w.micro_batch_rows} rows x {w.train_length} "
        + (f"(budget {w.max_tokens_per_micro_batch} tokens, {w.episodes_per_row} episode(s) per row)"
           if w.max_tokens_per_micro_batch else "(rl.micro_batches equal groups)")
        + f"; {result.rows_per_device} row(s) per device",
    ]
    width = max(len(c.name) for phase in result.phases for c in phase.components) + 2
    for phase in result.phases:
        compiled = (f" [{phase.compiler}, {phase.compile_seconds:.1f} s to compile]" if phase.compile_seconds
                    else f" [{phase.compiler}]")
        lines += ["", f"{phase.name.upper()}: {phase.description}{compiled}",
                  f"  {'component':<{width}}{'per device':>12}  {'global':>12}  sharding"]
        for c in phase.components:
            mark = "" if c.counted else "  (not in total)"
            lines.append(f"  {c.name:<{width}}{_size(c.per_device_bytes):>12}  {_size(c.global_bytes):>12}  "
                         f"{c.sharding}{mark}")
        lines.append(f"  {'total':<{width}}{_size(phase.total_bytes):>12}")
        lines.append(f"  => {phase.verdict()}" + (f" on {result.device_memory_gb:g} GiB" if phase.fits else ""))
    if result.programs is not None:
        lines += format_programs(result.programs, result.device_memory_gb)
    if result.time_plan is not None:
        lines += format_time_plan(result.time_plan)
    if result.notes:
        lines += [""] + [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def format_programs(programs: ProgramSet, device_memory_gb: float) -> list[str]:
    """Each compiled program's per-device memory (arguments + outputs - aliased + temps + code)
    against the device memory, its compile seconds and attention kernels."""
    lines = ["", f"PROGRAMS: compiled by {programs.compiler}, {programs.depth}; per device",
             f"  {'program':<38}{'arguments':>11}{'outputs':>11}{'temps':>11}{'code':>11}{'total':>11}"
             f"{'of HBM':>8}{'compile s':>11}  attention"]
    for phase, group in (("trainer", programs.trainer), ("sampler", programs.sampler)):
        for p in group:
            share = 100 * p.total_bytes / (device_memory_gb * GIB)
            lines.append(f"  {p.name:<38}{_size(p.argument_bytes):>11}{_size(p.output_bytes - p.alias_bytes):>11}"
                         f"{_size(p.temp_bytes):>11}{_size(p.code_bytes):>11}{_size(p.total_bytes):>11}"
                         f"{share:>7.1f}%{p.seconds:>11.1f}  {','.join(p.attention) or '-'}")
        lines.append(f"  {phase} programs: {sum(p.seconds for p in group):.1f} s to compile")
    return lines


def _device_memory_default() -> float | None:
    stats = jax.devices()[0].memory_stats() if hasattr(jax.devices()[0], "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return stats["bytes_limit"] / GIB
    return None


def main(argv: list[str]) -> MemoryPlan:
    """`paravt-jax plan --config=FILE[:ARG] [--config.x=y] [--mesh=...] [--devices=N]
    [--device_memory_gb=G] [--activations=auto|xla|estimate] [--target=auto|cpu-fake|tpu|local]
    [--depth=auto|extrapolate|full] [--chip=NAME] [--json=PATH] [--question_tokens=N] [--video_seconds=S]`."""
    from absl import flags

    from paravt_jax.flags import UsageError, define_config, parse_flags

    argv = list(argv)
    values = flags.FlagValues()
    define_config(values, DEFAULT_CONFIG, argv)
    flags.DEFINE_string("mesh", "", "AXIS=SIZE list (data=1,fsdp=8,tensor=1) or a configs/meshes.py "
                        "preset name; default: config.mesh", flag_values=values)
    flags.DEFINE_integer("devices", None, "device count (fills a -1 mesh axis)", flag_values=values)
    flags.DEFINE_float("device_memory_gb", None, "memory per device in GiB (default: the mesh "
                       "preset's, else the local device's)", flag_values=values)
    flags.DEFINE_enum("activations", "auto", list(ACTIVATION_MODES), "activation numbers: XLA "
                      "memory analysis or the shape estimate", flag_values=values)
    flags.DEFINE_string("json", "", "also write the plan as JSON to this path", flag_values=values)
    flags.DEFINE_enum("target", "auto", list(TARGETS), "where the programs compile: cpu-fake (XLA:CPU on fake "
                      "devices), tpu (libtpu for the preset's TPU topology, from this CPU process), local (the "
                      "devices present); auto: tpu for TPU presets when libtpu is importable", flag_values=values)
    flags.DEFINE_enum("depth", "auto", list(DEPTHS), "full programs, or extrapolated per layer from two "
                      "reduced depths (auto: extrapolate past 8 layers)", flag_values=values)
    flags.DEFINE_string("chip", "", "accelerator of the time plan (v5p, v5e, v6e, v4, h100, h200, a100); "
                        "default: the mesh preset's", flag_values=values)
    flags.DEFINE_integer("question_tokens", Assumptions.question_tokens, "assumed tokens of one question",
                         flag_values=values)
    flags.DEFINE_float("video_seconds", Assumptions.video_seconds, "assumed video length (the digits of "
                       "every frame's timestamp)", flag_values=values)
    parse_flags(values, argv, "usage: " + main.__doc__.strip().strip("`"), show_config=True)
    try:
        memory = values.device_memory_gb
        text = values.mesh.strip()
        entry = None
        if text and "=" not in text:
            sizes, preset_memory = mesh_preset(text)
            memory = memory if memory is not None else preset_memory
            from configs import meshes

            entry = meshes.get_mesh(text)
        else:
            sizes = parse_mesh(text) if text else {a: int(values.config.mesh.get(a, 1)) for a in sh.MESH_AXES}
        devices = values.devices
        if devices is None and -1 in sizes.values():
            devices = jax.device_count()
        sizes = resolve_mesh(sizes, devices)
        memory = memory if memory is not None else _device_memory_default()
        if memory is None:
            raise PlanError(f"no device memory known for {jax.devices()[0].platform}: give "
                            "--device_memory_gb=G or a --mesh preset")
        if values.question_tokens < 0 or not values.video_seconds > 0:
            raise PlanError(f"--question_tokens={values.question_tokens} must be >= 0 and "
                            f"--video_seconds={values.video_seconds} > 0")
        assumptions = Assumptions(question_tokens=values.question_tokens, video_seconds=values.video_seconds)
        try:
            target = resolve_target(values.target, entry)
        except TargetError as e:
            raise PlanError(str(e)) from None
        if values.target == "tpu" and values.activations == "estimate":
            raise PlanError("--target=tpu compiles the programs: drop --activations=estimate")
        chip = values.chip or (entry["accelerator"] if entry else "")
        result = plan(values.config, sizes, memory, values.activations, assumptions, target=target,
                      depth=values.depth, chip=chip)
    except PlanError as e:
        raise UsageError(f"plan: {e}") from None
    print(format_plan(result), flush=True)
    if values.json:
        os.makedirs(os.path.dirname(os.path.abspath(values.json)), exist_ok=True)
        with open(values.json, "w") as f:
            json.dump(result.to_json(), f, indent=2)
        print(f"plan written to {values.json}")
    return result


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--xla-child"]:
        _xla_child(sys.argv[2])
    else:
        main(sys.argv)
