"""`paravt-jax plan`: per-device memory of the RL trainer and of the sampler, before a run.

    paravt-jax plan --config=configs/paragrpo.py:qwen3vl_8b --mesh=v5p-32
    paravt-jax plan --config=configs/paragrpo.py:tiny --mesh=data=1,fsdp=8,tensor=1 \
        --device_memory_gb=16 --json=runs/plan.json

The planner's parts: workload.py (the recipe's episodes in tokens, rows, micro-batches and
sampler calls), arrays.py (meshes, sharded array bytes, the shape-based estimates),
programs.py (the programs compiled by XLA or the TPU compiler), time_plan.py; this module
puts them together into the phases and prints them.

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
import jax.numpy as jnp
from flax import nnx

from paravt_jax.config import config_path
from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.planner import gpu_target
from paravt_jax.planner.arrays import (
    _param_leaves,
    _rows_per_device,
    _shard_bytes,
    _spec_text,
    abstract_mesh,
    abstract_params,
    activation_estimate,
    optimizer_leaves,
    param_shardings,
    prefill_estimate,
    resolve_mesh,
    train_batch_spec,
    tree_bytes,
)
from paravt_jax.planner.child import peak_rss_bytes
from paravt_jax.planner.programs import (
    ProgramSet,
    Target,
    TargetError,
    compile_programs,
    gpu_topology_of,
)
from paravt_jax.planner.time_plan import SideBytes, TimePlan, format_time_plan, split_plan, time_plan
from paravt_jax.planner.workload import (
    Assumptions,
    PlanError,
    Workload,
    model_config,
    plan_tokenizer,
    rl_settings,
    sampler_layout,
    workload,
)
from paravt_jax.sampling.kv_cache import (
    CacheSpec,
    cache_sharding,
)

GIB = 2**30
DEFAULT_CONFIG = config_path("paragrpo") + ":tiny"
ACTIVATION_MODES = ("auto", "xla", "estimate")

# `auto` compiles with XLA up to this size (8b: ~45 s on a 2-core CPU; 32b not measured).
AUTO_XLA_MAX_PARAMETERS = 10_000_000_000


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


# ----------------------------------------------------------------------------- host memory
def host_note(programs: ProgramSet | None, own_peak: int) -> str:
    """Where the programs compiled and the peak resident memory of this process and its children."""
    here = f"this process peaked at {own_peak / GIB:.2f} GiB resident"
    if programs is None or not programs.children:
        return "host memory: " + here + (" (the programs compiled in it)" if programs else "")
    largest = max(programs.children, key=lambda run: run.peak_bytes)
    count = len(programs.children)
    return (f"host memory: {count} child process{'es' if count > 1 else ''} compiled the programs"
            + (", one each" if count > 1 else "") + f"; the largest peaked at {largest.peak_bytes / GIB:.2f} GiB "
            f"resident ({largest.label}), {sum(r.seconds for r in programs.children):.1f} s in all; " + here)


# ----------------------------------------------------------------------------- sampler phase
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
                          f"{layout.subagent_prefix_slots} + {layout.subagent_suffix_slots} slots; "
                          f"{layout.subagent_calls} call(s) a round)",
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


def batch_component(work, batch) -> Component:
    """The plan's row for one micro-batch's input arrays (`batch`: their abstract, sharded spec)."""
    b = tree_bytes([(leaf, leaf.sharding) for leaf in jax.tree.leaves(batch)])
    return Component(f"micro-batch inputs ({work.micro_batch_rows} rows x {work.train_length})", b.per_device,
                     b.total, "tokens over batch axes; pixels "
                     + ("by rows" if batch["pixel_values"].ndim == 3 else "replicated"))


def activation_mode(activations: str, sizes: Mapping[str, int], target: Target | None, parameters: int) -> str:
    """"xla" or "estimate": `activations`, with "auto" resolved (xla for a TPU or GPU target, or when
    this process's devices can host the mesh, or are CPUs, and the model is small enough)."""
    if activations != "auto":
        return activations
    local = jax.devices()
    fits_locally = math.prod(sizes.values()) <= len(local) or local[0].platform == "cpu"
    return "xla" if (target is not None and target.name in ("tpu", "gpu")) or (
        fits_locally and parameters <= AUTO_XLA_MAX_PARAMETERS) else "estimate"


# ----------------------------------------------------------------------------- the plan
def plan(run, mesh_sizes: Mapping[str, int], device_memory_gb: float,
         activations: str = "estimate", assumptions: Assumptions | None = None, tokenizer=None,
         target: Target | None = None, depth: str = "auto", chip: str = "",
         compile_in: str = "children", compile_jobs: int = 1) -> MemoryPlan:
    """Per-device memory of the trainer, the sampler and the co-located rollout phase.

    run: the run's typed config (run_config.RunConfig: its model and rl sections);
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
    if activations not in ACTIVATION_MODES:
        raise PlanError(f"--activations={activations!r}: expected one of {', '.join(ACTIVATION_MODES)}")
    if device_memory_gb is None or not device_memory_gb > 0:
        raise PlanError(f"--device_memory_gb={device_memory_gb!r} must be > 0")
    sizes = resolve_mesh(mesh_sizes, None)
    memory = int(device_memory_gb * GIB)
    mesh = abstract_mesh(sizes)
    name, model = model_config(run)
    rl, notes = rl_settings(run)
    notes = list(notes)
    which = "given by the caller"
    if tokenizer is None:
        tokenizer, which = plan_tokenizer(run)
    assumptions = assumptions or Assumptions()
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
    batch_row = batch_component(work, train_batch_spec(model, work, mesh))
    mode = activation_mode(activations, sizes, target, count)
    programs = None
    if mode == "xla":
        target = target or Target("cpu-fake", "gpu")
        try:
            programs = compile_programs(model, rl, work, sampler_layout(rl, work), sizes, target, depth,
                                        compile_in=compile_in, parallel=compile_jobs)
        except TargetError as e:
            raise PlanError(str(e)) from None
        except ValueError as e:  # a kernel the target platform has not (attention.resolve)
            if str(e).startswith("model.attention="):
                raise PlanError(str(e)) from None
            raise
        need = math.prod(sizes.values())
        where = f" on {need} fake CPU devices" if target.name == "cpu-fake" else ""
        process = ("each program in a child process of its own" if len(programs.children) > 1 else
                   "in one child process" if programs.children else "in this process")
        notes.append(f"programs: compiled by {programs.compiler}{where} ({target.name}"
                     + (f", topology {target.topology}" + (f" x {target.slices} slices" if target.slices > 1 else "")
                        if target.topology and target.name == "tpu" else "")
                     + (f", {gpu_target.GPUS[target.accelerator].name} x {need}, topology "
                        f"{target.topology or gpu_topology_of(need)} (slices x hosts x devices)"
                        if target.name == "gpu" else "")
                     + f"), {programs.depth}; {programs.compile_seconds:.1f} s to compile, {process}")
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
        devices = math.prod(sizes.values())
        if devices > 1:
            given = run.mesh.rollout_devices
            # what spreads over a side's devices: the trainer's state; the sampler's all but a
            # prefill group's working set (see time_plan.SideBytes)
            state = sum(r.per_device_bytes for r in (param_row, grad_row, opt_row, reference_row) if r.counted)
            working = prefill_row.per_device_bytes if prefill_row.counted else 0
            trainer_bytes = SideBytes(state, trainer.total_bytes - state)
            rollout_bytes = SideBytes(sampler.total_bytes - working, working)
            timing = dataclasses.replace(timing, split=split_plan(timing, devices, trainer_bytes, rollout_bytes,
                                                                  p.total, memory, given))
    own_peak = peak_rss_bytes()
    if programs is not None:
        notes.append(host_note(programs, own_peak))
    return MemoryPlan(
        preset=name, parameters=count, param_dtype=model.param_dtype, compute_dtype=model.dtype,
        remat=model.remat, mesh=sizes, devices=math.prod(sizes.values()), device_memory_gb=float(device_memory_gb),
        activations=mode, target=target.name if programs else "", workload=work, rows_per_device=per_device_rows,
        trainer=trainer, sampler=sampler, rollout=rollout, notes=tuple(notes), programs=programs, time_plan=timing,
        host_peak_bytes=own_peak)


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


def local_device_memory() -> float | None:
    stats = jax.devices()[0].memory_stats() if hasattr(jax.devices()[0], "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return stats["bytes_limit"] / GIB
    return None
