"""How the SFT recipe reads an example's videos (config: an SFTConfig): each row's overview
budget K, the FrameSpec of a row, and the largest overview the recipe can give a row (what the
planner sizes)."""
from __future__ import annotations

import dataclasses

from paravt_jax.data import gating
from paravt_jax.data.sft_examples import FrameSpec


def example_nframes(index: int, config) -> int:
    """The overview K of SFT row `index`: `config.nframes`, or a draw from `nframes_choices`
    that depends on (seed, row index) alone."""
    return gating.nframes_for_prompt(f"sft-row{index}", config.seed, bool(config.nframes_choices),
                                     config.nframes, config.nframes_choices)


def example_frames(index: int, config) -> FrameSpec:
    """How SFT row `index`'s videos are read: its overview K (`example_nframes`) under count
    sampling, the config's rate and cap under fps sampling; the config's sizes."""
    nframes = example_nframes(index, config) if config.frame_sampling == "count" else 0
    return FrameSpec(nframes, config.fps, config.max_frames, config.min_pixels, config.max_pixels, config.sizing,
                     config.visual)


def largest_frames(config) -> FrameSpec:
    """The FrameSpec of the most overview frames a row can get: the largest of nframes_choices
    under count sampling with choices, else any row's (every row reads the same budget)."""
    spec = example_frames(0, config)
    if config.frame_sampling == "count" and config.nframes_choices:
        spec = dataclasses.replace(spec, nframes=max(config.nframes_choices))
    return spec
