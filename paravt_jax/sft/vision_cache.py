"""A frozen vision tower's features of each SFT example, computed once (`sft.cache_vision_features`).

With the tower frozen (`sft.optimizer.frozen` covering `visual`), what it makes of an example's
frames never changes during SFT, yet a step that feeds pixels encodes every micro-batch's frames
again at every step. Here each example is encoded on its first use and its features are kept on
the host; the steps feed them in place of the pixels (`train/batch.py` `shard_features`), so the
training programs run the decoder only.

Encoding runs in calls of a fixed shape: the examples a step needs and the cache lacks, in the
step's order, go into calls of `frames` frames of each frame size (the examples whose frames fit
together; an example with more frames of a size gets a call of its own, its count rounded up to a
power of two), blank frames filling each call up. So the encoding compiles once per set of frame
sizes in a call, and what an example's features are depends on the run's steps alone, as the
order of the data does.

The cache is keyed by the example and by the tower's weights: it holds the digest of the weights
it was made with, encodes with the weights each call is handed, and `check` refuses weights
whose digest differs (a tower that changed under it). Its memory is bounded by `max_bytes`: an
example whose features would pass the bound is encoded again at each use instead of kept.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from paravt_jax.models.qwen3_vl.fused_attention import kernel_mesh
from paravt_jax.models.qwen3_vl.vision import frame_buckets, frame_counts, pad_frames_to, vision_layout
from paravt_jax.text.inputs import ModelInputs
from paravt_jax.train.batch import VisionFeatures
from paravt_jax.train.step import parameter_path

MIB = 1 << 20


def host_array(x) -> np.ndarray:
    """A device array on the host (its first local copy when replicated over processes)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    return np.asarray(x.addressable_data(0))


def weights_digest(state) -> str:
    """sha256 over every leaf of a module's state: its path, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        if not getattr(leaf, "is_fully_addressable", True):
            from jax.experimental import multihost_utils
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        array = np.asarray(leaf)
        digest.update(f"{parameter_path(path)}|{array.dtype}|{array.shape}|".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def vision_grid(inputs: ModelInputs) -> np.ndarray:
    """The grid [n, 3] of an example's images, then its videos (the order its vision tokens are
    numbered in)."""
    return np.concatenate([inputs.image_grid_thw, inputs.video_grid_thw]).reshape(-1, 3)


def vision_items(inputs: ModelInputs) -> tuple[np.ndarray, np.ndarray]:
    """(pixels [N, patch_dim], grid [n, 3]) of an example, in `vision_grid`'s order."""
    return np.concatenate([inputs.pixel_values, inputs.pixel_values_videos]), vision_grid(inputs)


def plan_calls(grids: Sequence[np.ndarray], frames: int) -> list[list[int]]:
    """Examples (by their grids, in order) grouped into encoding calls: consecutive examples
    while every frame size's count stays within `frames`; an example over it alone."""
    calls: list[list[int]] = []
    held: dict[tuple[int, int], int] = {}
    for index, grid in enumerate(grids):
        counts = frame_counts(grid)
        fits = calls and all(n <= frames for n in held.values()) and all(
            held.get(size, 0) + n <= frames for size, n in counts.items())
        if not fits:
            calls.append([])
            held = {}
        calls[-1].append(index)
        for size, n in counts.items():
            held[size] = held.get(size, 0) + n
    return calls


def without_pixels(inputs: ModelInputs) -> ModelInputs:
    """The example with its pixels dropped (grids kept): for one whose features are kept."""
    empty = np.zeros((0, inputs.pixel_values.shape[1]), inputs.pixel_values.dtype)
    return ModelInputs(inputs.input_ids, inputs.mm_token_type_ids, inputs.loss_mask, inputs.position_ids, empty,
                       inputs.image_grid_thw, empty, inputs.video_grid_thw, inputs.next_position)


class VisionFeatureCache:
    """Examples' features under one frozen vision tower. `visual`: the tower (its weights give
    the cache's key); `frames`: the frames of each size an encoding call holds; `mesh`: the
    mesh the tower's weights live on (None: one device); `max_bytes`: the host memory the kept
    features may take (0: unbounded)."""

    def __init__(self, visual: nnx.Module, frames: int, mesh=None, max_bytes: int = 0):
        if frames < 1:
            raise ValueError(f"VisionFeatureCache: frames={frames} must be >= 1")
        self.graphdef, state = nnx.split(visual)
        self.weights = weights_digest(state)
        self.config = visual.config
        self.frames, self.mesh, self.max_bytes = frames, mesh, max_bytes
        self.kept: dict[Hashable, VisionFeatures] = {}
        self.bytes = 0
        graphdef = self.graphdef

        def encode(state, pixels, meta):
            with kernel_mesh(mesh):
                return nnx.merge(graphdef, state)(pixels, *meta)
        self._encode = jax.jit(encode)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.kept

    def check(self, visual: nnx.Module) -> None:
        """Refuses a tower whose weights are not those the cache was made with."""
        if weights_digest(nnx.state(visual)) != self.weights:
            raise ValueError("the vision tower's weights changed under its feature cache (sft.cache_vision_features "
                             "needs the tower frozen: sft.optimizer.frozen covering 'visual')")

    def features(self, examples: Sequence[tuple[Hashable, ModelInputs]], tower: Callable[[], nnx.Module]
                 ) -> tuple[dict[Hashable, VisionFeatures], int]:
        """{key: features} of every example that has frames, and the frames encoded: the kept
        ones as they are, the others encoded now with the weights of `tower()` (the same tower;
        called only when some example needs encoding) and kept while `max_bytes` allows."""
        found: dict[Hashable, VisionFeatures] = {}
        todo: dict[Hashable, ModelInputs] = {}
        for key, inputs in examples:
            if key in self.kept:
                found[key] = self.kept[key]
            elif key not in todo and len(vision_grid(inputs)):
                todo[key] = inputs
        if not todo:
            return found, 0
        keys = list(todo)
        state = nnx.state(tower())
        encoded = 0
        for call in plan_calls([vision_grid(todo[k]) for k in keys], self.frames):
            made, frames = self._encode_call([todo[keys[i]] for i in call], state)
            encoded += frames
            for i, f in zip(call, made):
                found[keys[i]] = f
                if not self.max_bytes or self.bytes + f.nbytes <= self.max_bytes:
                    self.kept[keys[i]] = f
                    self.bytes += f.nbytes
        return found, encoded

    def _encode_call(self, examples: Sequence[ModelInputs], state) -> tuple[list[VisionFeatures], int]:
        """One call's examples encoded together: each example's features, and the frames of the
        call (blank ones included)."""
        items = [vision_items(x) for x in examples]
        pixels = np.concatenate([p for p, _ in items])
        grid = np.concatenate([g for _, g in items])
        targets = frame_buckets(frame_counts(grid), self.frames)
        pixels, padded = pad_frames_to(pixels, grid, targets, self.config.patch_dim)
        layout = vision_layout(padded, self.config)
        args = (pixels, layout.device_arrays())
        if self.mesh is not None:  # replicated: every device of the tower's mesh sees the call
            args = jax.device_put(args, NamedSharding(self.mesh, PartitionSpec()))
        embeds, deepstack = self._encode(state, *args)
        embeds, deepstack = host_array(embeds), host_array(deepstack)
        out, start = [], 0
        for _, g in items:
            n = int(np.prod(g, axis=1).sum()) // self.config.merge_unit
            out.append(VisionFeatures(embeds[start:start + n].copy(), deepstack[:, start:start + n].copy()))
            start += n
        return out, sum(targets.values())
