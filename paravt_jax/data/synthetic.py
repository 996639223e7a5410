"""Synthetic long-video material: drifting solid backgrounds with short timed shape events."""
from __future__ import annotations

import dataclasses

import numpy as np

COLORS = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (40, 80, 230),
          "yellow": (235, 220, 40), "purple": (150, 60, 200), "white": (245, 245, 245)}
SHAPES = ("square", "circle", "triangle")


@dataclasses.dataclass(frozen=True)
class Event:
    start: float  # seconds
    end: float
    color: str
    shape: str


def background(t: np.ndarray, seed: int) -> np.ndarray:
    """A slowly drifting dark colour per time t (seconds) -> [len(t), 3] uint8."""
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * np.pi, 3)
    base = 40 + 30 * np.sin(np.asarray(t, np.float64)[:, None] / 37.0 + phase)
    return np.clip(base, 0, 110).astype(np.uint8)


def shape_mask(shape: str, height: int, width: int, cy: float, cx: float, radius: float) -> np.ndarray:
    yy, xx = np.mgrid[:height, :width]
    if shape == "square":
        return (np.abs(yy - cy) <= radius) & (np.abs(xx - cx) <= radius)
    if shape == "circle":
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= radius**2
    if shape == "triangle":
        return (yy >= cy - radius) & (yy <= cy + radius) & (np.abs(xx - cx) <= (yy - (cy - radius)) / 2)
    raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


def render_frame(t: float, events: list[Event], height: int, width: int, seed: int) -> np.ndarray:
    """The frame at time t seconds: background plus any event active at t. [H, W, 3] uint8."""
    frame = np.empty((height, width, 3), np.uint8)
    frame[:] = background(np.array([t]), seed)[0]
    for event in events:
        if event.start <= t < event.end:
            mask = shape_mask(event.shape, height, width, height / 2, width / 2, min(height, width) / 4)
            frame[mask] = COLORS[event.color]
    return frame


def render_frames(times, events: list[Event], height: int, width: int, seed: int) -> np.ndarray:
    return np.stack([render_frame(float(t), events, height, width, seed) for t in times])
