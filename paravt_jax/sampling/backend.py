"""The sampler's per-backend policy: weight layouts, matmul forms and attention block sizes.

The model (models/qwen3_vl/text.py) keeps the math; the choices here only change how fast the
sampler's prefill and decode run on one platform, never what they compute:
  - decode weights: per-layer copies with the projections stored [out, in], q/k/v and gate/up
    fused into one weight each where no device holds a slice of their output axis (fewer,
    wider matmuls at decode's few rows), and an untied lm head as [vocab, D]; on a mesh the MLP
    split as tensor parallelism and the head by the vocabulary (WeightLayout);
  - weight-first matmuls on XLA:CPU: weight @ x^T for few rows and a large weight;
  - the prefill's attention block, sized from a score budget per backend.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Projections that read the same input, stored as one [sum(out), in] weight.
FUSED = {("q_proj", "k_proj", "v_proj"): "qkv_t", ("gate_proj", "up_proj"): "gate_up_t"}


@dataclasses.dataclass(frozen=True)
class WeightLayout:
    """How `programs.decode_weights` lays the sampler's copies out (a static jit argument).
    fuse: q/k/v and gate/up as one [sum(out), in] weight each (where no device holds a slice of
    their output axis: the split of a fused output would not line up with the shards).
    split: on a mesh, the MLP copies split over `axes` as tensor parallelism, gate and up by
    their output and down by its input, so a decode layer all-reduces one [rows, D] output
    instead of the [rows, 2 x intermediate] partial sums of the parameters' own layout (their
    contraction axis split); the untied lm head [vocab, D] split by the vocabulary, so no
    device sums [rows, vocab] partial logits. `axes`: the mesh axes that shard the parameters
    (the split holds the same bytes a device); empty: the parameters' layout."""
    fuse: bool = False
    mesh: object = None  # jax.sharding.Mesh of `axes`
    axes: tuple[str, ...] = ()
    head_axes: tuple[str, ...] = ()  # the lm head's split (empty: the parameters' layout)

    def constrain(self, array: jax.Array, axis: int, axes: tuple[str, ...]) -> jax.Array:
        """`array` split over `axes` along `axis`, whole along the others."""
        if not axes:
            return array
        from jax.sharding import NamedSharding, PartitionSpec

        spec = [None] * array.ndim
        spec[axis] = axes if len(axes) > 1 else axes[0]
        return jax.lax.with_sharding_constraint(array, NamedSharding(self.mesh, PartitionSpec(*spec)))


@dataclasses.dataclass(frozen=True)
class DecodeWeights:
    """Weight copies laid out for the sampler (see programs.decode_weights)."""
    layers: tuple  # per-layer parameter dicts, projections [out, in] under `<name>_t`
    head_t: jax.Array | None  # the untied lm head [vocab, D]; None when tied to the embeddings
    # the mesh the head is split over by the vocabulary (WeightLayout.head_axes; static): the
    # hidden states go to every device before the head, whose matmul then reads each device's
    # share once (with rows split over the devices, the TPU compiler otherwise loops over the
    # row shards, reading the share once a loop step)
    head_mesh: object = None


jax.tree_util.register_dataclass(DecodeWeights, data_fields=["layers", "head_t"], meta_fields=["head_mesh"])


