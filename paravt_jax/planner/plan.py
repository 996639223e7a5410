"""`paravt-jax plan`: per-device memory of the RL trainer and of the sampler, before a run.

    paravt-jax plan --config=configs/paragrpo.py:qwen3vl_8b --mesh=v5p-32
    paravt-jax plan --config=configs/paragrpo.py:tiny --mesh=data=1,fsdp=8,tensor=1 \
        --device_memory_gb=16 --json=runs/plan.json

The planner's parts: workload.py (the recipe's episodes in tokens, rows, micro-batches and
sampler calls), arrays.py (meshes, sharded array bytes, the shape-based estimates),
programs.py (the programs compiled by XLA or the TPU compiler), time_plan.py, phases.py (the
rows of the tables). This module puts them together in three stages, each a function of the
typed config sections and the previous stage's dataclass, and prints the result:

  measure  (`measure` -> `Measured`): the workload, the sampler's layout of it, the trainer's
           resident arrays and the largest micro-batch's inputs, from the shapes alone;
  compile  (`compile_stage` -> `Compiled`): the step's programs compiled for the target, in
           child processes or in one process, their memory and cost numbers (none: estimate);
  report   (`report` -> `MemoryPlan`): the phases against the device memory, the time plan,
           the notes; `format_plan` prints it.

Nothing is allocated. The model is built with `nnx.eval_shape`, every parameter gets the
NamedSharding that `paravt_jax.infra.sharding` gives it on an `AbstractMesh` of the requested axis
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
`memory_analysis().temp_size_in_bytes`; each program in a child process of its own, with fake
CPU devices for cpu-fake: planner/child.py) or from a per-layer estimate from the shapes
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
import math
from collections.abc import Mapping

import jax

from paravt_jax.config import config_path
from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.planner import gpu_target
from paravt_jax.planner.arrays import _rows_per_device, abstract_mesh, resolve_mesh, train_batch_spec
from paravt_jax.planner.child import peak_rss_bytes
from paravt_jax.planner.phases import (
    ACTIVATION_MODES,
    DEFAULT_TARGET,
    GIB,
    Compiled,
    Component,
    Phase,
    StateBytes,
    StateRows,
    activation_mode,
    activation_row,
    batch_component,
    check_request,
    code_row,
    estimate_row,
    host_note,
    layer_copies_row,
    reference_row,
    sampler_components,
    size_text,
    state_bytes,
    state_rows,
)
from paravt_jax.planner.programs import ProgramSet, compile_programs
from paravt_jax.planner.targets import Target, TargetError, gpu_topology_of
from paravt_jax.planner.time_plan import SideBytes, TimePlan, format_time_plan, split_plan, time_plan
from paravt_jax.planner.workload import (
    Assumptions,
    PlanError,
    SamplerLayout,
    Workload,
    model_config,
    plan_tokenizer,
    rl_settings,
    sampler_layout,
    workload,
)

DEFAULT_CONFIG = config_path("paragrpo") + ":tiny"
__all__ = ["ACTIVATION_MODES", "GIB", "Component", "MemoryPlan", "Phase", "PlanError", "Target", "format_plan",
           "plan"]


# ----------------------------------------------------------------------------- the result
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
    host_peak_bytes: int = 0  # this process' peak resident memory when the plan was made

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


# ----------------------------------------------------------------------------- 1. measure
@dataclasses.dataclass(frozen=True)
class Measured:
    """What the shapes alone give (nothing compiled): the RL step's workload, the sampler's
    layout of it, the trainer's resident arrays and the largest micro-batch's inputs."""
    model: Qwen3VLConfig
    rl: object  # the run's RLConfig
    sizes: dict[str, int]
    work: Workload
    layout: SamplerLayout
    state: StateBytes
    batch: Component  # the largest micro-batch's input arrays
    rows_per_device: int  # rows of the largest micro-batch each device holds
    notes: tuple[str, ...]


def token_note(tokenizer_source: str, assumptions: Assumptions) -> str:
    return (f"token counts: agent/rollout.py's prompt and tool-response builders on frames of the planned "
            f"sizes, every turn, call and summary at its full budget; tokenizer: {tokenizer_source}; assumed "
            f"{assumptions.text()}")


def replicated_batch_notes(work: Workload, sizes: Mapping[str, int], rows_per_device: int) -> tuple[str, ...]:
    """A note when the largest micro-batch's rows do not divide over data x fsdp (every device
    holds them all)."""
    batch_devices = sizes["data"] * sizes["fsdp"]
    if rows_per_device != work.micro_batch_rows or batch_devices == 1:
        return ()
    return (f"the micro-batch's {work.micro_batch_rows} rows do not divide data x fsdp = {batch_devices}: "
            "every device holds all rows (replicated batch)",)


def measure(model: Qwen3VLConfig, rl, work: Workload, sizes: Mapping[str, int], notes: tuple[str, ...] = ()
            ) -> Measured:
    """Stage 1: the arrays of the RL step `work` (planner/workload.py) on a mesh of `sizes`
    (resolved axis sizes), for the typed model and rl sections; `notes` go first in the plan's."""
    mesh = abstract_mesh(sizes)
    rows = _rows_per_device(work.micro_batch_rows, mesh)
    return Measured(model, rl, dict(sizes), work, sampler_layout(rl, work), state_bytes(model, rl.optimizer, mesh),
                    batch_component(work, train_batch_spec(model, work, mesh)), rows,
                    (*notes, *replicated_batch_notes(work, sizes, rows)))


