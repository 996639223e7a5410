"""The fused attention kernels and the trace context that chooses and shards them.

  cudnn   `jax.nn.dot_product_attention(implementation="cudnn")`: GPU, bf16/fp16, causal or full
          masks with right padding (no packed segments, no cache masks).
  splash  the Pallas TPU splash attention kernel shipped with jax, with segment ids: TPU, causal
          or full self-attention, lengths a multiple of 128.

`cudnn_accepts` / `splash_accepts` say why a call cannot take a kernel (None when it can);
`attention.resolve` decides with them. The context: the platform traced programs are compiled
for (`compile_platform`, `target_platform`) and the mesh a sharded program runs on
(`kernel_mesh`), set by the planner and the train step around their traces.
"""
from __future__ import annotations

import contextlib
import contextvars
import math

import jax
import jax.numpy as jnp

from paravt_jax.models.qwen3_vl.attention_mask import AttentionMask

# The platform the traced program is compiled for. A run compiles for its own devices
# (jax.default_backend()); an ahead-of-time compile for other devices (the planner lowering for
# a TPU topology from a CPU process) names theirs with `compile_platform`, so `auto` picks the
# kernels of that platform. Every resolution made while tracing is recorded in `_RESOLVED`.
_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("attention_platform", default=None)
_RESOLVED: contextvars.ContextVar[list | None] = contextvars.ContextVar("attention_resolved", default=None)
# The mesh a sharded program runs on: a Pallas kernel cannot be partitioned automatically, so
# splash runs under shard_map over it (rows over data x fsdp, heads over tensor).
_MESH: contextvars.ContextVar = contextvars.ContextVar("attention_mesh", default=None)


@contextlib.contextmanager
def kernel_mesh(mesh):
    """Traces inside run fused kernels per shard of `mesh` (None: unsharded)."""
    token = _MESH.set(mesh)
    try:
        yield
    finally:
        _MESH.reset(token)


def target_platform() -> str:
    """The platform kernels are chosen for: the one `compile_platform` set, else the default backend's."""
    return _PLATFORM.get() or jax.default_backend()


@contextlib.contextmanager
def compile_platform(platform: str, resolved: list | None = None):
    """Traces inside choose kernels for `platform` ("tpu", "gpu", "cpu"); `resolved`, when given,
    collects (requested, chosen) of every attention call traced inside."""
    token, record = _PLATFORM.set(platform), _RESOLVED.set(resolved)
    try:
        yield
    finally:
        _PLATFORM.reset(token)
        _RESOLVED.reset(record)


def resolutions() -> list | None:
    """The list `compile_platform` collects resolutions into, or None outside one."""
    return _RESOLVED.get()


def cudnn_accepts(q: jax.Array, k: jax.Array, mask: AttentionMask, cache_layout: bool) -> str | None:
    """None when the cuDNN flash kernel takes this call, else why not."""
    if target_platform() != "gpu":
        return f"backend {target_platform()} is not gpu"
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        return f"dtype {q.dtype} (cuDNN flash attention takes bf16/fp16)"
    if cache_layout or mask.kind == "cache":
        return "a KV-cache mask"
    if mask.packed:
        return "packed segments (cuDNN takes sequence lengths, not segment ids)"
    if q.shape[-1] % 8 or q.shape[-1] > 256:
        return f"head_dim {q.shape[-1]}"
    return None


def cudnn_attention(q, k, v, mask: AttentionMask, implementation: str = "cudnn") -> jax.Array:
    """q [B, Lq, H, hd], k/v [B, Lk, KV, hd]; a causal mask over right-padded rows maps to
    is_causal plus per-row sequence lengths (the count of non-zero segment ids), a full mask to
    no mask. `implementation="xla"` runs the same mapping through XLA (tests on CPU)."""
    lengths = {}
    if mask.kind == "causal":
        lengths = dict(query_seq_lengths=jnp.sum(mask.query_segments > 0, -1).astype(jnp.int32),
                       key_value_seq_lengths=jnp.sum(mask.key_segments > 0, -1).astype(jnp.int32))
    out = jax.nn.dot_product_attention(q, k, v, is_causal=mask.causal, implementation=implementation,
                                       **lengths)
    if lengths:  # padding queries give zeros, as in the other implementations
        out = jnp.where((mask.query_segments > 0)[..., None, None], out, 0)
    return out