@dataclasses.dataclass(frozen=True)
class SamplerBackend:
    """weight_first_max_rows / weight_first_min_bytes: matmuls of at most this many rows with
    a weight of at least this many bytes run as weight @ x^T (0 rows = never). XLA:CPU streams
    a weight that does not fit its caches 1.1-1.3x faster that way at decode's few rows
    (measured at 4-32 rows). prefill_score_bytes: the float32 score block budget of a blockwise
    prefill: cache-sized on XLA:CPU (8 MB measured fastest of 2, 8 and 16 MB), 256 MB on
    accelerators, where every block is a few kernel launches. prefill_tokens: the chunk tokens
    (rows x width) of one prefill row group: a decoder layer's activations of a group are
    ~prefill_tokens x (6 D + 3 (H + 2 KV) hd + 3 F) x itemsize (8B in bf16: ~1.6 GB at the
    default 16,384), whatever the number of rows or the tool-response length."""
    weight_first_max_rows: int
    weight_first_min_bytes: int
    prefill_score_bytes: int
    prefill_tokens: int = 16384
    # the key block of a decode step's bounded read of the suffix (DecodePlan.window "used"):
    # one loop iteration per filled block, at most one block read past the fill
    decode_block: int = 512

    def matmul_t(self, x: jax.Array, weight_t: jax.Array) -> jax.Array:
        """x [..., in] @ weight_t [out, in]^T -> [..., out]."""
        weight_t = weight_t.astype(x.dtype)
        if (np.prod(x.shape[:-1]) <= self.weight_first_max_rows
                and weight_t.size * weight_t.dtype.itemsize >= self.weight_first_min_bytes):
            return jnp.moveaxis(jnp.einsum("oi,...i->o...", weight_t, x), 0, -1)
        return jnp.einsum("...i,oi->...o", x, weight_t)

    def project(self, x: jax.Array, params: dict, names: tuple[str, ...],
                sizes: tuple[int, ...]) -> tuple[jax.Array, ...]:
        """(x @ kernel for each name) from `programs.decode_weights`' layouts: the fused [sum(sizes), in]
        weight when present, else each `<name>_t` [out, in]."""
        fused = FUSED.get(names)
        if fused in params:
            y = self.matmul_t(x, params[fused])
            return tuple(jnp.split(y, np.cumsum(sizes)[:-1].tolist(), axis=-1))
        return tuple(self.matmul_t(x, params[name + "_t"]) for name in names)

    def logits(self, lang, hidden: jax.Array, weights: DecodeWeights) -> jax.Array:
        """The decoder's output logits from the [vocab, D] head copy (XLA:CPU multiplies it
        ~1.4x faster at 8-32 rows than the [D, vocab] kernel)."""
        head_t = lang.head() if weights.head_t is None else weights.head_t
        if weights.head_mesh is not None:
            from jax.sharding import NamedSharding, PartitionSpec

            hidden = jax.lax.with_sharding_constraint(hidden, NamedSharding(weights.head_mesh, PartitionSpec()))
        return self.matmul_t(lang.final_norm(hidden), head_t)

    def prefill_block(self, rows: int, heads: int, max_block: int) -> int:
        """The largest power-of-two attention block (>= 16, <= max_block) whose float32 score
        block [rows, heads, block, block] fits prefill_score_bytes."""
        block = 16
        while block * 2 <= max_block and rows * heads * (block * 2) ** 2 * 4 <= self.prefill_score_bytes:
            block *= 2
        return block


def layer_copy(own: dict, layout: WeightLayout) -> dict:
    """One decoder layer's copies (`own`: its parameters, sliced from the stacked ones),
    projections stored [out, in] under `<name>_t`, laid out as `layout` says (WeightLayout:
    fused, or the MLP split as tensor parallelism).

    XLA:CPU and XLA:GPU copy a slice of a stacked weight that feeds a matmul; inside the
    sampler's decode loop that meant reading and writing the decoder weights once more per
    token, so the Sampler builds these buffers once and passes them in (programs.decode_weights:
    one layer a call, so that only one layer's resharding is in flight at a time)."""
    fused = {names: name for names, name in FUSED.items() if layout.fuse and not (layout.axes and name == "gate_up_t")}
    fused_names = {n for names in fused for n in names}
    split = {"gate_proj": 0, "up_proj": 0, "down_proj": 1} if layout.axes else {}  # [out, in]: the axis split
    layer = {name: p for name, p in own.items() if name not in PROJECTIONS}
    for name in PROJECTIONS:
        if name not in fused_names:
            weight = own[name].T
            layer[name + "_t"] = layout.constrain(weight, split[name], layout.axes) if name in split else weight
    layer.update({name: jnp.concatenate([own[n].T for n in names], axis=0) for names, name in fused.items()})
    return layer


def head_copy(lang, layout: WeightLayout) -> jax.Array | None:
    """The untied lm head's [vocab, D] copy, split by the vocabulary as `layout` says (None when
    the head is tied to the embeddings: the sampler reads those)."""
    return None if lang.tie_word_embeddings else layout.constrain(lang.head(), 0, layout.head_axes)


def backend_policy(platform: str | None = None, prefill_score_bytes: int = 0,
                   prefill_tokens: int = 0, decode_block: int = 0) -> SamplerBackend:
    """The policy for `platform` (default: jax's default backend); prefill_score_bytes,
    prefill_tokens and decode_block 0 = the platform's default."""
    platform = platform or jax.default_backend()
    cpu = platform == "cpu"
    return SamplerBackend(weight_first_max_rows=64 if cpu else 0,
                          weight_first_min_bytes=1 << 20,
                          prefill_score_bytes=prefill_score_bytes or ((8 << 20) if cpu else (256 << 20)),
                          prefill_tokens=prefill_tokens or SamplerBackend.prefill_tokens,
                          decode_block=decode_block or SamplerBackend.decode_block)
