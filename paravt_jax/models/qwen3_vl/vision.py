"""Qwen3-VL vision tower in Flax NNX.

Host side (numpy): `vision_layout(grid_thw, config)` turns the grids into per-patch
metadata (position-embedding interpolation indices and weights, 2-D rotary coordinates,
attention groups). Device side: `VisionTower.__call__` consumes the patches and that metadata.

Attention is block-diagonal: each image / temporal group attends only within itself. Instead
of an N x N segment-id mask (quadratic in ALL patches of the batch, 16 GB of logits for 16k
patches), segments of equal length are gathered into one [S, len] batch and attended together;
there is one batched attention per distinct segment length (usually one or two), so the cost
is the exact block-diagonal cost with no padding waste.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from paravt_jax.models.qwen3_vl import layers as L
from paravt_jax.models.qwen3_vl.attention import attend
from paravt_jax.models.qwen3_vl.attention_mask import AttentionMask
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig, VisionConfig


@dataclasses.dataclass(frozen=True)
class VisionLayout:
    """Per-patch metadata, all numpy, N = number of patches (after optional padding).

    pos_index [N, 4] int32 and pos_weight [N, 4] float32: bilinear corners into pos_embed.
    rotary_pos [N, 2] int32: (row, column) on the patch grid.
    groups: per distinct segment length, [S, len] int32 patch indices (one row per segment;
      padding patches form a segment of their own).
    inverse [N] int32: position of each patch in the concatenation of the flattened groups.
    num_valid: patches before padding.
    """
    pos_index: np.ndarray
    pos_weight: np.ndarray
    rotary_pos: np.ndarray
    groups: tuple[np.ndarray, ...]
    inverse: np.ndarray
    num_valid: int

    def device_arrays(self) -> tuple:
        return (self.pos_index, self.pos_weight, self.rotary_pos, self.groups, self.inverse)


def check_grid(grid_thw, config: VisionConfig, name: str) -> np.ndarray:
    grid = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    m = config.spatial_merge_size
    for i, (t, h, w) in enumerate(grid):
        if t < 1 or h < 1 or w < 1 or h % m or w % m:
            raise ValueError(f"{name}[{i}] = {[int(t), int(h), int(w)]}: each entry must be "
                             f">= 1 and h, w multiples of spatial_merge_size={m}")
    return grid


def _axis_interpolation(n: int, side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """align_corners=True bilinear source coordinates for n samples on a `side` table."""
    src = np.arange(n, dtype=np.float64) * (side - 1) / max(n - 1, 1)
    low = np.floor(src).astype(np.int64)
    high = np.minimum(low + 1, side - 1)
    return low, high, (src - low)


@functools.lru_cache(maxsize=256)
def _frame_layout(h: int, w: int, m: int, side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pos_index [h*w, 4], pos_weight [h*w, 4], rotary [h*w, 2]) of one h x w frame, in merge-block
    order (block_row, block_col, in_row, in_col): the same for every frame of that size, computed
    once per size in the process (a call of 256 frames had recomputed it per frame)."""
    br, bc, ir, ic = np.meshgrid(np.arange(h // m), np.arange(w // m), np.arange(m), np.arange(m), indexing="ij")
    rows = (br * m + ir).reshape(-1)
    cols = (bc * m + ic).reshape(-1)
    r_lo, r_hi, r_d = _axis_interpolation(h, side)
    c_lo, c_hi, c_d = _axis_interpolation(w, side)
    idx = np.stack([r_lo[rows] * side + c_lo[cols], r_lo[rows] * side + c_hi[cols],
                    r_hi[rows] * side + c_lo[cols], r_hi[rows] * side + c_hi[cols]], -1)
    dr, dc = r_d[rows], c_d[cols]
    wts = np.stack([(1 - dr) * (1 - dc), (1 - dr) * dc, dr * (1 - dc), dr * dc], -1)
    arrays = (idx, wts, np.stack([rows, cols], -1))
    for a in arrays:
        a.setflags(write=False)
    return arrays


def vision_layout(grid_thw, config: VisionConfig, pad_to: int | None = None) -> VisionLayout:
    grid = check_grid(grid_thw, config, "grid_thw")
    m = config.spatial_merge_size
    side = int(round(config.num_position_embeddings**0.5))
    index, weight, rotary, lengths = [], [], [], []
    for t, h, w in grid:
        idx, wts, rot = _frame_layout(int(h), int(w), m, side)
        index += [idx] * int(t)
        weight += [wts] * int(t)
        rotary += [rot] * int(t)
        lengths += [len(idx)] * int(t)  # each frame a segment of its own
    n = sum(lengths)
    if pad_to is not None and pad_to > n:
        extra = pad_to - n
        index.append(np.zeros((extra, 4), np.int64))
        weight.append(np.zeros((extra, 4)))
        rotary.append(np.zeros((extra, 2), np.int64))
        lengths.append(extra)
    groups, inverse = attention_groups(lengths)
    return VisionLayout(
        pos_index=np.concatenate(index).astype(np.int32),
        pos_weight=np.concatenate(weight).astype(np.float32),
        rotary_pos=np.concatenate(rotary).astype(np.int32),
        groups=groups, inverse=inverse, num_valid=n,
    )


def frame_counts(grid_thw) -> dict[tuple[int, int], int]:
    """Frames per frame size (h, w) of a grid [n, 3] (t frames per item)."""
    frames: dict[tuple[int, int], int] = {}
    for t, h, w in np.asarray(grid_thw, np.int64).reshape(-1, 3):
        frames[(int(h), int(w))] = frames.get((int(h), int(w)), 0) + int(t)
    return frames


def frame_buckets(frames: dict[tuple[int, int], int], min_frames: int = 0) -> dict[tuple[int, int], int]:
    """Each size's frame count rounded up to a power of two, and to at least `min_frames`."""
    return {size: max(1 << (n - 1).bit_length(), int(min_frames)) for size, n in frames.items()}


def pad_frames_to(pixel_values: np.ndarray | None, grid_thw, targets: dict[tuple[int, int], int],
                  patch_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Appends blank single-frame items until every frame size (h, w) of `targets` has that
    many frames (a size absent from the grid gets only blank frames); the blank items'
    embeddings come last and no token points at them. pixel_values [N, patch_dim] (or None
    with an empty grid), grid_thw [n, 3] -> the padded pair."""
    grid = np.asarray(grid_thw if grid_thw is not None else np.zeros((0, 3)), np.int64).reshape(-1, 3)
    pixels = pixel_values if pixel_values is not None else np.zeros((0, patch_dim), np.float32)
    have = frame_counts(grid)
    extra = [(h, w, k - have.get((h, w), 0)) for (h, w), k in targets.items()]
    if any(k < 0 for _, _, k in extra):
        raise ValueError(f"frames {have} exceed the padding targets {targets}")
    extra = [(h, w, k) for h, w, k in extra if k]
    if not extra:
        return pixels, grid
    blank = [np.array([[1, h, w]] * k, np.int64) for h, w, k in extra]
    rows = sum(h * w * k for h, w, k in extra)
    padded = np.zeros((len(pixels) + rows, pixels.shape[1]), pixels.dtype)  # the blank rows never written
    padded[:len(pixels)] = pixels
    return padded, np.concatenate([grid, *blank])


def pad_frames_to_buckets(pixel_values: np.ndarray, grid_thw, min_frames: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Appends blank single-frame items so that, for every frame size (h, w), the number of
    frames is a power of two, and at least `min_frames`. The vision tower's shapes (and the
    number of visual embeddings) then take few distinct values across calls with varied frame
    counts (one, when every call's frames fit under `min_frames`), so jitted callers stop
    recompiling; the blank items' embeddings come last and no token points at them.
    pixel_values [N, C*T*p*p], grid_thw [n, 3] -> the padded pair."""
    targets = frame_buckets(frame_counts(grid_thw), min_frames)
    return pad_frames_to(pixel_values, grid_thw, targets, pixel_values.shape[1])


def attention_groups(lengths: list[int]) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Contiguous segments of the given lengths -> (one [S, len] index array per distinct
    length, inverse permutation [N])."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    by_length: dict[int, list[int]] = {}
    for start, length in zip(starts, lengths):
        by_length.setdefault(int(length), []).append(int(start))
    groups, order = [], []
    for length in sorted(by_length):
        rows = np.asarray(by_length[length])[:, None] + np.arange(length)[None]
        groups.append(rows.astype(np.int32))
        order.append(rows.reshape(-1))
    order_flat = np.concatenate(order) if order else np.zeros((0,), np.int64)
    inverse = np.empty_like(order_flat)
    inverse[order_flat] = np.arange(len(order_flat))
    return tuple(groups), inverse.astype(np.int32)


def vision_rotary(rotary_pos: jax.Array, config: VisionConfig) -> tuple[jax.Array, jax.Array]:
    """Axial 2-D rotary tables [..., N, head_dim] in float32 ([..., N, 2] coordinates): [rows*inv,
    cols*inv] twice."""
    half = config.head_dim // 2
    inv = 1.0 / (config.rope_theta ** (jnp.arange(0, half, 2, dtype=jnp.float32) / half))
    freqs = rotary_pos.astype(jnp.float32)[..., None] * inv  # [..., N, 2, hd/4]
    freqs = freqs.reshape(*freqs.shape[:-2], -1)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


class VisionTower(nnx.Module):
    """Patch embedding, learned+interpolated positions, ViT blocks, merger, DeepStack mergers."""

    def __init__(self, config: Qwen3VLConfig, *, rngs: nnx.Rngs):
        v = config.vision
        self.config = v
        self.remat, self.scan = config.remat, config.scan_layers
        self.attention_impl, self.attention_block = config.attention, config.attention_block
        self.dtype = L.to_dtype(config.dtype)
        pd = L.to_dtype(config.param_dtype)
        d, f, n, depth = v.hidden_size, v.intermediate_size, len(v.deepstack_visual_indexes), v.depth
        merged = d * v.merge_unit
        p = lambda shape, axes, init="normal": L.make_param(rngs, shape, axes, init, pd)
        self.patch_kernel = p((v.patch_dim, d), ("patch", "vision_embed"))
        self.patch_bias = p((d,), ("vision_embed",))
        self.pos_embed = p((v.num_position_embeddings, d), (None, "vision_embed"))
        lay = "layers"
        self.blocks = nnx.Dict(
            norm1_scale=p((depth, d), (lay, "vision_embed"), "ones"),
            norm1_bias=p((depth, d), (lay, "vision_embed"), "zeros"),
            qkv_kernel=p((depth, d, 3 * d), (lay, "vision_embed", "vision_heads")),
            qkv_bias=p((depth, 3 * d), (lay, "vision_heads"), "zeros"),
            proj_kernel=p((depth, d, d), (lay, "vision_heads", "vision_embed")),
            proj_bias=p((depth, d), (lay, "vision_embed"), "zeros"),
            norm2_scale=p((depth, d), (lay, "vision_embed"), "ones"),
            norm2_bias=p((depth, d), (lay, "vision_embed"), "zeros"),
            fc1_kernel=p((depth, d, f), (lay, "vision_embed", "vision_mlp")),
            fc1_bias=p((depth, f), (lay, "vision_mlp"), "zeros"),
            fc2_kernel=p((depth, f, d), (lay, "vision_mlp", "vision_embed")),
            fc2_bias=p((depth, d), (lay, "vision_embed"), "zeros"),
        )
        self.merger = nnx.Dict(
            norm_scale=p((d,), ("vision_embed",), "ones"),
            norm_bias=p((d,), ("vision_embed",), "zeros"),
            fc1_kernel=p((merged, merged), ("vision_merged", "vision_mlp")),
            fc1_bias=p((merged,), ("vision_mlp",), "zeros"),
            fc2_kernel=p((merged, v.out_hidden_size), ("vision_mlp", "embed")),
            fc2_bias=p((v.out_hidden_size,), ("embed",), "zeros"),
        )
        self.deepstack = nnx.Dict(
            norm_scale=p((n, merged), (lay, "vision_merged"), "ones"),
            norm_bias=p((n, merged), (lay, "vision_merged"), "zeros"),
            fc1_kernel=p((n, merged, merged), (lay, "vision_merged", "vision_mlp")),
            fc1_bias=p((n, merged), (lay, "vision_mlp"), "zeros"),
            fc2_kernel=p((n, merged, v.out_hidden_size), (lay, "vision_mlp", "embed")),
            fc2_bias=p((n, v.out_hidden_size), (lay, "embed"), "zeros"),
        )

    def _block(self, x, params, cos, sin, groups, inverse):
        """One ViT block over x [S, n, d]: S shards of n patches, each shard's attention groups
        index its own patches."""
        v = self.config
        shards, n, d = x.shape
        h = L.layer_norm(x, params["norm1_scale"], params["norm1_bias"])
        qkv = L.dense(h, params["qkv_kernel"], params["qkv_bias"]).reshape(shards, n, 3, v.num_heads, v.head_dim)
        q, k, val = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        q = L.apply_rotary(q.astype(jnp.float32), cos, sin).astype(x.dtype)
        k = L.apply_rotary(k.astype(jnp.float32), cos, sin).astype(x.dtype)
        take = jax.vmap(lambda a, index: a[index])  # per shard: its own patches, no cross-shard gather

        def one_group(g):  # g [S, segments, length]: one attention per segment, shards side by side
            segments, length = g.shape[1:]
            qg, kg, vg = (take(a, g).reshape(shards * segments, length, v.num_heads, v.head_dim)
                          for a in (q, k, val))
            out = attend(qg, kg, vg, AttentionMask.full(shards * segments, length, length), self.attention_impl,
                         block=self.attention_block)
            return out.reshape(shards, segments * length, v.num_heads, v.head_dim)

        attn = take(jnp.concatenate([one_group(g) for g in groups], axis=1), inverse).reshape(shards, n, d)
        x = x + L.dense(attn, params["proj_kernel"], params["proj_bias"])
        h = L.layer_norm(x, params["norm2_scale"], params["norm2_bias"])
        h = L.gelu_tanh(L.dense(h, params["fc1_kernel"], params["fc1_bias"]))
        return x + L.dense(h, params["fc2_kernel"], params["fc2_bias"])

    def _deepstack_merge(self, x, params):
        y = x.reshape(x.shape[0], -1, x.shape[-1] * self.config.merge_unit)
        y = L.layer_norm(y, params["norm_scale"], params["norm_bias"])
        y = L.gelu_exact(L.dense(y, params["fc1_kernel"], params["fc1_bias"]))
        return L.dense(y, params["fc2_kernel"], params["fc2_bias"])

    def __call__(self, pixel_values: jax.Array, pos_index: jax.Array, pos_weight: jax.Array,
                 rotary_pos: jax.Array, groups: tuple[jax.Array, ...],
                 inverse: jax.Array) -> tuple[jax.Array, jax.Array]:
        """pixel_values [N, patch_dim] -> (merged tokens [N/4, out], DeepStack [n_ds, N/4, out]).

        Sharded (a training micro-batch split over the batch devices, train/batch.py): every
        input with a leading shard axis (pixel_values [S, N, patch_dim], each shard's metadata
        from its own `vision_layout`) -> ([S, N/4, out], [n_ds, S, N/4, out]); each shard's
        frames are encoded apart, so a mesh that splits S runs each shard on its own devices."""
        flat = pixel_values.ndim == 2
        if flat:
            pixel_values, pos_index, pos_weight, rotary_pos, groups, inverse = jax.tree.map(
                lambda a: a[None], (pixel_values, pos_index, pos_weight, rotary_pos, groups, inverse))
        v = self.config
        dtype = self.dtype
        x = L.dense(pixel_values.astype(dtype), self.patch_kernel[...], self.patch_bias[...])
        corners = self.pos_embed[...].astype(jnp.float32)[pos_index]  # [S, N, 4, D]
        x = x + jnp.sum(corners * pos_weight[..., None], axis=-2).astype(dtype)
        cos, sin = vision_rotary(rotary_pos, v)
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
        ds_params = {k: val[...] for k, val in self.deepstack.items()}
        indexes = jnp.asarray(v.deepstack_visual_indexes, jnp.int32)
        n_ds = len(v.deepstack_visual_indexes)
        shards, n = x.shape[:2]
        features = jnp.zeros((n_ds, shards, n // v.merge_unit, v.out_hidden_size), dtype)

        def layer(carry, params, i):
            x, features = carry
            x = self._block(x, params, cos, sin, groups, inverse)
            # Merger j belongs to deepstack_visual_indexes[j]; features are emitted in block
            # order (slot = rank of the block among the indexes), as HF appends them.
            if isinstance(i, int):  # unrolled: decide in Python
                if i in v.deepstack_visual_indexes:
                    j = v.deepstack_visual_indexes.index(i)
                    slot = sorted(v.deepstack_visual_indexes).index(i)
                    merged = self._deepstack_merge(x, jax.tree.map(lambda p: p[j], ds_params))
                    features = features.at[slot].set(merged.astype(dtype))
                return x, features
            hit = indexes == i
            j = jnp.argmax(hit)
            slot = jnp.sum(indexes < i)

            def store(f):
                merged = self._deepstack_merge(x, jax.tree.map(lambda p: p[j], ds_params))
                return f.at[slot].set(merged.astype(dtype))

            return x, jax.lax.cond(jnp.any(hit), store, lambda f: f, features)

        block_params = {k: val[...] for k, val in self.blocks.items()}
        x, features = L.run_layers(layer, (x, features), block_params, v.depth,
                                   scan=self.scan, remat=self.remat)
        m = self.merger
        y = L.layer_norm(x, m["norm_scale"][...], m["norm_bias"][...])
        y = y.reshape(shards, -1, v.hidden_size * v.merge_unit)
        y = L.gelu_exact(L.dense(y, m["fc1_kernel"][...], m["fc1_bias"][...]))
        y = L.dense(y, m["fc2_kernel"][...], m["fc2_bias"][...])
        return (y[0], features[:, 0]) if flat else (y, features)