# The splash kernel's tile (query and key blocks, forward and backward).
SPLASH_BLOCK = 128


def splash_accepts(q: jax.Array, k: jax.Array, mask: AttentionMask, cache_layout: bool,
                   interpret: bool = False) -> str | None:
    """None when the splash kernel takes this call, else why not."""
    if not interpret and target_platform() != "tpu":
        return f"backend {target_platform()} is not tpu"
    if cache_layout or mask.kind == "cache":
        return "a KV-cache mask"
    if mask.query_parents is not None:
        return "parent segments (shared prompts; the kernel's segment ids are equality only)"
    if q.shape[1] != k.shape[1]:
        return f"query length {q.shape[1]} != key length {k.shape[1]}"
    if q.shape[1] % SPLASH_BLOCK:
        return f"length {q.shape[1]} is not a multiple of {SPLASH_BLOCK}"
    return None


def splash_attention(q, k, v, mask: AttentionMask, interpret: bool = False) -> jax.Array:
    """q [B, L, H, hd], k/v [B, L, KV, hd] through the Pallas splash kernel (one MQA kernel per
    KV head group, vmapped over batch and KV heads), segment ids from the mask. Padding tokens
    (segment 0) attend among themselves inside the kernel; their outputs are zeroed here."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    groups = heads // kv_heads
    single = (splash.CausalMask if mask.causal else splash.FullMask)((length, length))
    blocks = splash.BlockSizes(block_q=SPLASH_BLOCK, block_kv=SPLASH_BLOCK, block_kv_compute=SPLASH_BLOCK,
                               block_q_dkv=SPLASH_BLOCK, block_kv_dkv=SPLASH_BLOCK,
                               block_kv_dkv_compute=SPLASH_BLOCK, block_q_dq=SPLASH_BLOCK,
                               block_kv_dq=SPLASH_BLOCK)
    kernel = splash.make_splash_mqa_single_device(splash.MultiHeadMask([single] * groups),
                                                  block_sizes=blocks, interpret=interpret)
    scaled = (q * head_dim**-0.5).astype(q.dtype)
    # [B, L, KV, G, hd] -> [B, KV, G, L, hd]; k, v -> [B, KV, L, hd]
    qg = scaled.reshape(batch, length, kv_heads, groups, head_dim).transpose(0, 2, 3, 1, 4)
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def one_row(qr, kr, vr, seg):
        ids = splash.SegmentIds(q=seg, kv=seg)
        return jax.vmap(lambda a, b, c: kernel(a, b, c, segment_ids=ids))(qr, kr, vr)

    def local(qg, kt, vt, segments):
        return jax.vmap(one_row)(qg, kt, vt, segments)

    mesh = _MESH.get()
    if mesh is not None and mesh.size > 1:
        from jax.sharding import PartitionSpec as P

        rows = tuple(a for a in ("data", "fsdp") if a in mesh.shape and mesh.shape[a] > 1)
        row_axes = rows if rows and batch % math.prod(mesh.shape[a] for a in rows) == 0 else None
        tensor = mesh.shape.get("tensor", 1)
        head_axis = "tensor" if tensor > 1 and kv_heads % tensor == 0 else None
        spec = P(row_axes, head_axis)
        local = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, P(row_axes)), out_specs=spec,
                              check_vma=False)
    out = local(qg, kt, vt, mask.query_segments)
    out = out.transpose(0, 3, 1, 2, 4).reshape(batch, length, heads, head_dim)
    return jnp.where((mask.query_segments > 0)[..., None, None], out, 0).astype(q.dtype)


# The platform each fused kernel runs on.
KERNEL_PLATFORMS = {"cudnn": "gpu", "splash": "tpu"}
