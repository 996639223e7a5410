"""XLA's memory analysis of the sampler's real programs, for the planner (experiments/plan.py).

The jitted prefill and decode of sampling/sampler.py are lowered on abstract inputs
(`jax.ShapeDtypeStruct`s carrying the NamedShardings a run gives them: parameters as
paravt_jax.sharding lays them out, caches as kv_cache.cache_sharding, host inputs replicated)
for a mesh of the local devices, and compiled; `memory_analysis()` then gives each program's
per-device temporary buffers: its working set beyond its arguments and outputs. Nothing is
allocated, so the 8B programs can be measured on a CPU with fake devices
(XLA_FLAGS=--xla_force_host_platform_device_count=N). On CPU the programs compile with
`xla_backend_optimization_level=0`: buffer assignment comes before code generation, so the
numbers are the same and the compile takes half the time.

The attention implementation is resolved on the compiling backend (`auto` is blockwise or
dense on CPU: the cuDNN / splash kernels an accelerator may pick are not measured here); the
sampler backend policy (weight layouts, score-block budget, row groups) is the target
platform's (`platform`, default gpu).
"""
from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from paravt_jax import sharding as sh
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.models.qwen3_vl.hf_io import abstract_model
from paravt_jax.models.qwen3_vl.text import SharedPrefix
from paravt_jax.sampling import sampler as S
from paravt_jax.sampling.backend import backend_policy
from paravt_jax.sampling.kv_cache import CacheSpec, cache_sharding, row_shards


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
    """Per-device bytes of one compiled program: XLA's temporary buffers, and the program's own
    inputs that are neither parameters nor caches (the chunk, vision features, decode state)."""
    name: str
    temp_bytes: int
    input_bytes: int
    group_rows: int  # rows per call (the prefill's row group; all rows for the decode)
    seconds: float

    @property
    def working_bytes(self) -> int:
        return self.temp_bytes + self.input_bytes


def _bytes_per_device(tree) -> int:
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


class SamplerPrograms:
    """Lowers and compiles the sampler's prefill and decode for `config` on `mesh` (a real
    mesh of local devices) with the knobs of `sampler` (a SamplerConfig)."""

    def __init__(self, config: Qwen3VLConfig, sampler: S.SamplerConfig, mesh, platform: str = "gpu"):
        self.config, self.mesh = config, mesh
        self.sampler = sampler
        self.backend = backend_policy(platform, sampler.attention_block_bytes, sampler.prefill_tokens)
        self.cache_dtype = jnp.dtype(sampler.cache_dtype or config.dtype)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        model = abstract_model(config)
        graphdef, state = nnx.split(model)
        self.graphdef = S._HashOnce(graphdef)
        self.params = jax.tree.map(
            lambda v: v.replace(jax.ShapeDtypeStruct(
                v.get_value().shape, v.get_value().dtype,
                sharding=sh.named_sharding(mesh, sh.param_axes(v), v.get_value().shape))),
            state, is_leaf=lambda x: isinstance(x, nnx.Variable))
        self.options = {"xla_backend_optimization_level": 0} if jax.devices()[0].platform == "cpu" else {}
        q_proj = next(v for path, v in nnx.to_flat_state(self.params) if path[-1] == "q_proj").get_value()
        fuse = q_proj.sharding.shard_shape(q_proj.shape)[2] == q_proj.shape[2]
        compiled = S._decode_weights.lower(self.graphdef, self.params, fuse).compile(compiler_options=self.options)
        shapes = jax.eval_shape(lambda p: S._decode_weights(self.graphdef, p, fuse), self.params)
        self.weights = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                    shapes, compiled.output_shardings)

    # -- abstract inputs ---------------------------------------------------------------------
    def _host(self, shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=self.replicated)

    def cache(self, rows: int, capacity: int):
        """Abstract (keys, values, valid) of a cache as Sampler._empty_cache makes it."""
        t = self.config.text
        spec = CacheSpec(t.num_hidden_layers, rows, capacity, t.num_key_value_heads, t.head_dim,
                         self.cache_dtype.name)
        shardings = cache_sharding(self.mesh, spec)
        keys = tuple(jax.ShapeDtypeStruct(spec.key_layer_shape, self.cache_dtype, sharding=shardings.keys)
                     for _ in range(spec.layers))
        values = tuple(jax.ShapeDtypeStruct(spec.layer_shape, self.cache_dtype, sharding=shardings.values)
                       for _ in range(spec.layers))
        return keys, values, self._host((rows, capacity), jnp.bool_), shardings

    def _compile(self, name, fn, args, kwargs, own_inputs, group) -> ProgramMemory:
        start = time.perf_counter()
        compiled = fn.lower(*args, **kwargs).compile(compiler_options=self.options)
        temp = int(compiled.memory_analysis().temp_size_in_bytes)
        return ProgramMemory(name, temp, _bytes_per_device(own_inputs), group, time.perf_counter() - start)

    # -- programs ----------------------------------------------------------------------------
    def prefill(self, call: PrefillCall) -> ProgramMemory:
        """One row group of `call` through the real jitted prefill."""
        prompts = call.prompts or call.rows
        keys, values, valid, shardings = self.cache(call.rows, call.capacity)
        t = self.config.text
        spec = CacheSpec(t.num_hidden_layers, call.rows, call.capacity, t.num_key_value_heads, t.head_dim,
                         self.cache_dtype.name)
        shards = row_shards(shardings, spec, prompts)
        group = S.prefill_group(call.rows, call.rows // prompts, call.width, shards, self.backend.prefill_tokens)
        prefix = None
        if call.prompts:
            pk, pv, pvalid, _ = self.cache(call.prompts, call.prefix_slots)
            prefix = SharedPrefix(pk, pv, pvalid)
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
        args = (self.graphdef, self.params, self.weights, keys, values, valid, prefix, scalar, scalar,
                *chunk, *vision)
        kwargs = dict(sharding=shardings, window=call.capacity, backend=self.backend, block=block, shards=shards)
        return self._compile(call.name, S._prefill, args, kwargs, (chunk, vision), group)

    def decode(self, rows: int, capacity: int, prompts: int, prefix_slots: int, max_new_tokens: int,
               name: str = "decode") -> ProgramMemory:
        """The real jitted decode loop over `rows` rows of a `capacity`-slot suffix attending to
        `prompts` prefixes of `prefix_slots`."""
        keys, values, valid, shardings = self.cache(rows, capacity)
        pk, pv, pvalid, _ = self.cache(prompts, prefix_slots)
        steps = S.bucket(max_new_tokens, 16)
        host = self._host
        carry = S._DecodeCarry(host((), jnp.int32), host((rows, steps), jnp.int32), host((rows, steps), jnp.float32),
                               host((rows,), jnp.int32), host((rows,), jnp.bool_), host((rows,), jnp.bool_),
                               host((), jnp.int32), host((rows,), jnp.int32))
        own = (host((rows, self.config.text.vocab_size), jnp.float32), host((rows,), jnp.int32),
               host((S.MAX_STOP_IDS,), jnp.int32), host((rows, 2), jnp.uint32))
        knobs = (host((), jnp.float32), host((), jnp.float32), host((), jnp.int32))
        args = (self.graphdef, self.params, self.weights, keys, values, valid, SharedPrefix(pk, pv, pvalid),
                *own, *knobs, carry, steps)
        kwargs = dict(sharding=shardings, backend=self.backend)
        return self._compile(name, S._decode, args, kwargs, (own, carry), rows)