# ----------------------------------------------------------------------------- 2. compile
def target_text(target: Target, devices: int) -> str:
    """The target in the programs note: its name, a TPU's topology and slices, a GPU's model."""
    if target.name == "tpu" and target.topology:
        return f"tpu, topology {target.topology}" + (f" x {target.slices} slices" if target.slices > 1 else "")
    if target.name == "gpu":
        return (f"gpu, {gpu_target.GPUS[target.accelerator].name} x {devices}, topology "
                f"{target.topology or gpu_topology_of(devices)} (slices x hosts x devices)")
    return target.name


def programs_note(programs: ProgramSet, target: Target, devices: int) -> str:
    where = f" on {devices} fake CPU devices" if target.name == "cpu-fake" else ""
    process = ("each program in a child process of its own" if len(programs.children) > 1 else
               "in one child process" if programs.children else "in this process")
    return (f"programs: compiled by {programs.compiler}{where} ({target_text(target, devices)}), {programs.depth}; "
            f"{programs.compile_seconds:.1f} s to compile, {process}")


def vision_note(programs: ProgramSet) -> tuple[str, ...]:
    """How each vision tower was compiled (the sampler's rule, vision_pass.vision_split): per shard
    of rows, one pass per device block of rows, or one replicated pass; and how to plan the
    replicated baseline."""
    towers = [p for p in programs.sampler if p.name.startswith("vision tower")]
    if not towers:
        return ()
    passes = "; ".join(f"{p.name} " + (f"per shard of rows ({p.vision_shards} shards)" if p.vision_shards > 1
                                       else "replicated") for p in towers)
    return (f"vision passes as the sampler runs them (SamplerConfig.vision_shards): {passes}; "
            "--config.rl.sampler.vision_shards=False plans the replicated pass (the baseline)",)


def compile_stage(m: Measured, activations: str, target: Target | None = None, depth: str = "auto",
                  compile_in: str = "children", compile_jobs: int = 1) -> Compiled:
    """Stage 2: the RL step's programs compiled for `target` (programs.compile_programs: in
    child processes or in one process), or none when the activations are estimated."""
    mode = activation_mode(activations, m.sizes, target, m.state.count)
    if mode != "xla":
        return Compiled(mode, target)
    target = target or DEFAULT_TARGET
    try:
        programs = compile_programs(m.model, m.rl, m.work, m.layout, m.sizes, target, depth, compile_in=compile_in,
                                    parallel=compile_jobs)
    except TargetError as e:
        raise PlanError(str(e)) from None
    except ValueError as e:  # a kernel the target platform has not (attention.resolve)
        if str(e).startswith("model.attention="):
            raise PlanError(str(e)) from None
        raise
    return Compiled(mode, target, programs,
                    (programs_note(programs, target, math.prod(m.sizes.values())), *vision_note(programs)))


# ----------------------------------------------------------------------------- 3. report
@dataclasses.dataclass(frozen=True)
class Phases:
    """The three phases of the RL plan and the rows the time plan's split reads."""
    trainer: Phase
    sampler: Phase
    rollout: Phase
    state: tuple[Component, ...]  # parameters, gradients, optimizer state, reference
    working: Component  # the sampler's largest working set
    notes: tuple[str, ...]  # the sampler's


