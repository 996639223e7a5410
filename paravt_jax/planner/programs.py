"""The planner's compiled programs: which compiler, for which devices, at which depth.

`paravt-jax plan --target=...` compiles the real programs of one RL step ahead of time and reads
each one's `memory_analysis()` and `cost_analysis()` (planner/memory.py `ProgramMemory`):

  trainer  TrainStep's gradients of the largest micro-batch, its log-prob pass (the proximal
           and the reference log-probs), the optimizer update;
  sampler  the prompt / tool-response / sub-agent prefills, the main and the sub-agent decode
           loops, the vision tower of each prefill's frames (per shard of rows where the sampler
           splits them, SamplerPrograms.prefill_vision), the weight refresh (Sampler.weights).

Targets (planner/targets.py):
  cpu-fake  XLA:CPU on fake CPU devices (--xla_force_host_platform_device_count, fixed when a
            process starts: `target_env`);
  tpu       the TPU compiler (libtpu, `pip install 'paravt_jax[tpu]'`) for the mesh preset's TPU
            topology (`v5p-16` -> `v5p:2x2x2`, multi-slice presets with their slice count), all
            hosts' devices from one CPU process: nothing runs, no TPU is needed;
  gpu       XLA:GPU (the CUDA plugin, `pip install 'paravt_jax[gpu-plan]'`) for the mesh preset's
            GPUs (`gpu8` -> 8 H100 80 GB, topology `1x1x8`; `gpu16*` -> `2x1x8`, two hosts), from
            a GpuTargetConfig of the GPU model (planner/gpu_target.py): compile-only devices in a
            CPU process, no GPU needed;
  local     the devices this process has (an accelerator host planning its own mesh);
  auto      tpu for a TPU preset when libtpu is importable, gpu for a GPU preset when the CUDA
            plugin and ptxas are installed, else cpu-fake.

Processes (COMPILE_IN): each program compiles in a child process of its own (`Jobs`,
planner/child.py), which returns its ProgramMemory and its peak memory, so the host's memory is
one program's, not the sum of a plan's; `process` compiles them all in one process (this one,
or one child with the fake CPU devices this one lacks). Target local compiles in this process.

Depth: the sampler unrolls the decoder's layers in every run (TextDecoder.forward_cached), so
its programs are always compiled whole: their memory and their cost analysis (every layer
counted) are what runs. The trainer's programs run the layers as one scanned loop, and a scanned
program compiles in about the same time at any depth (the 8B's 36-layer gradient program for 16
v5p chips: about 3 minutes on a quiet 2-core machine), so `full` (and `auto` for scanned
models) takes their memory from the scanned program at the model's depth. `extrapolate`
compiles the trainer's scanned programs at two reduced depths (d and 2d, d = max(2, DeepStack
layers)) and extends each memory number linearly to the full depth (per-layer memory is the
difference of the two). Costs cannot come from a scanned program: XLA's cost analysis counts a
loop body once, whatever its trip count. The trainer's come from its programs with the layers
unrolled at d and 2d layers, extended linearly to the full depth (per-layer FLOPs, bytes and
collectives are the difference of the two). A scanned program's count is not "outside + one
unrolled layer": for small125m's gradient on v5p:2x2x2, 2 unrolled layers minus the scanned
program says 4.9e10 FLOPs a layer, 2 and 4 unrolled layers 3.6e10 (about four forward passes of
a layer, as remat makes it). Unrolled layers are not used for the trainer's memory: XLA keeps an
unrolled program's per-layer temporaries apart where the loop reuses one buffer, so extending
them overstates a run's memory (the 8B gradient: 67 GiB of temporaries extrapolated from 3 and
6 unrolled layers, 15.5 GiB compiled scanned). A model configured without scan
(`model.scan_layers=False`) has its trainer compiled unrolled, whole (`full`, or `auto` up to
AUTO_FULL_MAX_LAYERS layers) or extrapolated from d and 2d unrolled layers.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.models.qwen3_vl.hf_io import abstract_model
from paravt_jax.planner.arrays import train_batch_spec
from paravt_jax.planner.child import ChildRun, run_in_child
from paravt_jax.planner.memory import PrefillCall, ProgramMemory, SamplerPrograms, compile_for
from paravt_jax.planner.targets import COST_TARGETS, Target, TargetError, target_devices, target_env
from paravt_jax.planner.workload import sampler_calls
from paravt_jax.rl.objective import policy_head, policy_loss
from paravt_jax.sft.objective import HEAD, sft_loss
from paravt_jax.train.step import TrainState, TrainStep
from paravt_jax.video.frames import PATCH

DEPTHS = ("auto", "extrapolate", "full")
# where the programs compile: each in a child process of its own (children), or all in one
# process (process: this one, or one child with fake CPU devices when this one has too few)
COMPILE_IN = ("children", "process")
TRAINER_PROGRAMS = ("gradients", "log-probs", "optimizer update")
# `depth=auto` extrapolates unscanned models deeper than this (full compiles stay affordable below it)
AUTO_FULL_MAX_LAYERS = 8


# ----------------------------------------------------------------------------- programs
@dataclasses.dataclass(frozen=True)
class ProgramSet:
    """Every program of one RL step, at the model's full depth. depth: how the numbers were had."""
    trainer: tuple[ProgramMemory, ...]
    sampler: tuple[ProgramMemory, ...]
    compiler: str
    depth: str  # "full (36 layers)" | "extrapolated from 3 and 6 unrolled layers to 36"
    compile_seconds: float
    children: tuple[ChildRun, ...] = ()  # the child processes that compiled them (none: this process)

    def get(self, name: str) -> ProgramMemory:
        return next(p for p in self.trainer + self.sampler if p.name == name)

    def find(self, name: str) -> ProgramMemory | None:
        return next((p for p in self.trainer + self.sampler if p.name == name), None)


