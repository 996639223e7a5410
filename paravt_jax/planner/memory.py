"""XLA's memory analysis of the sampler's real programs, for the planner (planner/plan.py).

The jitted prefill, decode and vision tower of sampling/sampler.py are lowered on abstract
inputs (`jax.ShapeDtypeStruct`s carrying the NamedShardings a run gives them: parameters as
paravt_jax.infra.sharding lays them out, caches as kv_cache.cache_sharding, a vision pass's
inputs per shard of rows where the sampler splits them (`vision_inputs`), other host inputs
replicated) for a mesh of the local devices, and compiled; `memory_analysis()` then gives each program's
per-device temporary buffers: its working set beyond its arguments and outputs. Nothing is
allocated, so the 8B programs can be measured on a CPU with fake devices
(XLA_FLAGS=--xla_force_host_platform_device_count=N). On CPU the programs compile with
`xla_backend_optimization_level=0`: buffer assignment comes before code generation, so the
numbers are the same and the compile takes half the time; XLA:GPU's compiles likewise generate
unoptimised code (planner/gpu_target.py `COMPILE_OPTIONS`).

The attention implementation is resolved for the devices compiled for (fused_attention.compile_platform:
splash on TPU devices, the libtpu compiler running in this CPU process; cuDNN's fused attention
on the GPU target's compile-only devices (planner/gpu_target.py), where it takes the call;
blockwise or dense on fake CPU devices, where the cuDNN kernel a GPU picks is not compiled); a
fused kernel the compiler refuses is an error naming it. The sampler backend policy (weight
layouts, score-block budget, row groups) is the target platform's (`platform`; for fake CPU
devices gpu by default). Each program also reports its cost analysis (`cost_analysis()`, or
XLA:CPU's analysis of the optimised module where the compiler has none: `module_costs`) and the
bytes its collectives move, for the time plan (planner/time_plan.py).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.models.qwen3_vl.fused_attention import KERNEL_PLATFORMS, compile_platform, kernel_mesh
from paravt_jax.models.qwen3_vl.hf_io import abstract_model
from paravt_jax.models.qwen3_vl.text import KVCache
from paravt_jax.models.qwen3_vl.vision import vision_layout
from paravt_jax.planner import gpu_target
from paravt_jax.planner.hlo_counts import physical_bytes
from paravt_jax.sampling import programs as P
from paravt_jax.sampling import sampler as S
from paravt_jax.sampling.backend import backend_policy
from paravt_jax.sampling.chunks import prefill_group
from paravt_jax.sampling.decode import DecodeCarry, DecodeInputs, DecodePlan, decode
from paravt_jax.sampling.kv_cache import CacheSpec, cache_sharding, row_shards
from paravt_jax.sampling.params import MAX_STOP_IDS
from paravt_jax.sampling.prefill import PrefillChunk, PrefillPlan, prefill
from paravt_jax.train.batch import shard_frame_targets


@dataclasses.dataclass(frozen=True)
class PrefillCall:
    """One prefill as the sampler runs it: `rows` cache rows of `capacity` slots written with a
    chunk of `width` tokens, in row groups of the backend's token budget. prompts > 0: the rows
    attend to `prompts` shared prefixes of `prefix_slots` (an extend); 0: a prompt prefill.
    visual_tokens_per_row: merged vision tokens in one row's chunk."""
    name: str
    rows: int
    capacity: int
    width: int
    prompts: int = 0
    prefix_slots: int = 0
    visual_tokens_per_row: int = 0


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
    """Per-device numbers of one compiled program. Memory (`memory_analysis()`): its arguments,
    outputs (less the donated buffers they alias), XLA's temporary buffers, generated code, and
    the program's own inputs that are neither parameters nor caches (the chunk, vision features,
    decode state). Cost (`cost_analysis()`): FLOPs and HBM bytes accessed, as XLA counts them
    (a loop body once, whatever its trip count; nothing inside a Pallas or cuDNN custom call),
    and the bytes the program's collectives move per device (`collective_bytes`)."""
    name: str
    temp_bytes: int
    input_bytes: int
    group_rows: int  # rows per call (the prefill's row group; all rows for the decode); a vision tower: its frames
    seconds: float  # compile seconds
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    code_bytes: int = 0
    flops: float = 0.0
    bytes_accessed: float = 0.0
    collective_bytes: float = 0.0
    compiler: str = ""  # "tpu" | "gpu" | "xla:cpu"
    # where flops / bytes_accessed come from: the compiler's own cost analysis ("tpu", "xla:cpu"),
    # or XLA:CPU's cost analysis of the compiled module (MODULE_COSTS: XLA:GPU without a device
    # has none of its own)
    cost_source: str = ""
    attention: tuple[str, ...] = ()  # the kernels the program's attention calls resolved to
    # forward FLOPs / bytes of the attention calls XLA does not count (fused kernels, blockwise
    # loops), whole calls: text (causal, cache, prefix masks) and vision (per-frame full masks)
    kernel_text_flops: float = 0.0
    kernel_text_bytes: float = 0.0
    kernel_vision_flops: float = 0.0
    kernel_vision_bytes: float = 0.0
    # HBM bytes per call of the optimised HLO by the physical rule (planner/hlo_counts.py: each
    # instruction's operands read once and output written once, slices and in-place updates at
    # their sizes, loops of known trip count every run, one branch of a conditional)
    physical_bytes: float = 0.0
    # a vision tower's passes, one per shard of rows, each on its shard's devices
    # (vision_pass.vision_split); 1: one pass over every frame, replicated
    vision_shards: int = 1
    # a prefill's row blocks over the devices (kv_cache.row_shards): its attention calls read the
    # cache rows where they live, each device its block of the group's rows and their prompts'
    # prefixes, and its matmuls each device's rows too (sampling/prefill.row_split: not with
    # prefill_row_split off or a tensor axis, where every device runs all the group's tokens); 1: not split
    row_shards: int = 1
    # a prefill's attention key block (SamplerBackend.prefill_block of its row group); 0: not a prefill
    attention_block: int = 0

    @property
    def working_bytes(self) -> int:
        return self.temp_bytes + self.input_bytes

    @property
    def total_bytes(self) -> int:
        """Everything the program holds on a device while it runs."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes


COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
             "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
_INSTRUCTION = re.compile(r"=\s*(\(.*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+(" + "|".join(COLLECTIVES)
                          + r")(-start)?\(")
_ARRAY = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_GROUPS_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]")
_GROUPS_LIST = re.compile(r"replica_groups=\{\{([0-9,]*)\}")


def collective_bytes(hlo_text: str) -> float:
    """Bytes one device sends over the interconnect for the collectives of an optimized HLO
    module (each op counted once, as XLA's cost analysis counts a loop body): an all-gather
    or all-to-all moves (n-1)/n of its result, a reduce-scatter (n-1) times its result, an
    all-reduce 2(n-1)/n of its operand (ring algorithms), a collective-permute its result;
    n is the replica group size."""
    total = 0.0
    for line in hlo_text.splitlines():
        found = _INSTRUCTION.search(line)
        if not found:
            continue
        shapes = [(dtype, [int(d) for d in dims.split(",") if d]) for dtype, dims in _ARRAY.findall(found.group(1))]
        sizes = [math.prod(dims) * _ITEMSIZE.get(dtype, 4) for dtype, dims in shapes]
        if not sizes:
            continue
        size, op = max(sizes), found.group(2)
        iota, listed = _GROUPS_IOTA.search(line), _GROUPS_LIST.search(line)
        n = int(iota.group(2)) if iota else (len(listed.group(1).split(",")) if listed else 2)
        if n <= 1 and op != "collective-permute":
            continue
        share = {"all-gather": (n - 1) / n, "all-to-all": (n - 1) / n, "reduce-scatter": n - 1,
                 "all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}[op]
        total += share * size
    return total


MODULE_COSTS = "xla:cpu cost analysis of the optimised module"


def module_costs(compiled) -> dict:
    """XLA's HloCostAnalysis (the CPU backend's) over a compiled program's optimised HLO module:
    for executables whose backend has no cost analysis (XLA:GPU compiling without a device).
    Fusions, layouts and collectives are the compiled program's; a custom call (cuDNN attention,
    a cuBLAS GEMM) counts no FLOPs (the time plan adds attention kernels analytically)."""
    from jax._src.lib import _jax  # no public entry point: jax's own Lowered.cost_analysis uses it

    modules = compiled.runtime_executable().hlo_modules()
    return dict(_jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, modules[0]))


def compiled_stats(name: str, compiled, own_inputs, group: int, seconds: float, compiler: str,
                   attention: tuple = ()) -> ProgramMemory:
    """ProgramMemory of a compiled program (jax.stages.Compiled); attention: the AttentionCalls
    traced for it."""
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, (list, tuple)) else (cost or {})
    source = compiler
    if not cost:
        cost, source = module_costs(compiled), MODULE_COSTS
    text = compiled.as_text()
    return ProgramMemory(
        name, int(memory.temp_size_in_bytes), _bytes_per_device(own_inputs), group, seconds,
        argument_bytes=int(memory.argument_size_in_bytes), output_bytes=int(memory.output_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes), code_bytes=int(memory.generated_code_size_in_bytes),
        flops=float(cost.get("flops", 0.0)), bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        collective_bytes=collective_bytes(text), compiler=compiler, cost_source=source,
        physical_bytes=physical_bytes(text),
        attention=tuple(sorted({c.chosen for c in attention})),
        **{f"kernel_{part}_{what}": float(sum(getattr(c, what) for c in attention if c.chosen != "dense"
                                              and (c.kind == "full") == (part == "vision")))
           for part in ("text", "vision") for what in ("flops", "bytes")})


def compiler_name(devices) -> str:
    """The compiler a program for these devices goes through: "tpu" (libtpu), "gpu" (XLA:GPU),
    else "xla:<platform>"."""
    platform = devices[0].platform
    return platform if platform in ("tpu", "gpu") else f"xla:{platform}"


def compile_for(name: str, fn, args, kwargs, own_inputs, group: int, devices, keep: bool = False, mesh=None):
    """Lowers `fn` (a jitted function) on abstract `args` for `devices`, choosing attention
    kernels for their platform, compiles it and reads its numbers; with `keep`, (numbers, the
    compiled program)."""
    platform = devices[0].platform
    options = ({"xla_backend_optimization_level": 0} if platform == "cpu" else
               dict(gpu_target.COMPILE_OPTIONS) if platform == "gpu" else {})
    resolved: list = []
    # a trace cached from an earlier program of the same shapes (two vision towers of the same
    # frames) would record no attention calls: trace afresh
    fn.clear_cache()
    start = time.perf_counter()
    try:
        with compile_platform(platform, resolved), kernel_mesh(mesh):
            lowered = fn.lower(*args, **kwargs)
        compiled = lowered.compile(compiler_options=options)
    except Exception as e:  # a fused kernel the compiler refuses is named (attention.resolve chose it)
        fused = sorted({(c.requested, c.chosen) for c in resolved if c.chosen in KERNEL_PLATFORMS})
        if not fused:
            raise
        kernels = ", ".join(f"{chosen} (model.attention={requested!r})" for requested, chosen in fused)
        raise ValueError(f"model.attention={fused[0][0]!r}: the {compiler_name(devices)} compiler refused "
                         f"{name} with the attention kernel {kernels}: {type(e).__name__}: {e}") from e
    stats = compiled_stats(name, compiled, own_inputs, group, time.perf_counter() - start, compiler_name(devices),
                           tuple(resolved))
    # a large plan compiles for many minutes: one line per program shows where it is
    logging.info(f"[plan] {name}: compiled by {stats.compiler} for {len(devices)} devices in {stats.seconds:.1f} s, "
                 f"{stats.temp_bytes / 2**30:.2f} GiB of temporaries per device")
    return (stats, compiled) if keep else stats


def vision_inputs(config: Qwen3VLConfig, images: dict[tuple[int, int], int], mesh, split: int = 1) -> tuple:
    """Abstract (pixel_values, vision meta) of `images` single-frame items per (h, w) patch grid
    as Sampler.vision_inputs passes them (train/batch.py shard_vision): split = 1, one pass
    over every frame, replicated, each count padded to a power of two; split = S > 1, S passes
    of images / S frames each (every row as full as the next), padded alike
    (shard_frame_targets), every array with a leading S axis placed as vision_pass.vision_sharding
    places it. The meta has the shapes `vision_layout(...).device_arrays()` gives them."""
    if any(count % split for count in images.values()):
        raise ValueError(f"vision frames {images} do not split into {split} shards of rows")
    block = np.array([[1, h, w] for (h, w), count in sorted(images.items()) for _ in range(count // split)])
    targets = shard_frame_targets([block], sum(images.values()), split)
    grids = [[1, h, w] for (h, w), count in sorted(targets.items()) for _ in range(count)]
    layout = vision_layout(np.array(grids), config.vision).device_arrays()
    patches = sum(h * w for _, h, w in grids)
    lead = (split,) if split > 1 else ()

    def spec(shape, dtype):
        shape = (*lead, *shape)
        sharding = S.vision_sharding(mesh, len(shape), split) if split > 1 else NamedSharding(mesh, PartitionSpec())
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    pixels = spec((patches, config.vision.patch_dim), jnp.float32)
    return pixels, jax.tree.map(lambda x: spec(np.shape(x), np.asarray(x).dtype), layout)


def _bytes_per_device(tree) -> int:
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


class SamplerPrograms:
    """Lowers and compiles the sampler's prefill and decode for `config` on `mesh` (a real
    mesh of local devices) with the knobs of `sampler` (a SamplerConfig)."""

    def __init__(self, config: Qwen3VLConfig, sampler: S.SamplerConfig, mesh, platform: str | None = None,
                 keep_compiled: bool = False):
        self.config, self.mesh = config, mesh
        # keep_compiled: each program's compiled executable in `compiled` by name (for reading its HLO)
        self.compiled: dict | None = {} if keep_compiled else None
        self.devices = list(mesh.devices.flat)
        self.sampler = sampler
        # the target platform's backend policy: the devices' own for TPU / GPU devices, gpu's
        # for fake CPU devices unless `platform` says otherwise
        own = self.devices[0].platform
        self.backend = backend_policy(platform or ("gpu" if own == "cpu" else own), sampler.attention_block_bytes,
                                      sampler.prefill_tokens, sampler.decode_block)
        self.cache_dtype = jnp.dtype(sampler.cache_dtype or config.dtype)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        model = abstract_model(config)
        graphdef, state = nnx.split(model)
        self.graphdef = P.HashOnce(graphdef)
        self.params = jax.tree.map(
            lambda v: v.replace(jax.ShapeDtypeStruct(
                v.get_value().shape, v.get_value().dtype,
                sharding=sh.named_sharding(mesh, sh.param_axes(v), v.get_value().shape))),
            state, is_leaf=lambda x: isinstance(x, nnx.Variable))
        self.layout = P.weight_layout(self.params, config, sampler.decode_weight_split)

    # the weight refresh: Sampler.weights' per-layer copies, made after every optimizer step, one
    # layer a call (programs.decode_weights); the program compiled is the first layer's, which
    # copies the lm head too (the time plan runs it once per layer). Compiled when first needed
    # (a prefill, a decode or the refresh's own numbers): the copies' shardings are the compiled
    # program's output shardings; a vision tower needs neither.
    @functools.cached_property
    def _refresh(self) -> tuple[ProgramMemory, object]:
        index = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.replicated)
        stats, compiled = self._compile_with("weight refresh", P.layer_copy_program,
                                             (self.graphdef, self.params, index, self.layout),
                                             {"with_head": True}, (), 0)
        layer_sharding, head_sharding = compiled.output_shardings
        layers = self.config.text.num_hidden_layers
        shapes = jax.eval_shape(lambda p: P.decode_weights(self.graphdef, p, self.layout, layers), self.params)

        def placed(tree, shardings):
            return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)

        weights = dataclasses.replace(shapes, layers=tuple(placed(layer, layer_sharding) for layer in shapes.layers),
                                      head_t=None if shapes.head_t is None else placed(shapes.head_t, head_sharding))
        return stats, weights

    @property
    def refresh(self) -> ProgramMemory:
        return self._refresh[0]

    @property
    def weights(self):
        return self._refresh[1]

    # -- abstract inputs ---------------------------------------------------------------------
    def _host(self, shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=self.replicated)

    def cache(self, rows: int, capacity: int) -> tuple[KVCache, object]:
        """Abstract (cache, its shardings) of a cache as Sampler.empty_cache makes it."""
        t = self.config.text
        spec = CacheSpec(t.num_hidden_layers, rows, capacity, t.num_key_value_heads, t.head_dim,
                         self.cache_dtype.name)
        shardings = cache_sharding(self.mesh, spec)
        keys = tuple(jax.ShapeDtypeStruct(spec.key_layer_shape, self.cache_dtype, sharding=shardings.keys)
                     for _ in range(spec.layers))
        values = tuple(jax.ShapeDtypeStruct(spec.layer_shape, self.cache_dtype, sharding=shardings.values)
                       for _ in range(spec.layers))
        return KVCache(keys, values, self._host((rows, capacity), jnp.bool_)), shardings

    def _compile_with(self, name, fn, args, kwargs, own_inputs, group):
        stats, compiled = compile_for(name, fn, args, kwargs, own_inputs, group, self.devices, keep=True,
                                      mesh=self.mesh)
        return stats, compiled

    def _compile(self, name, fn, args, kwargs, own_inputs, group) -> ProgramMemory:
        if self.compiled is None:
            return compile_for(name, fn, args, kwargs, own_inputs, group, self.devices, mesh=self.mesh)
        stats, self.compiled[name] = self._compile_with(name, fn, args, kwargs, own_inputs, group)
        return stats

    def vision(self, name: str, images: dict[tuple[int, int], int], shards: int = 1) -> ProgramMemory:
        """The vision tower of one row group (Sampler.prefill_chunk): `images` frames of each
        (h, w) in patches, from rows in `shards` device blocks of cache rows, passed as
        Sampler.vision_inputs passes them (`vision_inputs`): per shard of rows when
        vision_pass.vision_split says so (SamplerConfig.vision_shards), else one replicated pass."""
        split = S.vision_split(self.sampler, self.mesh, shards)
        pixels, meta = vision_inputs(self.config, images, self.mesh, split)
        stats = self._compile(name, P.vision, (self.graphdef, self.params, pixels, meta),
                              dict(mesh=self.mesh if split > 1 else None), (pixels, meta), sum(images.values()))
        return dataclasses.replace(stats, vision_shards=split)

    def prefill_vision(self, name: str, call: PrefillCall, patches: tuple[int, int], per_row: int) -> ProgramMemory:
        """The vision tower of one row group of `call`, each row with `per_row` frames of
        `patches` (h, w), split as the sampler splits the group's rows (`_row_group`)."""
        shards, group = self._row_group(call, self.cache(call.rows, call.capacity)[1])
        return self.vision(name, {patches: group * per_row}, shards)

    def _row_group(self, call: PrefillCall, shardings) -> tuple[int, int]:
        """(row shards of the call's cache, rows per prefill call) as the sampler splits `call`."""
        t = self.config.text
        spec = CacheSpec(t.num_hidden_layers, call.rows, call.capacity, t.num_key_value_heads, t.head_dim,
                         self.cache_dtype.name)
        prompts = call.prompts or call.rows
        shards = row_shards(shardings, spec, prompts)
        return shards, prefill_group(call.rows, call.rows // prompts, call.width, shards, self.backend.prefill_tokens)

    # -- programs ----------------------------------------------------------------------------
    def prefill(self, call: PrefillCall) -> ProgramMemory:
        """One row group of `call` through the real jitted prefill."""
        cache, shardings = self.cache(call.rows, call.capacity)
        shards, group = self._row_group(call, shardings)
        prefix = self.cache(call.prompts, call.prefix_slots)[0] if call.prompts else None
        scalar = self._host((), jnp.int32)
        chunk = (self._host((group, call.width), jnp.int32), self._host((3, group, call.width), jnp.int32),
                 self._host((group,), jnp.int32))
        vision = (None, None, None)
        visual = group * call.visual_tokens_per_row
        if visual:
            d, compute = self.config.text.hidden_size, jnp.dtype(self.config.dtype)
            layers = len(self.config.vision.deepstack_visual_indexes)
            vision = (self._host((group, call.width), jnp.int32), self._host((visual, d), compute),
                      self._host((layers, visual, d), compute))
        block = self.backend.prefill_block(group, self.config.text.num_attention_heads, self.config.attention_block)
        args = (self.graphdef, self.params, self.weights, cache, prefix, PrefillChunk(*chunk, *vision, scalar, scalar))
        plan = PrefillPlan(shardings, self.backend, window=call.capacity, block=block, shards=shards,
                           split_rows=self.sampler.prefill_row_split)
        stats = self._compile(call.name, prefill, args, dict(plan=plan), (chunk, vision), group)
        return dataclasses.replace(stats, row_shards=shards, attention_block=block)

    def decode(self, rows: int, capacity: int, prompts: int, prefix_slots: int, max_new_tokens: int,
               name: str = "decode", truncation: bool = True) -> ProgramMemory:
        """The real jitted decode loop over `rows` rows of a `capacity`-slot suffix attending to
        `prompts` prefixes of `prefix_slots`; with the top-p / top-k branch when `truncation`
        (the rollout's SamplingParams.truncates)."""
        cache, shardings = self.cache(rows, capacity)
        prefix, _ = self.cache(prompts, prefix_slots)
        steps = S.bucket(max_new_tokens, 16)
        host = self._host
        carry = DecodeCarry(host((), jnp.int32), host((rows, steps), jnp.int32), host((rows, steps), jnp.float32),
                               host((rows,), jnp.int32), host((rows,), jnp.bool_), host((rows,), jnp.bool_),
                               host((), jnp.int32), host((rows,), jnp.int32))
        own = (host((rows, self.config.text.vocab_size), jnp.float32), host((rows,), jnp.int32),
               host((rows, 2), jnp.uint32), host((MAX_STOP_IDS,), jnp.int32))
        inputs = DecodeInputs(*own, host((), jnp.float32), host((), jnp.float32), host((), jnp.int32), steps)
        args = (self.graphdef, self.params, self.weights, cache, prefix, inputs, carry)
        plan = DecodePlan(shardings, self.backend, self.sampler.decode_window, truncation=truncation)
        return self._compile(name, decode, args, dict(plan=plan), (own, carry), rows)