def trainer_activations(m: Measured, c: Compiled) -> tuple[Component, ...]:
    """The largest micro-batch's activations (the busiest trainer program's temporaries, and
    the programs' code; or the estimate)."""
    if c.programs is None:
        return (estimate_row(m.model, m.work, m.sizes, logprob_chunk=m.rl.step.logprob_chunk),)
    trainer = c.programs.trainer
    busiest = max(trainer, key=lambda p: p.temp_bytes)
    return (activation_row(c.compiler, busiest),
            code_row(c.compiler, f"{len(trainer)} programs", sum(p.code_bytes for p in trainer)))


def rl_phases(m: Measured, c: Compiled, device_memory_bytes: int) -> Phases:
    """The trainer (one optimizer step), the sampler on its own, and the sampler inside the
    trainer's process (the rollout phase)."""
    rows: StateRows = state_rows(m.state, m.rl.optimizer.name, m.work.micro_batches)
    reference = reference_row(m.state.parameters, m.rl.advantage.kl_ctl > 0)
    trainer = Phase("trainer", "one optimizer step", (*rows, reference, m.batch, *trainer_activations(m, c)),
                    device_memory_bytes, compiler=c.compiler, compile_seconds=c.seconds("trainer"))
    caches, working, notes = sampler_components(m.model, m.rl, m.work, m.layout, m.sizes, c.programs)
    sampler_rows = (layer_copies_row(m.state), *caches, working)
    sampler = Phase("sampler", "a rollout on its own (parameters + caches)", (rows.parameters, *sampler_rows),
                    device_memory_bytes, compiler=c.compiler, compile_seconds=c.seconds("sampler"))
    rollout = Phase("rollout", "the sampler inside rl/trainer.py: optimizer state and reference stay resident",
                    (rows.parameters, rows.optimizer, reference, *sampler_rows), device_memory_bytes,
                    compiler=c.compiler, compile_seconds=c.seconds("sampler"))
    return Phases(trainer, sampler, rollout, (*rows, reference), working, tuple(notes))


def step_time(m: Measured, c: Compiled, p: Phases, chip: str, rollout_devices: int) -> TimePlan | None:
    """The time plan on `chip` (none without compiled programs or a chip), with the split of
    the devices between trainer and rollouts on a mesh of more than one device."""
    if c.programs is None or not chip:
        return None
    timing = time_plan(c.programs, m.rl, m.work, m.layout, m.model, chip, m.sizes, m.rows_per_device)
    devices = math.prod(m.sizes.values())
    if devices == 1:
        return timing
    # what spreads over a side's devices: the trainer's state; the sampler's all but a prefill
    # group's working set (see time_plan.SideBytes)
    state = sum(r.per_device_bytes for r in p.state if r.counted)
    working = p.working.per_device_bytes if p.working.counted else 0
    trainer = SideBytes(state, p.trainer.total_bytes - state)
    rollout = SideBytes(p.sampler.total_bytes - working, working)
    return dataclasses.replace(timing, split=split_plan(timing, devices, trainer, rollout, m.state.parameters.total,
                                                        p.trainer.device_memory_bytes, rollout_devices))


def report(m: Measured, c: Compiled, preset: str, device_memory_gb: float, chip: str = "",
           rollout_devices: int = 0) -> MemoryPlan:
    """Stage 3: the phases against `device_memory_gb` GiB a device, the time plan on `chip`
    ("" = none; rollout_devices: the config's mesh.rollout_devices, marked in its split) and
    the notes of every stage."""
    p = rl_phases(m, c, int(device_memory_gb * GIB))
    timing = step_time(m, c, p, chip, rollout_devices)
    own_peak = peak_rss_bytes()
    host = (host_note(c.programs, own_peak),) if c.programs is not None else ()
    return MemoryPlan(
        preset=preset, parameters=m.state.count, param_dtype=m.model.param_dtype, compute_dtype=m.model.dtype,
        remat=m.model.remat, mesh=m.sizes, devices=math.prod(m.sizes.values()),
        device_memory_gb=float(device_memory_gb), activations=c.activations, target=c.target_name,
        workload=m.work, rows_per_device=m.rows_per_device, trainer=p.trainer, sampler=p.sampler, rollout=p.rollout,
        notes=(*m.notes, *c.notes, *p.notes, *host), programs=c.programs, time_plan=timing, host_peak_bytes=own_peak)