def reduced_depths(config: Qwen3VLConfig) -> tuple[int, int]:
    """(d, 2d): the two reduced depths of an extrapolation; d holds every DeepStack layer."""
    d = max(2, len(config.vision.deepstack_visual_indexes))
    return d, 2 * d


def with_depth(config: Qwen3VLConfig, layers: int, scan: bool) -> Qwen3VLConfig:
    return config.replace(text=dataclasses.replace(config.text, num_hidden_layers=layers), scan_layers=scan)


# ProgramMemory fields that do not scale with the layers; the cost analysis' fields
_FIXED_FIELDS = ("group_rows", "vision_shards", "row_shards", "attention_block")
_COST_FIELDS = ("flops", "bytes_accessed", "collective_bytes", "kernel_text_flops", "kernel_text_bytes",
                "kernel_vision_flops", "kernel_vision_bytes", "physical_bytes")


def _numbers(program: ProgramMemory) -> dict[str, float]:
    return {f.name: getattr(program, f.name) for f in dataclasses.fields(ProgramMemory)
            if f.name not in _FIXED_FIELDS and isinstance(getattr(program, f.name), (int, float))
            and not isinstance(getattr(program, f.name), bool)}


def _with_numbers(program: ProgramMemory, numbers: dict[str, float]) -> ProgramMemory:
    return dataclasses.replace(program, **{k: (int(round(v)) if isinstance(getattr(program, k), int) else float(v))
                                           for k, v in numbers.items()})


def extrapolate(a: ProgramMemory, b: ProgramMemory, layers_a: int, layers_b: int, layers: int) -> ProgramMemory:
    """Each number of a program at `layers` from the same program at two depths (linear per layer)."""
    t = (layers - layers_a) / (layers_b - layers_a)
    x, y = _numbers(a), _numbers(b)
    out = _with_numbers(a, {k: x[k] + (y[k] - x[k]) * t for k in x})
    return dataclasses.replace(out, seconds=a.seconds + b.seconds)


