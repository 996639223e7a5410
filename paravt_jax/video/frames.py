"""Frames -> Qwen3-VL patches.

`pixel_values` rows are flattened (C, T, ph, pw) patches in merge-block order
(t, block_row, block_col, in_row, in_col); pixels are rescaled to [-1, 1] with mean = std =
0.5 (docs/model.md, "Pixels and patches").
"""
from __future__ import annotations

import math

import numpy as np

PATCH = 16
MERGE = 2
TEMPORAL = 2
FACTOR = PATCH * MERGE  # 32: every resized side is a multiple of this
MAX_ASPECT = 200
# The reference's RL frames go through two resizes: qwen-vl-utils' (factor 28, the configured
# [min, max] pixels), then the Qwen3-VL image processor's own (factor 32, its stock
# preprocessor_config.json budget below), which scales small frames up to >= 65,536 pixels.
UTILS_FACTOR = 28
PROCESSOR_MIN_PIXELS = 65536
PROCESSOR_MAX_PIXELS = 16777216
# How a frame is sized: "two_stage" (the reference's RL path, above) or "single" (one resize to
# [min, max] pixels at factor 32: what a caller that owns the processor budget asks for).
SIZINGS = ("two_stage", "single")


def smart_resize(height: int, width: int, factor: int = FACTOR, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """Target (h, w): multiples of `factor`, area within [min_pixels, max_pixels], aspect kept.

    Rounding is Python's round (half to even), as in the reference processors.
    """
    if height < 1 or width < 1:
        raise ValueError(f"smart_resize: image size {height}x{width} must be positive")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"smart_resize: aspect ratio of {height}x{width} exceeds {MAX_ASPECT}")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def frame_sizes(height: int, width: int, min_pixels: int, max_pixels: int,
                sizing: str = "single") -> list[tuple[int, int]]:
    """The (h, w) a frame of height x width is resized to, in turn (the last is what the model
    sees): one size under "single", qwen-vl-utils' then the processor's under "two_stage"."""
    if sizing == "single":
        return [smart_resize(height, width, FACTOR, min_pixels, max_pixels)]
    if sizing == "two_stage":
        first = smart_resize(height, width, UTILS_FACTOR, min_pixels, max_pixels)
        return [first, smart_resize(*first, FACTOR, PROCESSOR_MIN_PIXELS, PROCESSOR_MAX_PIXELS)]
    raise ValueError(f"frame sizing {sizing!r}: expected one of {SIZINGS}")


def video_frame_sizes(num_frames: int, height: int, width: int, min_pixels: int, max_pixels: int,
                      sizing: str = "single") -> list[tuple[int, int]]:
    """The (h, w) each of the `num_frames` frames of a video item is resized to, in turn: the
    frame's own resize to [min_pixels, max_pixels] (single: at factor 32; two_stage:
    qwen-vl-utils' at factor 28), then the Qwen3-VL video processor's (factor 32, the item's
    T*h*w within its stock budget: `video_smart_resize`). The reference's SFT videos take the
    two_stage path: 854x480 -> 280x140 -> 288x128 (18 tokens a frame, 36 a temporal group)."""
    if sizing not in SIZINGS:
        raise ValueError(f"frame sizing {sizing!r}: expected one of {SIZINGS}")
    first = smart_resize(height, width, FACTOR if sizing == "single" else UTILS_FACTOR, min_pixels, max_pixels)
    return [first, video_smart_resize(num_frames, *first)]


def video_smart_resize(num_frames: int, height: int, width: int, factor: int = FACTOR,
                       min_pixels: int = 4096, max_pixels: int = 25165824,
                       temporal: int = TEMPORAL) -> tuple[int, int]:
    """Target (h, w) of every frame of a video item: the pixel budget [min_pixels, max_pixels]
    bounds the whole video's T*h*w (T rounded to the temporal patch size), not one frame's.
    Frames smaller than `factor` are first scaled up to it. Defaults: the Qwen3-VL video
    processor's budget."""
    if num_frames < 1 or height < 1 or width < 1:
        raise ValueError(f"video_smart_resize: video of {num_frames} frames of {height}x{width} must be non-empty")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"video_smart_resize: aspect ratio of {height}x{width} exceeds {MAX_ASPECT}")
    frames = max(temporal, round(num_frames / temporal) * temporal)
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if frames * h * w > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif frames * h * w < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def normalize(frames: np.ndarray) -> np.ndarray:
    """uint8 [..., H, W, 3] -> float32 in [-1, 1]."""
    return (frames.astype(np.float32) / 255.0 - 0.5) / 0.5


def patchify(frames: np.ndarray, patch: int = PATCH, merge: int = MERGE,
             temporal: int = TEMPORAL) -> tuple[np.ndarray, np.ndarray]:
    """frames [T, H, W, 3] (uint8, or float already normalised), T a multiple of `temporal`
    (pad by repeating the last frame first). Returns pixel_values [T/2*H/16*W/16, 1536] float32
    and grid_thw [3] int64 = (T/2, H/16, W/16)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"patchify: frames must be [T, H, W, 3], got {frames.shape}")
    t, height, width, channels = frames.shape
    unit = patch * merge
    if height % unit or width % unit:
        raise ValueError(f"patchify: frame size {height}x{width} is not a multiple of {unit}")
    if t % temporal:
        raise ValueError(f"patchify: {t} frames is not a multiple of temporal_patch_size={temporal}")
    x = normalize(frames) if frames.dtype == np.uint8 else frames.astype(np.float32)
    gt, gh, gw = t // temporal, height // patch, width // patch
    x = x.transpose(0, 3, 1, 2)  # T, C, H, W
    x = x.reshape(gt, temporal, channels, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # gt, br, bc, ir, ic, C, T, ph, pw
    pixel_values = x.reshape(gt * gh * gw, channels * temporal * patch * patch)
    return np.ascontiguousarray(pixel_values), np.array([gt, gh, gw], np.int64)


def patchify_image(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One image [H, W, 3] -> (pixel_values, grid (1, H/16, W/16)); duplicated to fill T=2."""
    image = np.asarray(image)
    return patchify(np.stack([image] * TEMPORAL))


def patchify_video(frames: np.ndarray, temporal: int = TEMPORAL) -> tuple[np.ndarray, np.ndarray]:
    """A video item's frames [T, H, W, 3] -> (pixel_values, grid (ceil(T/2), H/16, W/16)); an
    odd T is padded by repeating the last frame, as the Qwen3-VL video processor does."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or not len(frames):
        raise ValueError(f"patchify_video: frames must be a non-empty [T, H, W, 3], got {frames.shape}")
    if pad := -len(frames) % temporal:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    return patchify(frames, temporal=temporal)


def group_times(timestamps, temporal: int = TEMPORAL) -> list[float]:
    """Seconds of each temporal group of a video item: the mean of its first and last frame's
    timestamp (the list padded with its last value to a multiple of `temporal`)."""
    times = [float(t) for t in timestamps]
    if not times:
        raise ValueError("group_times: a video item needs at least one timestamp")
    times += [times[-1]] * (-len(times) % temporal)
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]


def llm_tokens(grid_thw, merge: int = MERGE) -> int:
    t, h, w = (int(v) for v in grid_thw)
    return t * (h // merge) * (w // merge)
