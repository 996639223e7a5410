"""What a sampler call is given and returns besides its prompts and SamplingParams: the fixed
prompt-prefill sizes (`PromptShape`) and the rows and width they give a call (`call_rows`,
`call_width`), and its `SampleOutput`."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from paravt_jax.infra.buckets import fit
from paravt_jax.text.inputs import ModelInputs


@dataclasses.dataclass(frozen=True)
class PromptShape:
    """Fixed sizes of a generate() call's prompt prefill, so that calls over other prompts run
    the programs compiled for earlier ones: `rows` prompt rows (padding rows when fewer; more
    prompts than that take their own bucket, see `call_rows`), at least `width` tokens, and a
    vision pass padded to `frames_per_row` frames per prompt row (per frame size). Zeros: each
    call's own power-of-two buckets."""
    rows: int = 0
    width: int = 0
    frames_per_row: int = 0

    def __post_init__(self):
        if min(self.rows, self.width, self.frames_per_row) < 0:
            raise ValueError(f"PromptShape sizes must be >= 0, got {self}")


def call_rows(prompts: int, shape: PromptShape, min_batch_bucket: int = 1) -> int:
    """Prompt rows of a generate() call of `prompts` prompts: exactly shape.rows when they fit
    (all of a round's sub-agent prompts, episode rows x calls per turn, in one call of 320 rows,
    not 512), else their power-of-two bucket (infra/buckets.py `fit`)."""
    return fit(prompts, shape.rows, min_batch_bucket)


def call_width(prompts: Sequence[ModelInputs], shape: PromptShape, min_chunk_bucket: int = 1) -> int:
    """Prefill width of a generate() call: exactly shape.width when the longest prompt fits (a
    sub-agent prompt of ~1,420 tokens in 1,536, not 2,048), else its power-of-two bucket."""
    return fit(max([p.length for p in prompts] + [1]), shape.width, min_chunk_bucket)


@dataclasses.dataclass(frozen=True)
class SampleOutput:
    tokens: list[list[int]]  # per row, the stop token included when hit
    logprobs: list[np.ndarray]  # per row, float32, same length as tokens
    finished: np.ndarray  # [B] bool: hit a stop id
    lengths: np.ndarray  # [B] generated tokens
    row_steps: int = 0  # the call's decode work: its rows x the decode steps they ran, busy or not
