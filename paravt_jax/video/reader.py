"""Video reading on decord with the reference (qwen-vl-utils) sampling semantics.

Thread safety: decord readers are not safe to share between threads, so nothing here is
shared: every `read_frames` call opens its own `VideoReader`, reads the metadata once and
decodes only the sampled frames in one batched call. Many threads can therefore read the
same file concurrently (the crop dispatcher does), each with a private decoder.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from paravt_jax.video.frames import frame_sizes, video_frame_sizes, video_smart_resize

FRAME_FACTOR = 2  # frame counts are rounded to the temporal patch size, as the reference does
DEFAULT_FPS = 2.0
DEFAULT_MIN_FRAMES = 4
DEFAULT_MAX_FRAMES = 768
DEFAULT_MIN_PIXELS = 28 * 28  # 784
DEFAULT_MAX_PIXELS = 224 * 224  # 50176


class VideoError(RuntimeError):
    """A video could not be opened or decoded; the message names the path and the reason."""


@dataclasses.dataclass(frozen=True)
class VideoMetadata:
    path: str
    fps: float
    num_frames: int
    height: int
    width: int

    @property
    def duration(self) -> float:
        return self.num_frames / self.fps


@dataclasses.dataclass(frozen=True)
class Clip:
    frames: np.ndarray  # uint8 [N, H, W, 3]
    timestamps: np.ndarray  # float64 seconds [N]
    indices: np.ndarray  # int64 source frame indices [N]
    metadata: VideoMetadata


class VideoReader:
    """One open decord reader: metadata on construction, batched decoding of chosen frames."""

    def __init__(self, path: str, num_threads: int = 1):
        path = os.fspath(path)
        if not os.path.exists(path):
            raise VideoError(f"{path}: file not found")
        if os.path.isdir(path):
            raise VideoError(f"{path}: is a directory, not a video file")
        if os.path.getsize(path) == 0:
            raise VideoError(f"{path}: empty file (0 bytes)")
        import decord

        try:
            self._reader = decord.VideoReader(path, num_threads=num_threads)
            num_frames = len(self._reader)
            fps = float(self._reader.get_avg_fps())
            first_shape = self._reader[0].shape if num_frames else None
        except Exception as e:  # decord raises its own DECORDError and RuntimeErrors
            raise VideoError(f"{path}: not a readable video ({type(e).__name__}: {str(e)[:200]})") from e
        if num_frames <= 0:
            raise VideoError(f"{path}: video has no frames")
        if not math.isfinite(fps) or fps <= 0:
            raise VideoError(f"{path}: invalid frame rate {fps}")
        self.metadata = VideoMetadata(path=path, fps=fps, num_frames=num_frames,
                                      height=int(first_shape[0]), width=int(first_shape[1]))

    def get(self, indices) -> np.ndarray:
        indices = [int(i) for i in indices]
        try:
            frames = self._reader.get_batch(indices).asnumpy()
        except Exception as e:
            raise VideoError(f"{self.metadata.path}: decoding frames {indices[:4]}... failed "
                             f"({type(e).__name__}: {str(e)[:200]}); the file may be truncated") from e
        if frames.shape[0] != len(indices) or frames.ndim != 4:
            raise VideoError(f"{self.metadata.path}: decoder returned {frames.shape} for "
                             f"{len(indices)} frames; the file may be truncated")
        return frames


def _round_by(x: float, f: int) -> int:
    return int(round(x / f) * f)


def _ceil_by(x: float, f: int) -> int:
    return int(math.ceil(x / f) * f)


def _floor_by(x: float, f: int) -> int:
    return int(math.floor(x / f) * f)


def frame_range(meta: VideoMetadata, start: float | None, end: float | None) -> tuple[int, int]:
    """Inclusive [first, last] frame indices of the window, times clamped to the video."""
    if start is None and end is None:
        return 0, meta.num_frames - 1
    duration = meta.duration
    if start is not None and end is not None and start >= end:
        raise ValueError(f"{meta.path}: start={start} must be < end={end}")
    if start is not None and start >= duration:
        raise ValueError(f"{meta.path}: start={start} s is beyond the video duration "
                         f"{duration:.3f} s")
    final = meta.num_frames - 1
    # A start inside the last frame interval rounds up past the final frame: clamp it first.
    first = min(math.ceil(max(0.0, min(start, duration)) * meta.fps), final) if start is not None else 0
    last = final
    if end is not None:
        last = min(math.floor(max(0.0, min(end, duration)) * meta.fps), final)
    last = max(last, first)  # a window shorter than one frame still yields its nearest frame
    return first, last


def count_frames(available: int, fps_video: float, nframes: int | None, fps: float | None,
                 min_frames: int | None, max_frames: int | None) -> int:
    """How many frames to sample from `available` frames (qwen-vl-utils `smart_nframes`):
    a fixed count rounded to an even number, or duration*fps clipped to [min, max] and
    floored to an even number; never more than `available`, never fewer than 1."""
    if nframes is not None and fps is not None:
        raise ValueError("give either nframes or fps, not both")
    if nframes is not None:
        if nframes < 1:
            raise ValueError(f"nframes={nframes} must be >= 1")
        n = max(_round_by(nframes, FRAME_FACTOR), FRAME_FACTOR) if nframes > 1 else 1
    else:
        rate = DEFAULT_FPS if fps is None else fps
        if rate <= 0:
            raise ValueError(f"fps={rate} must be > 0")
        lo = _ceil_by(min_frames if min_frames is not None else DEFAULT_MIN_FRAMES, FRAME_FACTOR)
        hi = _floor_by(max_frames if max_frames is not None else min(DEFAULT_MAX_FRAMES, available),
                       FRAME_FACTOR)
        if min_frames is not None and max_frames is not None and min_frames > max_frames:
            raise ValueError(f"min_frames={min_frames} > max_frames={max_frames}")
        n = available / fps_video * rate
        n = _floor_by(min(max(n, lo), max(hi, 1), available), FRAME_FACTOR)
    return int(max(1, min(n, available)))


def sample_indices(first: int, last: int, n: int) -> np.ndarray:
    """n indices spread uniformly over [first, last] inclusive (linspace, rounded)."""
    if n == 1:
        return np.array([round((first + last) / 2)], np.int64)
    return np.round(np.linspace(first, last, n)).astype(np.int64)


def resize_frames(frames: np.ndarray, min_pixels: int | None, max_pixels: int | None,
                  sizing: str = "single") -> np.ndarray:
    """Bicubic resize of every frame through each size of `frame_sizes` (multiples of 28,
    then 32, under "two_stage"; multiples of 32 under "single")."""
    for h, w in _sizes(*frames.shape[1:3], min_pixels, max_pixels, sizing):
        frames = _resize_to(frames, h, w)
    return frames


def _sizes(height: int, width: int, min_pixels: int | None, max_pixels: int | None,
           sizing: str, video_frames: int = 0) -> list[tuple[int, int]]:
    """frames.frame_sizes, or with video_frames > 0 frames.video_frame_sizes for a video item
    of that many frames."""
    low = DEFAULT_MIN_PIXELS if min_pixels is None else min_pixels
    high = DEFAULT_MAX_PIXELS if max_pixels is None else max_pixels
    if video_frames:
        return video_frame_sizes(video_frames, height, width, low, high, sizing)
    return frame_sizes(height, width, low, high, sizing)


def _resize_to(frames: np.ndarray, h: int, w: int) -> np.ndarray:
    from PIL import Image

    height, width = frames.shape[1:3]
    if (h, w) == (height, width):
        return frames
    return np.stack([np.asarray(Image.fromarray(f).resize((w, h), Image.BICUBIC)) for f in frames])


def read_frames(path, nframes: int | None = None, fps: float | None = None,
                start: float | None = None, end: float | None = None,
                min_frames: int | None = None, max_frames: int | None = None,
                min_pixels: int | None = None, max_pixels: int | None = None,
                num_threads: int = 1, sizing: str = "single", video_item: bool = False) -> Clip:
    """Samples frames from `path` (whole video or [start, end] seconds).

    nframes: a fixed count spread uniformly; otherwise `fps` (default 2) with min/max frame
    counts. Frames are resized so H*W lies in [min_pixels, max_pixels] (defaults 784 and
    50176) with both sides multiples of 32; under sizing "two_stage" that resize is at factor
    28 and the Qwen3-VL processor's follows (frames.frame_sizes). video_item: the frames are one
    Qwen3-VL video item, the second stage the video processor's (frames.video_frame_sizes).
    Returns uint8 frames [N, H, W, 3] and the source timestamps in seconds (frame index / fps).
    """
    reader = VideoReader(path, num_threads=num_threads)
    meta = reader.metadata
    indices = clip_indices(meta, nframes, fps, start, end, min_frames, max_frames)
    frames = reader.get(indices)
    for h, w in _sizes(*frames.shape[1:3], min_pixels, max_pixels, sizing, len(indices) if video_item else 0):
        frames = _resize_to(frames, h, w)
    return Clip(frames=frames, timestamps=indices / meta.fps, indices=indices, metadata=meta)


def clip_indices(meta: VideoMetadata, nframes: int | None = None, fps: float | None = None,
                 start: float | None = None, end: float | None = None, min_frames: int | None = None,
                 max_frames: int | None = None) -> np.ndarray:
    """The source frame indices [N] `read_frames` decodes for these arguments."""
    first, last = frame_range(meta, start, end)
    n = count_frames(last - first + 1, meta.fps, nframes, fps, min_frames, max_frames)
    return sample_indices(first, last, n)


def blank_clip(meta: VideoMetadata, nframes: int | None = None, fps: float | None = None,
               start: float | None = None, end: float | None = None, min_frames: int | None = None,
               max_frames: int | None = None, min_pixels: int | None = None,
               max_pixels: int | None = None, sizing: str = "single", video_item: bool = False) -> Clip:
    """The clip `read_frames` would return from a video with metadata `meta` (same frame count,
    timestamps and resized frame size), with black frames and no decoding: for sizing prompts
    (the memory planner) without a video file."""
    indices = clip_indices(meta, nframes, fps, start, end, min_frames, max_frames)
    h, w = _sizes(meta.height, meta.width, min_pixels, max_pixels, sizing, len(indices) if video_item else 0)[-1]
    frames = np.zeros((len(indices), h, w, 3), np.uint8)
    return Clip(frames=frames, timestamps=indices / meta.fps, indices=indices, metadata=meta)


def read_video_item(path, nframes: int, min_pixels: int, max_pixels: int, num_threads: int = 1) -> Clip:
    """The frames of a Qwen3-VL video item as a serving engine decodes a video file: `nframes`
    indices spread over the whole video and truncated to integers (every frame when the video
    has fewer), all resized (bicubic) to one size whose total T*h*w lies in
    [min_pixels, max_pixels] (`video_smart_resize`). Timestamps are frame index / fps."""
    if nframes < 1:
        raise ValueError(f"nframes={nframes} must be >= 1")
    reader = VideoReader(path, num_threads=num_threads)
    meta = reader.metadata
    total = meta.num_frames
    indices = (np.arange(total, dtype=np.int64) if total <= nframes
               else np.linspace(0, total - 1, nframes).astype(np.int64))
    frames = reader.get(indices)
    h, w = video_smart_resize(len(frames), *frames.shape[1:3], min_pixels=min_pixels, max_pixels=max_pixels)
    return Clip(frames=_resize_to(frames, h, w), timestamps=indices / meta.fps, indices=indices, metadata=meta)


def video_metadata(path) -> VideoMetadata:
    return VideoReader(path).metadata
