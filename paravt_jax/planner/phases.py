"""The parts the RL plan (plan.py) and the SFT plan (sft_plan.py) share, stage by stage.

measure  `check_request` (the caller's activations and device memory), `StateBytes` (the
         trainer's resident arrays: parameters, optimizer state, the sampler's layer copies,
         from their abstract trees and real shardings);
compile  `activation_mode` (whether to compile) and `Compiled` (the programs compiled for the
         target, or none: the shape estimate);
report   the tables' rows: `Component` (one memory consumer) and `Phase` (the rows checked
         against the device memory), the rows of the state, the micro-batch and its
         activations, the sampler's caches and working set, the host-memory note.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.planner.arrays import (
    TreeBytes,
    _param_leaves,
    _shard_bytes,
    _spec_text,
    abstract_mesh,
    abstract_params,
    activation_estimate,
    optimizer_leaves,
    param_shardings,
    prefill_estimate,
    tree_bytes,
)
from paravt_jax.planner.programs import ProgramSet
from paravt_jax.planner.targets import Target
from paravt_jax.planner.workload import PlanError, SamplerLayout, Workload
from paravt_jax.sampling.kv_cache import CacheSpec, cache_sharding
from paravt_jax.train.step import OptimizerConfig, make_optimizer

GIB = 2**30
ACTIVATION_MODES = ("auto", "xla", "estimate")
# `auto` compiles with XLA up to this size (8b: ~45 s on a 2-core CPU; 32b not measured).
AUTO_XLA_MAX_PARAMETERS = 10_000_000_000
# where a plan compiles when the caller names no target: XLA:CPU on fake CPU devices, gpu kernels
DEFAULT_TARGET = Target("cpu-fake", "gpu")
# the parameters the sampler copies per layer (Sampler.weights): the decoder layers, an untied lm head
LAYER_COPIES = (("language", "layers"), ("language", "lm_head"))


# ----------------------------------------------------------------------------- measure
def check_request(activations: str, device_memory_gb: float | None) -> None:
    """PlanError naming the flag when `activations` or `device_memory_gb` cannot be planned."""
    if activations not in ACTIVATION_MODES:
        raise PlanError(f"--activations={activations!r}: expected one of {', '.join(ACTIVATION_MODES)}")
    if device_memory_gb is None or not device_memory_gb > 0:
        raise PlanError(f"--device_memory_gb={device_memory_gb!r} must be > 0")


@dataclasses.dataclass(frozen=True)
class StateBytes:
    """The trainer's resident arrays on the mesh, from their abstract trees and real shardings."""
    parameters: TreeBytes
    count: int  # parameter elements
    optimizer: TreeBytes  # the optimizer's state (`make_optimizer`), its moments sharded like their parameters
    layer_copies: TreeBytes  # LAYER_COPIES, a device's bytes as the stacked parameters'


def state_bytes(model: Qwen3VLConfig, optimizer: OptimizerConfig, mesh) -> StateBytes:
    """The parameters (`nnx.eval_shape`), the optimizer state (`jax.eval_shape` of the
    optimizer train/step.py builds) and the sampler's layer copies, counted on `mesh`."""
    _, params, _ = abstract_params(model)
    shardings = param_shardings(params, mesh)
    flat = [(tuple(str(x) for x in path), variable.get_value()) for path, variable in nnx.to_flat_state(params)]
    opt_state = jax.eval_shape(make_optimizer(optimizer).init, params)
    return StateBytes(tree_bytes(_param_leaves(params, shardings)), sum(math.prod(v.shape) for _, v in flat),
                      tree_bytes(optimizer_leaves(opt_state, params, mesh)),
                      tree_bytes([(v, shardings[path]) for path, v in flat if path[:2] in LAYER_COPIES]))


# ----------------------------------------------------------------------------- compile
def activation_mode(activations: str, sizes: Mapping[str, int], target: Target | None, parameters: int) -> str:
    """"xla" or "estimate": `activations`, with "auto" resolved (xla for a TPU or GPU target, or when
    this process's devices can host the mesh, or are CPUs, and the model is small enough)."""
    if activations != "auto":
        return activations
    local = jax.devices()
    fits_locally = math.prod(sizes.values()) <= len(local) or local[0].platform == "cpu"
    return "xla" if (target is not None and target.name in ("tpu", "gpu")) or (
        fits_locally and parameters <= AUTO_XLA_MAX_PARAMETERS) else "estimate"


@dataclasses.dataclass(frozen=True)
class Compiled:
    """The compile stage's result: the activation mode it resolved, the target and the
    programs compiled for it (None: the shape estimate), and its notes."""
    activations: str  # "xla" | "estimate"
    target: Target | None
    programs: ProgramSet | None = None
    notes: tuple[str, ...] = ()

    @property
    def compiler(self) -> str:
        return self.programs.compiler if self.programs else "estimate"

    @property
    def target_name(self) -> str:
        return self.target.name if self.programs else ""

    def seconds(self, side: str) -> float:
        """Compile seconds of the programs of one side ("trainer" | "sampler"); 0 for the estimate."""
        return sum(p.seconds for p in getattr(self.programs, side)) if self.programs else 0.0


# ----------------------------------------------------------------------------- report
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
class StateRows:
    """The trainer's state in the tables: parameters, gradients, optimizer state."""
    parameters: Component
    gradients: Component
    optimizer: Component

    def __iter__(self):
        return iter((self.parameters, self.gradients, self.optimizer))


