"""The sampler's vision passes: where a row group's pass runs on a mesh (one per shard of rows,
`vision_split` / `vision_sharding`, what the planner compiles too), and a packed prompt prefill's
pass over the fewest of a quarter, half or all of its fixed frames (`packed_vision`,
SamplerConfig.vision_buckets), its features padded to the fixed count."""
from __future__ import annotations

import dataclasses

import numpy as np

from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl.vision import frame_buckets, frame_counts, pad_frames_to, vision_layout
from paravt_jax.sampling import programs
from paravt_jax.train.batch import feature_rows, shard_vision


def vision_split(config, mesh, shards: int) -> int:
    """The vision passes of a row group whose rows lie in `shards` device blocks of cache rows
    (Sampler.row_shards): one per block under config.vision_shards on a mesh, else 1 (one pass
    over every frame, replicated). The planner compiles the pass this says (planner/memory.py)."""
    return shards if config.vision_shards and mesh is not None else 1


def vision_sharding(mesh, ndim: int, split: int):
    """Where a per-shard vision array ([split, ...], `ndim` axes) lies: shard s on the devices
    of the s-th block of cache rows."""
    return sh.batch_sharding(mesh, ndim, 0, batch_size=split)


@dataclasses.dataclass(frozen=True)
class VisionInputs:
    """A row group's vision pass: visual_index [g, W] (a vision pad's row of its shard's
    features; -1 elsewhere), pixel_values [N, patch_dim] and the tower's metadata, or per shard
    of rows [S, N, patch_dim] (each array with a leading S axis) placed on the shard's devices,
    `mesh` then set (the pass keeps its features there: programs.vision)."""
    visual_index: np.ndarray
    pixel_values: object
    meta: tuple
    mesh: object = None


# The (graphdef, frame sizes, fixed frames) of the packed prefills' vision passes whose floors are
# compiled (Sampler.packed_chunk), as PACKED_SHAPES for the row counts.
VISION_SHAPES: set = set()


def vision_floors(frames: int) -> tuple[int, ...]:
    """The frame counts a packed prefill's vision pass of at most `frames` frames a size is padded
    to (SamplerConfig.vision_buckets): a quarter, half or all of them, as packed_rows."""
    return tuple(sorted({-(-frames // 4), -(-frames // 2), frames}))


def vision_floor(counts: dict[tuple[int, int], int], frames: int) -> int:
    """The fewest of `vision_floors(frames)` that hold every size's frames (`counts`) rounded up
    to a power of two; beyond `frames`, that power of two (the call's own bucket)."""
    need = max(frame_buckets(counts).values(), default=1)
    return min((floor for floor in vision_floors(frames) if floor >= need), default=need)


def packed_vision(graphdef, params, prompts, placements, packed: int, width: int, vision_config, frames: int,
                  buckets: bool) -> tuple[np.ndarray | None, object, object]:
    """(visual_index [packed, width], features, DeepStack) of `prompts` placed at `placements` ((row,
    offset, prompt) each) in `packed` rows of `width`, their frames padded to at least `frames` a
    size (None, None, None without frames). `buckets` and a fixed count (`frames` > 0): the pass
    runs over `vision_floor` frames a size and its features are padded with zero rows to the fixed
    count's, every floor compiled on the shape's first call; else over the padded frames."""
    counts = frame_counts(np.concatenate([np.asarray(g, np.int64).reshape(-1, 3) for p in prompts
                                          for g in (p.image_grid_thw, p.video_grid_thw) if g is not None]
                                         or [np.zeros((0, 3), np.int64)]))
    buckets = buckets and frames > 0  # without a fixed count: each call's own buckets
    floor = vision_floor(counts, frames) if buckets else frames
    visual_index, pixels, meta = shard_vision(placements, packed, width, vision_config, floor, 1)
    if pixels is None:
        return visual_index, None, None
    # the features padded to the call's fixed frame count: the prefill's shape is one
    rows_out = feature_rows(frame_buckets(counts, frames), vision_config)
    shape = (graphdef, tuple(sorted(counts)), frames)
    if buckets and shape not in VISION_SHAPES:  # compile every floor on first use
        VISION_SHAPES.add(shape)
        fixed = feature_rows({size: frames for size in counts}, vision_config)  # an in-bounds call's
        for other in vision_floors(frames):
            if other != floor or rows_out != fixed:
                blank, grid = pad_frames_to(None, None, {size: other for size in counts}, vision_config.patch_dim)
                programs.vision(graphdef, params, blank, vision_layout(grid, vision_config).device_arrays(), None,
                                fixed)
    embeds, deepstack = programs.vision(graphdef, params, pixels, meta, None, rows_out)
    return visual_index, embeds, deepstack