def _abstract_params(tree, mesh):
    return jax.tree.map(
        lambda v: v.replace(jax.ShapeDtypeStruct(v.get_value().shape, v.get_value().dtype,
                                                 sharding=sh.named_sharding(mesh, sh.param_axes(v),
                                                                            v.get_value().shape))),
        tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _pick(jobs: dict, only, what: str) -> list:
    """The jobs named in `only` (None: all), in that order."""
    names = list(jobs) if only is None else list(only)
    unknown = [n for n in names if n not in jobs]
    if unknown:
        raise ValueError(f"no {what} program named {unknown}; known: {list(jobs)}")
    return [jobs[n] for n in names]


def trainer_programs(config: Qwen3VLConfig, rl, work, mesh, only=None) -> list[ProgramMemory]:
    """TrainStep's gradient, log-prob and update programs (the very jitted functions a run calls)
    on abstract sharded inputs of the largest micro-batch; only: the names of those to compile
    (TRAINER_PROGRAMS; None: all)."""
    devices = list(mesh.devices.flat)
    step = TrainStep(abstract_model(config), rl.optimizer, policy_loss(rl.step), policy_head(rl.step), mesh=mesh)
    params = _abstract_params(step.params, mesh)
    batch = train_batch_spec(config, work, mesh)
    rows = work.micro_batch_rows

    # TrainStep keeps its jitted functions private; lowering those very functions is the point
    # (same loss, chunked log-probs, remat and scan as a run).
    def update():
        opt = jax.eval_shape(step.tx.init, params)
        opt = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), opt,
                           sh.optimizer_shardings(opt, params, mesh))
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
        state = TrainState(scalar, params, opt, scalar)
        count = jax.ShapeDtypeStruct((), jnp.float32, sharding=scalar.sharding)
        # the summed gradients have the parameters' tree, shapes and shardings
        return compile_for("optimizer update", step._apply, (state, params, count), {}, (), 0, devices)

    jobs = {"gradients": lambda: compile_for("gradients", step._grads, (params, batch), {}, batch, rows, devices),
            "log-probs": lambda: compile_for("log-probs", step._logprobs, (params, batch),
                                             dict(temperature=rl.step.temperature), batch, rows, devices),
            "optimizer update": update}
    assert tuple(jobs) == TRAINER_PROGRAMS
    return [job() for job in _pick(jobs, only, "trainer")]


def sft_programs(config: Qwen3VLConfig, sft, work, mesh, only=None) -> list[ProgramMemory]:
    """The cold-start SFT step's gradient program (sft/trainer.py's TrainStep with
    sft/objective.py's masked cross-entropy and HEAD) on abstract sharded inputs of its
    largest micro-batch (planner/workload.py `sft_workload`)."""

    def gradients():
        step = TrainStep(abstract_model(config), sft.optimizer, sft_loss, HEAD, mesh=mesh)
        params = _abstract_params(step.params, mesh)
        batch = train_batch_spec(config, work, mesh, extras=())
        return compile_for("SFT gradients", step._grads, (params, batch), {}, batch, work.micro_batch_rows,
                           list(mesh.devices.flat))

    return [job() for job in _pick({"SFT gradients": gradients}, only, "SFT")]