# ----------------------------------------------------------------------------- the plan
def plan(run, mesh_sizes: Mapping[str, int], device_memory_gb: float,
         activations: str = "estimate", assumptions: Assumptions | None = None, tokenizer=None,
         target: Target | None = None, depth: str = "auto", chip: str = "",
         compile_in: str = "children", compile_jobs: int = 1) -> MemoryPlan:
    """Per-device memory of the trainer, the sampler and the co-located rollout phase: the
    run's sections and workload measured, compiled and reported (`measure`, `compile_stage`,
    `report`).

    run: the run's typed config (run_config.RunConfig: its model, rl and mesh sections);
    mesh_sizes: {"data", "fsdp", "tensor"} positive sizes; device_memory_gb: GiB per device;
    activations: "estimate" | "xla" | "auto" (xla when the local devices can host the mesh, or
    they are CPUs (a child process fakes the devices), and the model has at most
    AUTO_XLA_MAX_PARAMETERS parameters); assumptions: what the config does not fix;
    tokenizer: counts the prompt text (default: the run's, `plan_tokenizer`); target: where the
    programs compile (programs.py; default XLA:CPU on fake CPU devices planning gpu kernels);
    depth: full or extrapolated programs (programs.py); chip: the accelerator whose peaks the
    time plan uses (time_plan.CHIPS; "" = no time plan); compile_in: each program in a child
    process of its own ("children") or all in one process ("process"; programs.py COMPILE_IN);
    compile_jobs: child processes compiling at once.
    """
    check_request(activations, device_memory_gb)
    sizes = resolve_mesh(mesh_sizes, None)
    name, model = model_config(run)
    rl, notes = rl_settings(run)
    source = "given by the caller"
    if tokenizer is None:
        tokenizer, source = plan_tokenizer(run)
    assumptions = assumptions or Assumptions()
    work = workload(rl, model.vision, tokenizer, assumptions, sh.batch_devices(abstract_mesh(sizes)))
    measured = measure(model, rl, work, sizes, (*notes, token_note(source, assumptions)))
    compiled = compile_stage(measured, activations, target, depth, compile_in, compile_jobs)
    return report(measured, compiled, name, device_memory_gb, chip, run.mesh.rollout_devices)


# ----------------------------------------------------------------------------- output
def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def workload_lines(result: MemoryPlan) -> list[str]:
    """The plan's heading: the model, the mesh, the workload in episodes, tokens and micro-batches."""
    w = result.workload
    mesh = " ".join(f"{a}={s}" for a, s in result.mesh.items())
    return [
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


def phase_lines(phase: Phase, width: int, device_memory_gb: float) -> list[str]:
    """One phase's table: its rows (name column `width` wide), the total and the verdict."""
    compiled = (f" [{phase.compiler}, {phase.compile_seconds:.1f} s to compile]" if phase.compile_seconds
                else f" [{phase.compiler}]")
    lines = ["", f"{phase.name.upper()}: {phase.description}{compiled}",
             f"  {'component':<{width}}{'per device':>12}  {'global':>12}  sharding"]
    for c in phase.components:
        mark = "" if c.counted else "  (not in total)"
        lines.append(f"  {c.name:<{width}}{size_text(c.per_device_bytes):>12}  {size_text(c.global_bytes):>12}  "
                     f"{c.sharding}{mark}")
    lines.append(f"  {'total':<{width}}{size_text(phase.total_bytes):>12}")
    lines.append(f"  => {phase.verdict()}" + (f" on {device_memory_gb:g} GiB" if phase.fits else ""))
    return lines


def format_plan(result: MemoryPlan) -> str:
    """The printed plan: heading, phase tables, programs, time plan, then the notes only."""
    lines = workload_lines(result)
    width = max(len(c.name) for phase in result.phases for c in phase.components) + 2
    for phase in result.phases:
        lines += phase_lines(phase, width, result.device_memory_gb)
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
            sizes = (p.argument_bytes, p.output_bytes - p.alias_bytes, p.temp_bytes, p.code_bytes, p.total_bytes)
            lines.append(f"  {p.name:<38}" + "".join(f"{size_text(n):>11}" for n in sizes)
                         + f"{share:>7.1f}%{p.seconds:>11.1f}  {','.join(p.attention) or '-'}")
        lines.append(f"  {phase} programs: {sum(p.seconds for p in group):.1f} s to compile")
    return lines


def local_device_memory() -> float | None:
    stats = jax.devices()[0].memory_stats() if hasattr(jax.devices()[0], "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return stats["bytes_limit"] / GIB
    return None
