"""The planner's array accounting: bytes per device of sharded pytrees (parameters, optimizer
state), and the per-layer activation and prefill estimates from the shapes (the fallback when
XLA does not measure them), with the abstract training batch XLA compiles."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from paravt_jax.infra import meshes
from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl.attention import DENSE_MAX_SCORE_BYTES
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.models.qwen3_vl.hf_io import abstract_model
from paravt_jax.models.qwen3_vl.vision import frame_buckets
from paravt_jax.planner.workload import PlanError, Workload, sampler_calls, sampler_layout
from paravt_jax.sampling.backend import backend_policy
from paravt_jax.sampling.chunks import prefill_group
from paravt_jax.sampling.vision_pass import vision_split
from paravt_jax.train.batch import vision_shard_count
from paravt_jax.video.frames import PATCH

GIB = 2**30


# ----------------------------------------------------------------------------- mesh
def parse_mesh(text: str) -> dict[str, int]:
    """`data=1,fsdp=8,tensor=1` -> sizes (one may be -1: the remaining devices)."""
    try:
        return sh.parse_mesh(text)
    except ValueError as e:
        raise PlanError(f"--mesh: {e}; or give a preset name from paravt_jax/infra/meshes.py") from None


def resolve_mesh(sizes: Mapping[str, int], devices: int | None) -> dict[str, int]:
    """Fills a -1 axis from `devices` and checks the product; returns positive sizes."""
    try:
        sizes = sh.mesh_sizes(sizes, devices)
    except ValueError as e:
        raise PlanError(str(e)) from None
    free = [axis for axis, size in sizes.items() if size == -1]
    if free:
        raise PlanError(f"mesh {sizes}: axis {free[0]!r} is -1; give --devices=N")
    return sizes


def mesh_preset(name: str) -> tuple[dict[str, int], float]:
    """(axis sizes, device_memory_gb) of a preset in paravt_jax/infra/meshes.py."""
    try:
        entry = meshes.get_mesh(name)
        sizes = dict(meshes.mesh_shape(entry))
    except (KeyError, ValueError) as e:
        raise PlanError(f"--mesh={name!r}: {e.args[0] if e.args else e}") from None
    return sizes, float(entry["device_memory_gb"])


def abstract_mesh(sizes: Mapping[str, int]) -> AbstractMesh:
    return AbstractMesh(tuple(int(sizes[a]) for a in sh.MESH_AXES), sh.MESH_AXES)


# ----------------------------------------------------------------------------- arrays
def _shard_bytes(shape: Sequence[int], dtype, sharding: NamedSharding | None) -> tuple[int, int]:
    """(per-device bytes, global bytes) of one array."""
    itemsize = jnp.dtype(dtype).itemsize
    total = math.prod(shape) * itemsize
    if sharding is None:
        return total, total
    return math.prod(sharding.shard_shape(tuple(shape))) * itemsize, total


@dataclasses.dataclass(frozen=True)
class TreeBytes:
    per_device: int
    total: int
    leaves: int
    replicated_leaves: int
    replicated_bytes: int  # global bytes of the fully replicated leaves
    axes: tuple[str, ...]  # mesh axes any leaf is sharded over

    def summary(self) -> str:
        if not self.leaves:
            return "-"
        if self.replicated_leaves == self.leaves:
            return "replicated"
        share = 100.0 * (self.total - self.replicated_bytes) / max(self.total, 1)
        return (f"over {','.join(self.axes)}: {share:.1f}% of bytes sharded; "
                f"{self.replicated_leaves}/{self.leaves} leaves replicated")


def tree_bytes(leaves_with_shardings: Sequence[tuple[jax.ShapeDtypeStruct, NamedSharding | None]]) -> TreeBytes:
    per_device = total = replicated = replicated_bytes = 0
    axes: set[str] = set()
    for leaf, sharding in leaves_with_shardings:
        mine, whole = _shard_bytes(leaf.shape, leaf.dtype, sharding)
        per_device += mine
        total += whole
        spec = sharding.spec if sharding is not None else PartitionSpec()
        used = {a for entry in spec if entry is not None
                for a in ((entry,) if isinstance(entry, str) else entry)}
        axes |= used
        if not used:
            replicated += 1
            replicated_bytes += whole
    return TreeBytes(per_device, total, len(leaves_with_shardings), replicated, replicated_bytes,
                     tuple(a for a in sh.MESH_AXES if a in axes))


def abstract_params(config: Qwen3VLConfig):
    """(graphdef, nnx.State of Params holding ShapeDtypeStructs, non-param state)."""
    return nnx.split(abstract_model(config), nnx.Param, ...)


def param_shardings(params, mesh) -> dict[tuple[str, ...], NamedSharding]:
    """Parameter path -> the NamedSharding TrainStep / init_model give it on `mesh`."""
    out = {}
    for path, variable in nnx.to_flat_state(params):
        value = variable.get_value()
        out[tuple(str(p) for p in path)] = sh.named_sharding(mesh, sh.param_axes(variable), value.shape)
    return out


def _param_leaves(params, shardings) -> list[tuple[jax.ShapeDtypeStruct, NamedSharding]]:
    return [(variable.get_value(), shardings[tuple(str(p) for p in path)])
            for path, variable in nnx.to_flat_state(params)]


def optimizer_leaves(opt_state, params, mesh):
    """Each optimizer-state leaf with the sharding TrainStep gives it (`sharding.optimizer_shardings`)."""
    shardings = sh.optimizer_shardings(opt_state, params, mesh)
    return list(zip(jax.tree.leaves(opt_state), jax.tree.leaves(shardings)))


def _spec_text(sharding: NamedSharding) -> str:
    return str(sharding.spec).replace("PartitionSpec", "P")


# ----------------------------------------------------------------------------- activations
def _divided(value: int, parts: int) -> int:
    """value / parts when it divides (the mesh shards it), else value (replicated)."""
    return value // parts if parts > 1 and value % parts == 0 else value


def _rows_per_device(rows: int, mesh) -> int:
    sharding = sh.batch_sharding(mesh, 2, 0, batch_size=rows)
    return sharding.shard_shape((rows, 1))[0]


def _score_extent(config: Qwen3VLConfig, rows: int, heads: int, queries: int, keys: int) -> tuple[int, int, bool]:
    """(queries, keys, dense) of the attention scores live at once: the whole [queries, keys]
    array for dense attention (and for `auto` where it picks dense: a small score array), else
    one [block, block] tile (blockwise; the fused cuDNN/splash kernels are counted alike, an
    estimate: their tiles are not measured here)."""
    implementation = config.attention
    small = rows * heads * queries * keys * 4 <= DENSE_MAX_SCORE_BYTES
    if implementation == "dense" or (implementation == "auto" and small):
        return queries, keys, True
    block = config.attention_block
    return min(block, queries), min(block, keys), False


def _text_layer_bytes(config: Qwen3VLConfig, rows: int, queries: int, keys: int, tensor: int,
                      attention_bytes: int | None = None) -> int:
    """Working set of one decoder layer for `rows` x `queries` tokens attending to `keys`:
    `attention_bytes` per attention score (default: f32 logits + softmax probs in the compute
    dtype) + the bool mask (tiled over the query-head groups), q/k/v before and after norm +
    rotary, the attention output, the MLP's gate/up/product, the norms and residual adds."""
    t = config.text
    c = jnp.dtype(config.dtype).itemsize
    heads = _divided(t.num_attention_heads, tensor)
    kv = _divided(t.num_key_value_heads, tensor)
    mlp = _divided(t.intermediate_size, tensor)
    groups = max(t.num_attention_heads // t.num_key_value_heads, 1)
    per_score = 4 + c if attention_bytes is None else attention_bytes
    score_queries, score_keys, dense = _score_extent(config, rows, heads, queries, keys)
    attention = rows * heads * score_queries * score_keys * per_score
    if dense:  # the [rows, queries, keys] mask, tiled over the query-head groups
        attention += rows * queries * keys * (1 + groups)
    linear = rows * queries * (6 * t.hidden_size + 3 * (heads + 2 * kv) * t.head_dim + 3 * mlp) * c
    return attention + linear


def _vision_block_bytes(config: Qwen3VLConfig, patches: int, image_patches: int, tensor: int) -> int:
    """One ViT block over `patches` patches in images of `image_patches` each: attention
    logits/probs per image, qkv, two layer norms, the MLP, residual adds."""
    v = config.vision
    c = jnp.dtype(config.dtype).itemsize
    heads = _divided(v.num_heads, tensor)
    mlp = _divided(v.intermediate_size, tensor)
    attention = patches * heads * image_patches * (4 + c)
    linear = patches * (8 * v.hidden_size + 2 * mlp) * c
    return attention + linear


def _vision_outputs_bytes(config: Qwen3VLConfig, patches: int) -> int:
    """Merged tokens + DeepStack features handed to the decoder."""
    c = jnp.dtype(config.dtype).itemsize
    merged = patches // config.vision.spatial_merge_size**2
    return (1 + len(config.vision.deepstack_visual_indexes)) * merged * config.text.hidden_size * c


def activation_estimate(config: Qwen3VLConfig, work: Workload, mesh_sizes: Mapping[str, int],
                        logprob_chunk: int = 512) -> int:
    """Per-device activation bytes of one micro-batch's gradient pass, from shapes.

    rows: the micro-batch's rows per device (batch over data x fsdp when it divides); heads,
    KV heads, MLP and vocab per device divided by `tensor` when it divides.
      text, remat off:  L x saved + backward      (every layer's residuals + one layer's backward)
      text, remat on:   L x rows x T x d x c + working   (layer inputs + one layer recomputed
                        and differentiated)
      saved:            one layer (_text_layer_bytes) at 12 + c bytes per attention score (f32
                        scores before and after the mask, f32 softmax, probs in the compute dtype)
      backward:         one layer at 8 bytes per score (f32 d-probs and d-scores)
      working:          one layer at 8 + 2c bytes per score (f32 scores and softmax, d-probs and
                        d-scores in the compute dtype)
    The per-score byte counts are calibrated against XLA's buffer assignment (CPU) of the real
    gradient function for tiny, small125m (remat on and off) and 2b (README: plan section).
      head:             3 x rows x chunk x vocab x 4 (one chunk's f32 logits, softmax and
                        gradient: the chunked log-prob scan recomputes each chunk's logits in
                        its backward pass and keeps only its hidden inputs)
      vision:           the same rule over depth blocks, over the patches of a device's rows
                        (every row's when the batch devices do not divide the rows: the
                        vision pass is then replicated), + its outputs
    """
    mesh = abstract_mesh(mesh_sizes)
    tensor = mesh_sizes["tensor"]
    t, v = config.text, config.vision
    c = jnp.dtype(config.dtype).itemsize
    rows = _rows_per_device(work.micro_batch_rows, mesh)
    length = work.train_length
    layer = lambda per_score: _text_layer_bytes(config, rows, length, length, tensor, per_score)
    if config.remat:
        text = t.num_hidden_layers * rows * length * t.hidden_size * c + layer(8 + 2 * c)
    else:
        text = t.num_hidden_layers * layer(12 + c) + layer(8)
    chunk = min(logprob_chunk, length)
    head = 3 * chunk * rows * _divided(t.vocab_size, tensor) * 4
    patches = work.micro_batch_rows // vision_shard_count(sh.batch_devices(mesh), work.micro_batch_rows) \
        * work.patches_per_row
    image = (work.frame_size[0] // PATCH) * (work.frame_size[1] // PATCH)
    block = _vision_block_bytes(config, patches, image, tensor)
    saved = patches * v.hidden_size * c if config.remat else block
    vision = v.depth * saved + 2 * block + _vision_outputs_bytes(config, patches)
    return text + head + vision


def prefill_estimate(config: Qwen3VLConfig, rl, work: Workload, mesh_sizes: Mapping[str, int]) -> tuple[int, str]:
    """(bytes, which call) of the largest sampler prefill working set, for ONE row group of
    each call (sampler_calls; at most the token budget in all): one decoder layer
    over the group's chunk attending to its prefix and cache (f32 logits), that layer's K/V,
    the chunk's hidden states, and the vision tower's one-block working set for the frames of
    a device's shard of rows (the group's, replicated, where the sampler does not split them:
    vision_pass.vision_split) + the outputs for the group's frames (joined on every device).
    Forward only, one layer live at a time."""
    mesh = abstract_mesh(mesh_sizes)
    tensor = mesh_sizes["tensor"]
    t = config.text
    c = jnp.dtype(config.dtype).itemsize
    budget = backend_policy("gpu", prefill_tokens=rl.sampler.prefill_tokens).prefill_tokens
    merge_unit = config.vision.spatial_merge_size**2
    frame = (work.frame_size[0] // PATCH) * (work.frame_size[1] // PATCH)
    crop = (work.crop_frame_size[0] // PATCH) * (work.crop_frame_size[1] // PATCH)
    calls, _ = sampler_calls(sampler_layout(rl, work), work, rl)
    best, label = 0, ""
    for call in calls:
        shards = call.rows // _rows_per_device(call.rows, mesh)
        prompts = call.prompts or call.rows
        # every device computes a layer for all of the group's tokens (see sampler.prefill_group)
        shards = shards if prompts % shards == 0 else 1
        group = prefill_group(call.rows, call.rows // prompts, call.width, shards, budget)
        keys = call.capacity + call.prefix_slots
        kv = _divided(t.num_key_value_heads, tensor)
        layer = _text_layer_bytes(config, group, call.width, keys, tensor)
        layer += 2 * group * kv * keys * t.head_dim * c + 2 * group * call.width * t.hidden_size * c
        patches = group * call.visual_tokens_per_row * merge_unit
        image = frame if call.name.startswith("first") else crop
        vision_out = _vision_outputs_bytes(config, patches) if patches else 0
        split = vision_split(rl.sampler, mesh, shards)
        vision = _vision_block_bytes(config, patches // split, image, tensor) + vision_out if patches else 0
        total = max(layer + vision_out, vision)
        if total > best:
            best, label = total, call.name
    return best, label


POLICY_EXTRAS = (("advantages", jnp.float32), ("behaviour_logp", jnp.float32), ("prox_logp", jnp.float32))


def train_batch_spec(config: Qwen3VLConfig, work: Workload, mesh, extras=POLICY_EXTRAS) -> dict:
    """The abstract micro-batch TrainStep.grads receives for a loss reading `extras` (name,
    dtype: the policy loss's by default; SFT's reads none): token arrays and
    per-token extras split over the batch axis as TrainStep._place splits them; the vision
    inputs as train/batch.py `shard_vision` builds them: in one shard per batch device when
    they divide the rows (each device's rows' frames, padded per size to a power of two), else
    one replicated pass; the vision layout with the shapes vision_layout gives for frames of
    one size."""
    rows, length = work.micro_batch_rows, work.train_length
    shards = vision_shard_count(sh.batch_devices(mesh), rows)
    per = rows // shards

    def tokens(shape, dtype, axis=0):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sh.batch_sharding(mesh, len(shape), axis,
                                                                              batch_size=rows))

    def host(shape, dtype):  # one shard's array: stacked over the shards when there are several
        if shards == 1:
            return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec()))
        return jax.ShapeDtypeStruct((shards, *shape), dtype,
                                    sharding=sh.batch_sharding(mesh, len(shape) + 1, 0, batch_size=shards))

    image = (work.frame_size[0] // PATCH, work.frame_size[1] // PATCH)
    crop = (work.crop_frame_size[0] // PATCH, work.crop_frame_size[1] // PATCH)
    overview_images = per * work.overview_frames
    crop_patches = per * work.patches_per_row - overview_images * math.prod(image)
    frames = {image: overview_images}
    if crop_patches > 0:
        frames[crop] = frames.get(crop, 0) + crop_patches // math.prod(crop)
    counts: dict[int, int] = {}  # segment length (patches of a frame) -> frames
    for size, n in frame_buckets(frames).items():
        counts[math.prod(size)] = counts.get(math.prod(size), 0) + n
    patches = sum(length_ * n for length_, n in counts.items())
    groups = tuple(host((counts[size], size), jnp.int32) for size in sorted(counts))
    meta = (host((patches, 4), jnp.int32), host((patches, 4), jnp.float32), host((patches, 2), jnp.int32),
            groups, host((patches,), jnp.int32))
    return dict(input_ids=tokens((rows, length), jnp.int32),
                attention_mask=tokens((rows, length), jnp.int32),
                position_ids=tokens((3, rows, length), jnp.int32, axis=1),
                loss_mask=tokens((rows, length), jnp.int32),
                **{name: tokens((rows, length), dtype) for name, dtype in extras},
                visual_index=tokens((rows, length), jnp.int32),
                pixel_values=host((patches, config.vision.patch_dim), jnp.float32),
                vision_meta=meta, **({"segment_ids": tokens((rows, length), jnp.int32)} if work.packed else {}),
                **({"parent_ids": tokens((rows, length), jnp.int32)} if work.shared_prompts else {}))
