"""Qwen3-VL for conditional generation: vision tower + text decoder, and the host-side
preparation that turns HF-style numpy inputs into the arrays the jitted forward consumes."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
from flax import nnx

from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig
from paravt_jax.models.qwen3_vl.layers import as_numpy_int
from paravt_jax.models.qwen3_vl.rope import IMAGE, VIDEO, get_rope_index
from paravt_jax.models.qwen3_vl.text import TextDecoder
from paravt_jax.models.qwen3_vl.vision import VisionLayout, VisionTower, check_grid, vision_layout


@dataclasses.dataclass(frozen=True)
class PreparedInputs:
    """Host (numpy) arrays for one forward. B = batch, L = length, N = vision patches."""
    input_ids: np.ndarray  # [B, L] int32
    attention_mask: np.ndarray  # [B, L] int32
    position_ids: np.ndarray  # [3, B, L] int32
    rope_deltas: np.ndarray  # [B] int64
    visual_index: np.ndarray | None  # [B, L] int32, -1 for text
    pixel_values: np.ndarray | None  # [N, patch_dim] images then videos
    layout: VisionLayout | None


@dataclasses.dataclass(frozen=True)
class ModelOutput:
    logits: jax.Array  # [B, L, vocab] float32
    rope_deltas: np.ndarray  # [B]
    position_ids: np.ndarray  # [3, B, L]


def _visual_index(types: np.ndarray, mask: np.ndarray, n_image: int) -> np.ndarray:
    """Row-major (batch, position) order per modality, as HF's masked_scatter fills them."""
    index = np.full(types.shape, -1, np.int64)
    valid = mask.astype(bool)
    image = (types == IMAGE) & valid
    video = (types == VIDEO) & valid
    index[image] = np.arange(int(image.sum()))
    index[video] = n_image + np.arange(int(video.sum()))
    return index.astype(np.int32)


def prepare_inputs(config: Qwen3VLConfig, input_ids, attention_mask=None, mm_token_type_ids=None,
                   pixel_values=None, image_grid_thw=None, pixel_values_videos=None,
                   video_grid_thw=None, position_ids=None) -> PreparedInputs:
    ids = as_numpy_int(input_ids, "input_ids")
    if ids is None or ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {None if ids is None else ids.shape}")
    vocab = config.text.vocab_size
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"input_ids hold {int(ids.min())}..{int(ids.max())}, outside the vocabulary "
                         f"[0, {vocab})")
    mask = np.ones_like(ids) if attention_mask is None else as_numpy_int(attention_mask, "attention_mask")
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask shape {mask.shape} != input_ids shape {ids.shape}")
    if mm_token_type_ids is None:
        types = (ids == config.image_token_id) * IMAGE + (ids == config.video_token_id) * VIDEO
    else:
        types = as_numpy_int(mm_token_type_ids, "mm_token_type_ids")
        if types.shape != ids.shape:
            raise ValueError(f"mm_token_type_ids shape {types.shape} != input_ids shape {ids.shape}")
    vis = config.vision
    merge = vis.merge_unit
    valid = mask.astype(bool)
    pixels, grids = [], []
    for kind, name, pv, grid_in in ((IMAGE, "image", pixel_values, image_grid_thw),
                                    (VIDEO, "video", pixel_values_videos, video_grid_thw)):
        n_tokens = int(((types == kind) & valid).sum())
        if grid_in is None and pv is None:
            if n_tokens:
                raise ValueError(f"input_ids hold {n_tokens} {name} pad tokens but no "
                                 f"pixel_values{'_videos' if kind == VIDEO else ''} / {name}_grid_thw were given")
            continue
        if grid_in is None or pv is None:
            raise ValueError(f"{name}: pixel values and {name}_grid_thw must be given together")
        grid = check_grid(grid_in, vis, f"{name}_grid_thw")
        pv = np.asarray(pv)
        n_patches = int(np.prod(grid, axis=1).sum())
        if pv.ndim != 2 or pv.shape[0] != n_patches or pv.shape[1] != vis.patch_dim:
            raise ValueError(f"{name} pixel values have shape {pv.shape}; {name}_grid_thw needs "
                             f"[{n_patches}, {vis.patch_dim}]")
        if n_tokens != n_patches // merge:
            raise ValueError(f"{name} pad tokens in input_ids: {n_tokens}, but {name}_grid_thw "
                             f"gives {n_patches // merge} tokens ({n_patches} patches / {merge})")
        pixels.append(pv)
        grids.append(grid)
    if position_ids is None:
        image_grid = image_grid_thw if image_grid_thw is not None and pixel_values is not None else None
        video_grid = video_grid_thw if video_grid_thw is not None and pixel_values_videos is not None else None
        positions, deltas = get_rope_index(types, mask, image_grid, video_grid, vis.spatial_merge_size)
    else:
        positions = as_numpy_int(position_ids, "position_ids")
        if positions.shape != (3,) + ids.shape:
            raise ValueError(f"position_ids shape {positions.shape}; expected {(3,) + ids.shape}")
        deltas = positions.max(axis=(0, 2)) + 1 - mask.sum(-1)
    layout = visual_index = pixel_all = None
    if pixels:
        pixel_all = np.concatenate(pixels, 0)
        layout = vision_layout(np.concatenate(grids, 0), vis)
        n_image = int(((types == IMAGE) & valid).sum()) if pixel_values is not None else 0
        visual_index = _visual_index(types, mask, n_image)
    return PreparedInputs(ids.astype(np.int32), mask.astype(np.int32), positions.astype(np.int32),
                          deltas, visual_index, pixel_all, layout)


