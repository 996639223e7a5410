"""The cold-start SFT step in the plan: per-device memory of one optimizer step on the recipe's
largest packed micro-batch (planner/workload.py `sft_workload`), its activations from the
compiled SFT gradient program (planner/programs.py `compile_sft_programs`) or the shape
estimate. `paravt-jax plan --stage=sft` plans it alone (no sampler programs to compile), the
default `--stage=all` after the RL step."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax
from flax import nnx

from paravt_jax.infra import sharding as sh
from paravt_jax.planner.arrays import (
    _param_leaves,
    _rows_per_device,
    abstract_mesh,
    abstract_params,
    activation_estimate,
    optimizer_leaves,
    param_shardings,
    resolve_mesh,
    train_batch_spec,
    tree_bytes,
)
from paravt_jax.planner.plan import GIB, Component, Phase, _size, activation_mode, batch_component
from paravt_jax.planner.programs import ProgramSet, Target, TargetError, compile_sft_programs
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


def plan_sft(run, mesh_sizes: Mapping[str, int], device_memory_gb: float, activations: str = "estimate",
             assumptions: Assumptions | None = None, tokenizer=None, target: Target | None = None,
             depth: str = "auto", compile_in: str = "children") -> SFTPlan:
    """Per-device memory of one SFT optimizer step: parameters, gradients, the SFT optimizer's
    state, the largest micro-batch's inputs and activations (no frozen reference, no sampler).
    activations: "xla" compiles the SFT gradient program for `target` (default XLA:CPU on fake
    CPU devices), "estimate" uses the per-layer formula (arrays.activation_estimate); "auto" as
    plan.plan decides it; compile_in: as plan.plan's."""
    from paravt_jax.planner.child import peak_rss_bytes
    from paravt_jax.planner.plan import ACTIVATION_MODES, host_note
    from paravt_jax.train.step import make_optimizer

    if activations not in ACTIVATION_MODES:
        raise PlanError(f"--activations={activations!r}: expected one of {', '.join(ACTIVATION_MODES)}")
    if device_memory_gb is None or not device_memory_gb > 0:
        raise PlanError(f"--device_memory_gb={device_memory_gb!r} must be > 0")
    sft = sft_settings(run)
    if sft is None:
        raise PlanError("the config plans no SFT (no `sft` section, or sft.steps = 0)")
    sizes = resolve_mesh(mesh_sizes, None)
    mesh = abstract_mesh(sizes)
    memory = int(device_memory_gb * GIB)
    name, model = model_config(run)
    which = "given by the caller"
    if tokenizer is None:
        tokenizer, which = plan_tokenizer(run)
    assumptions = assumptions or Assumptions()
    work = sft_workload(sft, model.vision, tokenizer, assumptions, sh.batch_devices(mesh))
    notes = [f"SFT example: the overview ({work.frames_per_example} frames of {work.frame_size[0]}x"
             f"{work.frame_size[1]}, {sft.visual}, {sft.sizing} sizing) and the question, {work.example_tokens} "
             f"tokens; {work.examples_per_row} a row of {work.train_length} tokens, {work.row_frames} vision frames "
             f"a row (the most a row holds); tokenizer: {which}; assumed {assumptions.text()}"]

    _, params, _ = abstract_params(model)
    shardings = param_shardings(params, mesh)
    p = tree_bytes(_param_leaves(params, shardings))
    count = sum(math.prod(v.get_value().shape) for _, v in nnx.to_flat_state(params))
    o = tree_bytes(optimizer_leaves(jax.eval_shape(make_optimizer(sft.optimizer).init, params), params, mesh))
    copies = 2 if work.micro_batches > 1 else 1
    rows = [Component("parameters", p.per_device, p.total, p.summary()),
            Component("gradients" + (" (accumulator + micro-batch)" if copies > 1 else ""), copies * p.per_device,
                      copies * p.total, "as parameters"),
            Component(f"optimizer state ({sft.optimizer.name}: mu, nu, counts)", o.per_device, o.total,
                      "as parameters; counts replicated")]
    rows.append(batch_component(work, train_batch_spec(model, work, mesh, extras=())))
    mode = activation_mode(activations, sizes, target, count)
    programs = None
    if mode == "xla":
        target = target or Target("cpu-fake", "gpu")
        try:
            programs = compile_sft_programs(model, sft, work, sizes, target, depth, compile_in=compile_in)
        except TargetError as e:
            raise PlanError(str(e)) from None
        grads = programs.trainer[0]
        rows.append(Component(f"activations ({programs.compiler} temp of {grads.name}, largest micro-batch)",
                              grads.temp_bytes, grads.temp_bytes, f"{programs.compiler} buffer assignment"))
        rows.append(Component(f"generated code ({programs.compiler}, {grads.name})", grads.code_bytes,
                              grads.code_bytes, "per device"))
        notes.append(f"SFT programs: compiled by {programs.compiler} ({target.name}"
                     + (f", topology {target.topology}" if target.topology else "")
                     + f"), {programs.depth}; {programs.compile_seconds:.1f} s to compile")
    else:
        temp = activation_estimate(model, work, sizes)
        rows.append(Component("activations (ESTIMATE, largest micro-batch)", temp, temp,
                              f"remat {'on' if model.remat else 'off'}; per-layer formula", estimate=True))
    phase = Phase("sft", "one cold-start SFT optimizer step", tuple(rows), memory,
                  compiler=programs.compiler if programs else "estimate",
                  compile_seconds=programs.compile_seconds if programs else 0.0)
    own_peak = peak_rss_bytes()
    if programs is not None:
        notes.append(host_note(programs, own_peak))
    return SFTPlan(name, sizes, math.prod(sizes.values()), float(device_memory_gb), mode,
                   target.name if programs else "", work, _rows_per_device(work.micro_batch_rows, mesh), phase,
                   programs, tuple(notes), own_peak)


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
        lines.append(f"  {c.name:<{width}}{_size(c.per_device_bytes):>12}  {_size(c.global_bytes):>12}  {c.sharding}")
    lines.append(f"  {'total':<{width}}{_size(phase.total_bytes):>12}")
    lines.append(f"  => {phase.verdict()}" + (f" on {result.device_memory_gb:g} GiB" if phase.fits else ""))
    if result.programs is not None:
        for p in result.programs.trainer:
            share = 100 * p.total_bytes / (result.device_memory_gb * GIB)
            lines.append(f"  program {p.name}: arguments {_size(p.argument_bytes)}, temps {_size(p.temp_bytes)}, "
                         f"total {_size(p.total_bytes)} ({share:.1f}% of HBM), {p.seconds:.1f} s to compile, "
                         f"attention {','.join(p.attention) or '-'}")
    return "\n".join(lines)