def state_rows(state: StateBytes, optimizer: str, micro_batches: int) -> StateRows:
    """The state's rows; the gradients twice (an accumulator beside a micro-batch's) when a
    step has several micro-batches."""
    p, o = state.parameters, state.optimizer
    copies = 2 if micro_batches > 1 else 1
    return StateRows(
        Component("parameters", p.per_device, p.total, p.summary()),
        Component("gradients" + (" (accumulator + micro-batch)" if copies > 1 else ""), copies * p.per_device,
                  copies * p.total, "as parameters"),
        Component(f"optimizer state ({optimizer}: mu, nu, counts)", o.per_device, o.total,
                  "as parameters; counts replicated"))


def reference_row(parameters: TreeBytes, kept: bool) -> Component:
    """The frozen reference: a copy of the parameters when the KL term keeps it, else none."""
    if kept:
        return Component("frozen reference (kl_ctl > 0)", parameters.per_device, parameters.total, "as parameters")
    return Component("frozen reference (none: kl_ctl = 0)", 0, 0, "-")


def batch_component(work, batch) -> Component:
    """The plan's row for one micro-batch's input arrays (`batch`: their abstract, sharded spec)."""
    b = tree_bytes([(leaf, leaf.sharding) for leaf in jax.tree.leaves(batch)])
    return Component(f"micro-batch inputs ({work.micro_batch_rows} rows x {work.train_length})", b.per_device,
                     b.total, "tokens over batch axes; pixels "
                     + ("by rows" if batch["pixel_values"].ndim == 3 else "replicated"))


def estimate_row(model: Qwen3VLConfig, work, sizes: Mapping[str, int], **options) -> Component:
    """The activations of the largest micro-batch by the per-layer formula (arrays.activation_estimate)."""
    temp = activation_estimate(model, work, sizes, **options)
    return Component("activations (ESTIMATE, largest micro-batch)", temp, temp,
                     f"remat {'on' if model.remat else 'off'}; per-layer formula", estimate=True)


def activation_row(compiler: str, program) -> Component:
    """The activations of the largest micro-batch: `program`'s temporaries by the compiler."""
    return Component(f"activations ({compiler} temp of {program.name}, largest micro-batch)", program.temp_bytes,
                     program.temp_bytes, f"{compiler} buffer assignment")


def code_row(compiler: str, what: str, code: int) -> Component:
    return Component(f"generated code ({compiler}, {what})", code, code, "per device")


def sampler_components(config: Qwen3VLConfig, rl, work: Workload, layout: SamplerLayout, mesh_sizes: Mapping[str, int],
                       programs: ProgramSet | None) -> tuple[tuple[Component, ...], Component, list[str]]:
    """(cache rows, the largest working set, notes) of the sampler phase: the KV caches with the
    sampler's CacheSpec and cache_sharding, laid out as sampling/sampler.py lays them out, and
    the working sets of its programs (or the prefill estimate)."""
    mesh = abstract_mesh(mesh_sizes)
    t = config.text
    cache_dtype = jnp.dtype(rl.sampler.cache_dtype or config.dtype).name

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
        copies = 2 if layout.subagent_refill else 1  # a refill's new prompts beside the rows' own
        how = (f"{layout.subagent_calls} waves of one refilled call a round, a second prompt cache while one "
               "moves in" if layout.subagent_refill else f"{layout.subagent_calls} call(s) a round")
        rows.append(dataclasses.replace(
            prompts, name=f"sub-agent KV cache ({layout.subagent_rows} rows x "
                          f"{layout.subagent_prefix_slots} + {layout.subagent_suffix_slots} slots; {how})",
            per_device_bytes=copies * prompts.per_device_bytes + own.per_device_bytes,
            global_bytes=copies * prompts.global_bytes + own.global_bytes))
    notes = ["no cache growth copy: the rollout sizes each row's cache for its whole episode up front"]
    if programs is None:
        size, which = prefill_estimate(config, rl, work, mesh_sizes)
        return tuple(rows), Component(f"prefill working set (ESTIMATE, {which})", size, size,
                                      "one layer + vision block", estimate=True), notes
    best = max(programs.sampler, key=lambda p: p.working_bytes)
    notes.append("sampler working sets (temp + the call's own inputs, per device): " + "; ".join(
        f"{p.name} {p.working_bytes / GIB:.2f} GiB ({p.group_rows} {_per_call(p)} per call)" for p in programs.sampler))
    rows.append(code_row(programs.compiler, f"{len(programs.sampler)} programs",
                         sum(p.code_bytes for p in programs.sampler)))
    working = Component(f"prefill/decode working set ({programs.compiler}, {best.name})", best.working_bytes,
                        best.working_bytes, f"{programs.compiler} buffer assignment")
    return tuple(rows), working, notes


def _per_call(program) -> str:
    """What a sampler program's group_rows counts: a vision tower's frames (over all its shards
    of rows), a prefill's or decode's rows."""
    if not program.name.startswith("vision tower"):
        return "rows"
    return "frames" + (f" in {program.vision_shards} shards of rows" if program.vision_shards > 1 else "")


def layer_copies_row(state: StateBytes) -> Component:
    """Sampler.weights: a per-layer copy of the decoder layers and of an untied lm head
    (dropped before the update)."""
    b = state.layer_copies
    return Component("decoder layer + lm head copies (Sampler.weights)", b.per_device, b.total,
                     "per-layer buffers; a device's bytes as the stacked parameters' (on a mesh the MLP "
                     "and the head split as tensor parallelism: SamplerConfig.decode_weight_split)")


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


def size_text(n: int) -> str:
    """A byte count in the tables' units (GiB, MiB or KiB, two decimals; 0 as "0")."""
    if n == 0:
        return "0"
    for unit, scale in (("GiB", GIB), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 2**10:.2f} KiB"
