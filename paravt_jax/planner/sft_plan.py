"""The cold-start SFT step in the plan: per-device memory of one optimizer step on the recipe's
largest packed micro-batch (planner/workload.py `sft_workload`), its activations from the
compiled SFT gradient program (planner/programs.py `compile_sft_programs`) or the shape
estimate. `paravt-jax plan --stage=sft` plans it alone (no sampler programs to compile), the
default `--stage=all` after the RL step. The stages are plan.py's: `measure_sft` (the arrays of
the SFT section's workload), `compile_sft` (its gradient program, or none), `report_sft` (the
phase against the device memory and the notes)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.planner.arrays import _rows_per_device, abstract_mesh, resolve_mesh, train_batch_spec
from paravt_jax.planner.child import peak_rss_bytes
from paravt_jax.planner.phases import (
    DEFAULT_TARGET,
    GIB,
    Compiled,
    Component,
    Phase,
    StateBytes,
    activation_mode,
    activation_row,
    batch_component,
    check_request,
    code_row,
    estimate_row,
    host_note,
    size_text,
    state_bytes,
    state_rows,
)
from paravt_jax.planner.programs import ProgramSet, compile_sft_programs
from paravt_jax.planner.targets import Target, TargetError
from paravt_jax.planner.workload import Assumptions, PlanError, SFTWorkload, model_config, plan_tokenizer, sft_workload


@dataclasses.dataclass(frozen=True)
class SFTPlan:
    preset: str
    mesh: dict[str, int]
    devices: int
    device_memory_gb: float
    activations: str  # "xla" | "estimate"
    target: str  # "" for the estimate
    workload: SFTWorkload
    rows_per_device: int
    phase: Phase
    programs: ProgramSet | None = None
    notes: tuple[str, ...] = ()
    host_peak_bytes: int = 0  # this process' peak resident memory when the plan was made

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["phase"].update(total_bytes=self.phase.total_bytes, fits=self.phase.fits,
                            headroom_percent=round(self.phase.headroom_percent, 2))
        return out


def sft_settings(run):
    """The run's SFTConfig (a RunConfig's); None without an `sft` section or with sft.steps = 0
    (no SFT to plan)."""
    sft = run.sft
    if sft is None:
        return None
    return sft if sft.steps else None


# ----------------------------------------------------------------------------- 1. measure
@dataclasses.dataclass(frozen=True)
class SFTMeasured:
    """The SFT step's workload and arrays from the shapes alone (plan.Measured's SFT twin)."""
    model: Qwen3VLConfig
    sft: object  # the run's SFTConfig
    sizes: dict[str, int]
    work: SFTWorkload
    state: StateBytes
    batch: Component  # the largest micro-batch's input arrays
    rows_per_device: int
    notes: tuple[str, ...]


def example_note(sft, work: SFTWorkload, tokenizer_source: str, assumptions: Assumptions) -> str:
    return (f"SFT example: the overview ({work.frames_per_example} frames of {work.frame_size[0]}x"
            f"{work.frame_size[1]}, {sft.visual}, {sft.sizing} sizing) and the question, {work.example_tokens} "
            f"tokens; {work.examples_per_row} a row of {work.train_length} tokens, {work.row_frames} vision frames "
            f"a row (the most a row holds); tokenizer: {tokenizer_source}; assumed {assumptions.text()}")


def measure_sft(model: Qwen3VLConfig, sft, work: SFTWorkload, sizes: Mapping[str, int],
                notes: tuple[str, ...] = ()) -> SFTMeasured:
    """The arrays of the SFT step `work` on a mesh of `sizes`, for the typed model and sft sections."""
    mesh = abstract_mesh(sizes)
    return SFTMeasured(model, sft, dict(sizes), work, state_bytes(model, sft.optimizer, mesh),
                       batch_component(work, train_batch_spec(model, work, mesh, extras=())),
                       _rows_per_device(work.micro_batch_rows, mesh), tuple(notes))


# ----------------------------------------------------------------------------- 2. compile
def compile_sft(m: SFTMeasured, activations: str, target: Target | None = None, depth: str = "auto",
                compile_in: str = "children") -> Compiled:
    """The SFT gradient program compiled for `target` (default XLA:CPU on fake CPU devices), or
    none when the activations are estimated."""
    mode = activation_mode(activations, m.sizes, target, m.state.count)
    if mode != "xla":
        return Compiled(mode, target)
    target = target or DEFAULT_TARGET
    try:
        programs = compile_sft_programs(m.model, m.sft, m.work, m.sizes, target, depth, compile_in=compile_in)
    except TargetError as e:
        raise PlanError(str(e)) from None
    note = (f"SFT programs: compiled by {programs.compiler} ({target.name}"
            + (f", topology {target.topology}" if target.topology else "")
            + f"), {programs.depth}; {programs.compile_seconds:.1f} s to compile")
    return Compiled(mode, target, programs, (note,))


# ----------------------------------------------------------------------------- 3. report
def sft_activations(m: SFTMeasured, c: Compiled) -> tuple[Component, ...]:
    if c.programs is None:
        return (estimate_row(m.model, m.work, m.sizes),)
    grads = c.programs.trainer[0]
    return activation_row(c.compiler, grads), code_row(c.compiler, grads.name, grads.code_bytes)


def report_sft(m: SFTMeasured, c: Compiled, preset: str, device_memory_gb: float) -> SFTPlan:
    """The SFT phase (parameters, gradients, the SFT optimizer's state, the largest
    micro-batch's inputs and activations) against `device_memory_gb` GiB a device."""
    rows = (*state_rows(m.state, m.sft.optimizer.name, m.work.micro_batches), m.batch, *sft_activations(m, c))
    phase = Phase("sft", "one cold-start SFT optimizer step", rows, int(device_memory_gb * GIB),
                  compiler=c.compiler, compile_seconds=c.programs.compile_seconds if c.programs else 0.0)
    own_peak = peak_rss_bytes()
    host = (host_note(c.programs, own_peak),) if c.programs is not None else ()
    return SFTPlan(preset, m.sizes, math.prod(m.sizes.values()), float(device_memory_gb), c.activations,
                   c.target_name, m.work, m.rows_per_device, phase, c.programs, (*m.notes, *c.notes, *host), own_peak)


# ----------------------------------------------------------------------------- the plan
def plan_sft(run, mesh_sizes: Mapping[str, int], device_memory_gb: float, activations: str = "estimate",
             assumptions: Assumptions | None = None, tokenizer=None, target: Target | None = None,
             depth: str = "auto", compile_in: str = "children") -> SFTPlan:
    """Per-device memory of one SFT optimizer step: parameters, gradients, the SFT optimizer's
    state, the largest micro-batch's inputs and activations (no frozen reference, no sampler).
    activations: "xla" compiles the SFT gradient program for `target` (default XLA:CPU on fake
    CPU devices), "estimate" uses the per-layer formula (arrays.activation_estimate); "auto" as
    plan.plan decides it; compile_in: as plan.plan's."""
    check_request(activations, device_memory_gb)
    sft = sft_settings(run)
    if sft is None:
        raise PlanError("the config plans no SFT (no `sft` section, or sft.steps = 0)")
    sizes = resolve_mesh(mesh_sizes, None)
    name, model = model_config(run)
    source = "given by the caller"
    if tokenizer is None:
        tokenizer, source = plan_tokenizer(run)
    assumptions = assumptions or Assumptions()
    work = sft_workload(sft, model.vision, tokenizer, assumptions, sh.batch_devices(abstract_mesh(sizes)))
    measured = measure_sft(model, sft, work, sizes, (example_note(sft, work, source, assumptions),))
    return report_sft(measured, compile_sft(measured, activations, target, depth, compile_in), name,
                      device_memory_gb)


def format_sft_plan(result: SFTPlan) -> str:
    w = result.workload
    phase = result.phase
    mesh = " ".join(f"{a}={s}" for a, s in result.mesh.items())
    compiled = (f" [{phase.compiler}, {phase.compile_seconds:.1f} s to compile]" if phase.compile_seconds
                else f" [{phase.compiler}]")
    lines = [f"SFT: {phase.description}{compiled}",
             f"  {result.preset}; mesh {mesh} ({result.devices} devices); device memory "
             f"{result.device_memory_gb:g} GiB",
             f"  {w.examples} examples a step, packed {w.examples_per_row} a row; micro-batches: {w.micro_batches} of "
             f"<= {w.micro_batch_rows} rows x {w.train_length}"
             + (f" (budget {w.max_tokens_per_micro_batch} tokens)" if w.max_tokens_per_micro_batch else "")
             + f"; {result.rows_per_device} row(s) per device; {w.row_frames} vision frames of "
             f"{w.frame_size[0]}x{w.frame_size[1]} a row"]
    width = max(len(c.name) for c in phase.components) + 2
    lines.append(f"  {'component':<{width}}{'per device':>12}  {'global':>12}  sharding")
    for c in phase.components:
        lines.append(f"  {c.name:<{width}}{size_text(c.per_device_bytes):>12}  {size_text(c.global_bytes):>12}  "
                     f"{c.sharding}")
    lines.append(f"  {'total':<{width}}{size_text(phase.total_bytes):>12}")
    lines.append(f"  => {phase.verdict()}" + (f" on {result.device_memory_gb:g} GiB" if phase.fits else ""))
    if result.programs is not None:
        for p in result.programs.trainer:
            share = 100 * p.total_bytes / (result.device_memory_gb * GIB)
            lines.append(f"  program {p.name}: arguments {size_text(p.argument_bytes)}, "
                         f"temps {size_text(p.temp_bytes)}, total {size_text(p.total_bytes)} ({share:.1f}% of HBM), "
                         f"{p.seconds:.1f} s to compile, "
                         f"attention {','.join(p.attention) or '-'}")
    return "\n".join(lines)