def _sampler_jobs(rl, work, layout) -> list[tuple[str, Callable[[SamplerPrograms], ProgramMemory]]]:
    """(name, how SamplerPrograms compiles it) of each of the sampler's programs of one rollout,
    in the plan's order; nothing is compiled here."""
    calls, decode = sampler_calls(layout, work, rl)
    jobs = [(call.name, lambda programs, call=call: programs.prefill(call)) for call in calls]
    jobs.append(("decode", lambda programs: programs.decode(**decode)))
    if layout.subagent_rows:
        jobs.append(("sub-agent decode", lambda programs: programs.decode(
            layout.subagent_rows, layout.subagent_suffix_slots, layout.subagent_rows, layout.subagent_prefix_slots,
            rl.rollout.subagent_max_tokens, name="sub-agent decode", truncation=decode["truncation"])))
    # the vision tower runs once per prefill row group, on the group's frames padded to
    # frames_per_row each (Sampler.prefill, shard_vision): per shard of rows where the sampler
    # splits the group's rows over the devices (SamplerConfig.vision_shards), else replicated
    frames = {"first prompt prefill": (work.frame_size, layout.prompt_frames),
              "tool-response prefill": (work.crop_frame_size, work.calls_per_turn * work.crop_frames),
              "sub-agent prefill": (work.crop_frame_size, layout.subagent_frames)}
    for call in calls:
        if not call.visual_tokens_per_row:
            continue
        size, per_row = frames[call.name]
        patches = tuple(s // PATCH for s in size)
        name = f"vision tower ({call.name})"
        jobs.append((name, lambda programs, call=call, name=name, patches=patches, per_row=per_row:
                     programs.prefill_vision(name, call, patches, per_row)))
    jobs.append(("weight refresh", lambda programs: programs.refresh))
    return jobs


def sampler_program_names(rl, work, layout) -> tuple[str, ...]:
    """The names of the sampler's programs of one rollout, in the plan's order."""
    return tuple(name for name, _ in _sampler_jobs(rl, work, layout))


def sampler_programs(config: Qwen3VLConfig, rl, work, layout, mesh, platform: str, only=None) -> list[ProgramMemory]:
    """The sampler's programs of one rollout (planner/memory.py SamplerPrograms); only: the names
    of those to compile (None: all)."""
    programs = SamplerPrograms(config, rl.sampler, mesh, platform)
    return [job(programs) for job in _pick(dict(_sampler_jobs(rl, work, layout)), only, "sampler")]


def _programs_of(kind: str, config, settings, work, layout, mesh, platform: str, names) -> list[ProgramMemory]:
    if kind == "trainer":
        return trainer_programs(config, settings, work, mesh, names)
    if kind == "sampler":
        return sampler_programs(config, settings, work, layout, mesh, platform, names)
    if kind == "sft":
        return sft_programs(config, settings, work, mesh, names)
    raise ValueError(f"no programs of kind {kind!r}")


def program_job(kind: str, config, settings, work, layout, mesh_sizes: Mapping[str, int], target: Target,
                names) -> list[ProgramMemory]:
    """The programs `names` of one kind ("trainer", "sampler", "sft"; settings: the rl or sft
    section) compiled for `target` by this process, as a child process of `Jobs` runs it."""
    devices = target_devices(target, math.prod(mesh_sizes.values()))
    if devices is None:
        raise TargetError(f"this process cannot host the {target.name} mesh {dict(mesh_sizes)} (XLA_FLAGS: "
                          f"{os.environ.get('XLA_FLAGS', '')!r})")
    return _programs_of(kind, config, settings, work, layout, sh.make_mesh(dict(mesh_sizes), devices),
                        target.platform, names)


class Jobs:
    """Compiles the planner's programs for one target and mesh: in this process on `devices`, or
    (devices None) each program in a child process of its own (planner/child.py), which returns
    the program's ProgramMemory and its peak resident memory (`children`). One line is logged per
    program compiled in a child: its compile seconds, the child's wall seconds and peak memory.
    parallel: how many children compile at once (each holds one program's host memory)."""

    def __init__(self, target: Target, mesh_sizes: Mapping[str, int], devices: list | None, parallel: int = 1):
        self.target, self.mesh_sizes, self.devices = target, dict(mesh_sizes), devices
        self.parallel = max(1, int(parallel))
        self.children: list[ChildRun] = []

    def __call__(self, kind: str, config, settings, work, layout, names, where: str) -> list[ProgramMemory]:
        """The programs `names` of `kind` (program_job); where: the depth they are compiled at,
        for the progress lines and errors ("gradients [36 scanned layers]")."""
        if self.devices is not None:
            return _programs_of(kind, config, settings, work, layout, sh.make_mesh(self.mesh_sizes, self.devices),
                                self.target.platform, names)
        env = target_env(self.target, math.prod(self.mesh_sizes.values()))

        def one(name):
            (program,), run = run_in_child(program_job, (kind, config, settings, work, layout, self.mesh_sizes,
                                                         self.target, (name,)), env, f"{name} [{where}]")
            log_child(run, program)
            return program, run

        with concurrent.futures.ThreadPoolExecutor(min(self.parallel, len(names)) or 1) as pool:
            done = list(pool.map(one, names))  # in the order of `names`
        self.children += [run for _, run in done]
        return [program for program, _ in done]


def log_child(run: ChildRun, program: ProgramMemory | None = None) -> None:
    """The progress line of one child process."""
    compiled = (f"compiled by {program.compiler} in {program.seconds:.1f} s, {program.temp_bytes / 2**30:.2f} GiB "
                "of temporaries per device; " if program else "")
    logging.info(f"[plan] {run.label}: {compiled}child process {run.seconds:.1f} s, peak "
                 f"{run.peak_bytes / 2**30:.2f} GiB resident")


def _jobs(target: Target, mesh_sizes: Mapping[str, int], compile_in: str, parallel: int = 1) -> Jobs | None:
    """Jobs for `compile_in`; None: cpu-fake with too few devices (or other XLA flags) in this
    process under compile_in=process (every program in one child)."""
    if compile_in not in COMPILE_IN:
        raise TargetError(f"--compile_in={compile_in!r}: expected one of {', '.join(COMPILE_IN)}")
    if compile_in == "children" and target.name != "local":  # local: this process' own devices
        return Jobs(target, mesh_sizes, None, parallel)
    devices = target_devices(target, math.prod(mesh_sizes.values()))
    return None if devices is None else Jobs(target, mesh_sizes, devices)


def _in_one_child(function, args: tuple, target: Target, mesh_sizes: Mapping[str, int]) -> ProgramSet:
    """compile_programs / compile_sft_programs (compile_in=process) in one child with fake devices."""
    result, run = run_in_child(function, args, target_env(target, math.prod(mesh_sizes.values())),
                               "every program (one process)")
    log_child(run)
    return dataclasses.replace(result, children=(run,))


def _layers(layers: int, scan: bool) -> str:
    return f"{layers} {'scanned' if scan else 'unrolled'} layers"


def resolved_depth(depth: str, config: Qwen3VLConfig) -> str:
    """`depth` with "auto" resolved: full for a scanned model (a scanned program compiles in
    about the same time at any depth) or up to AUTO_FULL_MAX_LAYERS layers, else extrapolate."""
    if depth != "auto":
        return depth
    return "full" if config.scan_layers or config.text.num_hidden_layers <= AUTO_FULL_MAX_LAYERS else "extrapolate"


def _zero_costs(programs: list) -> list:
    return [dataclasses.replace(p, **{k: 0.0 for k in _COST_FIELDS}) for p in programs]


@dataclasses.dataclass(frozen=True)
class TrainerCompiles:
    """The trainer's programs of one RL step at the depths `compile_programs` needs (see the
    module docstring); cost_jobs: the target's jobs, or COST_TARGETS' (named by cost_compiler)."""
    config: Qwen3VLConfig
    rl: object
    work: object
    jobs: Jobs
    cost_jobs: Jobs
    cost_compiler: str = ""  # "" when the target compiles its own cost programs

    @property
    def layers(self) -> int:
        return self.config.text.num_hidden_layers

    def at(self, layers: int, scan: bool, costs: bool = False) -> list:
        runner = self.cost_jobs if costs else self.jobs
        return runner("trainer", with_depth(self.config, layers, scan), self.rl, self.work, None, TRAINER_PROGRAMS,
                      _layers(layers, scan))

    def extrapolated(self, scan: bool, costs: bool = False) -> list:
        low, high = reduced_depths(self.config)
        a, b = self.at(low, scan, costs), self.at(high, scan, costs)
        return [extrapolate(x, y, low, high, self.layers) for x, y in zip(a, b)]

    def memory(self, depth: str, scan: bool) -> tuple[list, str]:
        """The programs a run compiles (scanned or, without scan, unrolled: every layer counted),
        whole or extrapolated from two reduced depths (per-layer memory is their difference)."""
        low, high = reduced_depths(self.config)
        kind = "scanned" if scan else "unrolled"
        if depth == "full" or self.layers <= (high if scan else low):
            return self.at(self.layers, scan), f"full ({self.layers} {kind} layers)"
        return self.extrapolated(scan), (f"{'memory' if scan else 'trainer'} extrapolated from {low} and {high} "
                                         f"{kind} layers to {self.layers}")

    def with_costs(self, memory: list) -> tuple[list, str]:
        """`memory` with the costs of the unrolled programs (a scanned program's cost analysis
        counts one layer), and where they come from."""
        low, high = reduced_depths(self.config)
        if self.layers == low:
            unrolled, source = self.at(low, False, costs=True), f"{low} unrolled layers"
        else:
            unrolled, source = self.extrapolated(False, costs=True), f"{low} and {high} unrolled layers"
        if self.cost_compiler:
            source += f" compiled by {self.cost_compiler}"
        return [dataclasses.replace(m, **{k: getattr(c, k) for k in _COST_FIELDS}, cost_source=c.cost_source,
                                    seconds=m.seconds + c.seconds) for m, c in zip(memory, unrolled)], source

    def programs(self, depth: str, costs: bool = True) -> tuple[list, str]:
        """The trainer's programs at the model's depth and how they were had."""
        if not self.config.scan_layers:  # unrolled as the run has them: every layer counted
            return self.memory(depth, False)
        memory, how = self.memory(depth, True)
        if not costs:  # a scanned program's counts hold one layer: none rather than a wrong one
            return _zero_costs(memory), how + "; no trainer costs"
        trainer, source = self.with_costs(memory)
        return trainer, how + "; trainer costs from " + source


def compile_programs(config: Qwen3VLConfig, rl, work, layout, mesh_sizes: Mapping[str, int], target: Target,
                     depth: str = "auto", costs: bool = True, compile_in: str = "children",
                     parallel: int = 1) -> ProgramSet:
    """Every program of one RL step compiled for `target`, at the model's depth (see the module
    docstring for `depth`). The sampler's programs are compiled whole whatever `depth` says: it
    unrolls the decoder's layers in every run (TextDecoder.forward_cached), so the whole program
    is what runs and its cost analysis counts every layer. costs=False: no unrolled trainer
    programs (the trainer's cost fields 0). compile_in: each program in a child process of its
    own ("children"; not for target local), or all in one process ("process"; see `Jobs`);
    parallel: children compiling at once (children only)."""
    if depth not in DEPTHS:
        raise TargetError(f"--depth={depth!r}: expected one of {', '.join(DEPTHS)}")
    jobs = _jobs(target, mesh_sizes, compile_in, parallel)
    if jobs is None:
        return _in_one_child(compile_programs, (config, rl, work, layout, dict(mesh_sizes), target, depth, costs,
                                                "process"), target, mesh_sizes)
    # the trainer's unrolled cost programs: compiled for the target, except for gpu (XLA:GPU has no
    # cost analysis of its own without a device and compiles slower): for XLA:CPU on fake devices
    # (COST_TARGETS), whose cost analysis counts the same work
    cost_target = COST_TARGETS.get(target.name, target)
    trainer_compiles = (TrainerCompiles(config, rl, work, jobs, jobs) if cost_target == target else
                        TrainerCompiles(config, rl, work, jobs, Jobs(cost_target, mesh_sizes, None, parallel),
                                        cost_target.compiler))
    layers = config.text.num_hidden_layers
    sampler = jobs("sampler", config, rl, work, layout, sampler_program_names(rl, work, layout),
                   f"sampler, {layers} layers")
    trainer, how = trainer_compiles.programs(resolved_depth(depth, config), costs)
    how += f"; the sampler's programs whole ({layers} layers, unrolled as it runs them)"
    seconds = sum(p.seconds for p in (*trainer, *sampler))
    children = jobs.children + (trainer_compiles.cost_jobs.children if trainer_compiles.cost_jobs is not jobs else [])
    return ProgramSet(tuple(trainer), tuple(sampler), target.compiler, how, seconds, tuple(children))


def compile_sft_programs(config: Qwen3VLConfig, sft, work, mesh_sizes: Mapping[str, int], target: Target,
                         depth: str = "auto", compile_in: str = "children") -> ProgramSet:
    """The SFT step's gradient program compiled for `target` (ProgramSet.trainer; no sampler),
    its memory at the model's depth as `compile_programs` takes the trainer's: the scanned
    program whole (full, and auto for scanned models), or extrapolated from two reduced depths.
    No costs (the SFT step has no time plan): the cost fields are 0. compile_in: as
    `compile_programs`."""
    if depth not in DEPTHS:
        raise TargetError(f"--depth={depth!r}: expected one of {', '.join(DEPTHS)}")
    jobs = _jobs(target, mesh_sizes, compile_in)
    if jobs is None:
        return _in_one_child(compile_sft_programs, (config, sft, work, dict(mesh_sizes), target, depth, "process"),
                             target, mesh_sizes)
    layers = config.text.num_hidden_layers
    low, high = reduced_depths(config)
    depth = resolved_depth(depth, config)
    kind = "scanned" if config.scan_layers else "unrolled"

    def at(layers_: int) -> list:
        return jobs("sft", with_depth(config, layers_, config.scan_layers), sft, work, None, ("SFT gradients",),
                    _layers(layers_, config.scan_layers))

    if depth == "full" or layers <= high:
        programs, how = at(layers), f"full ({layers} {kind} layers)"
    else:
        programs = [extrapolate(a, b, low, high, layers) for a, b in zip(at(low), at(high))]
        how = f"memory extrapolated from {low} and {high} {kind} layers to {layers}"
    programs = _zero_costs(programs)
    return ProgramSet(tuple(programs), (), target.compiler, how + "; no costs",
                      sum(p.seconds for p in programs), tuple(jobs.children))


__all__ = ["ChildRun", "PrefillCall", "ProgramMemory", "ProgramSet", "compile_programs", "compile_sft_programs",
           "extrapolate", "program_job"]