class Qwen3VL(nnx.Module):
    """Qwen3VLForConditionalGeneration. `model(input_ids=..., ...)` takes numpy like HF."""

    def __init__(self, config: Qwen3VLConfig, *, rngs: nnx.Rngs):
        config.validate()
        self.config = config
        self.visual = VisionTower(config, rngs=rngs)
        self.language = TextDecoder(config, rngs=rngs)

    def encode_vision(self, pixel_values, pos_index, pos_weight, rotary_pos, groups, inverse):
        return self.visual(pixel_values, pos_index, pos_weight, rotary_pos, groups, inverse)

    def forward(self, input_ids, attention_mask, position_ids, visual_index=None, pixel_values=None,
                vision_meta: tuple | None = None) -> jax.Array:
        """Device forward on prepared arrays; returns logits [B, L, vocab] float32."""
        embeds = deepstack = None
        if pixel_values is not None:
            embeds, deepstack = self.encode_vision(pixel_values, *vision_meta)
        return self.language(input_ids, attention_mask, position_ids, visual_index, embeds, deepstack)

    def __call__(self, input_ids, attention_mask=None, mm_token_type_ids=None, pixel_values=None,
                 image_grid_thw=None, pixel_values_videos=None, video_grid_thw=None,
                 position_ids=None) -> ModelOutput:
        prepared = prepare_inputs(self.config, input_ids, attention_mask, mm_token_type_ids,
                                  pixel_values, image_grid_thw, pixel_values_videos,
                                  video_grid_thw, position_ids)
        logits = forward_prepared(self, prepared)
        return ModelOutput(logits=logits, rope_deltas=prepared.rope_deltas,
                           position_ids=prepared.position_ids)


def device_args(prepared: PreparedInputs) -> tuple[Any, ...]:
    meta = None
    if prepared.layout is not None:
        meta = prepared.layout.device_arrays()
    return (prepared.input_ids, prepared.attention_mask, prepared.position_ids,
            prepared.visual_index, prepared.pixel_values, meta)


@functools.partial(jax.jit, static_argnames="graphdef")
def _jitted_forward(graphdef, state, *args):
    model = nnx.merge(graphdef, state)
    return model.forward(*args)


def forward_prepared(model: Qwen3VL, prepared: PreparedInputs) -> jax.Array:
    graphdef, state = nnx.split(model)
    return _jitted_forward(graphdef, state, *device_args(prepared))
