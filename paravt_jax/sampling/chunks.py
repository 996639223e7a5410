"""Host-side prefill batches: chunk widths, right-padded token collation, row
groups under a token budget, and the chunk edits an extend makes (the pending token in front,
fixed-width text pieces)."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from paravt_jax.infra.buckets import bucket
from paravt_jax.text.inputs import ModelInputs, encode_ids


@dataclasses.dataclass(frozen=True)
class ChunkBatch:
    ids: np.ndarray  # [Bp, P]
    positions: np.ndarray  # [3, Bp, P]
    counts: np.ndarray  # [Bp] valid chunk tokens


def chunk_width(chunks: Sequence[ModelInputs | None], min_bucket: int) -> int:
    """The bucketed width of a prefill over `chunks` (all rows write the same slots)."""
    return bucket(max([c.length for c in chunks if c is not None] + [1]), min_bucket)


def collate(chunks: Sequence[ModelInputs | None], rows: int, width: int) -> ChunkBatch:
    """Right-padded token batch of `width` (the vision inputs: Sampler.vision_inputs)."""
    counts = np.array([0 if c is None else c.length for c in chunks] + [0] * (rows - len(chunks)))
    ids = np.zeros((rows, width), np.int32)
    positions = np.zeros((3, rows, width), np.int32)
    for b, c in enumerate(chunks):
        if c is not None and c.length:
            ids[b, :c.length] = c.input_ids
            positions[:, b, :c.length] = c.position_ids
    return ChunkBatch(ids, positions, counts)


def group_rows(rows: int, per_prompt: int, width: int, token_budget: int) -> int:
    """Rows per prefill call (of one device's block when the rows are split over devices): the largest
    group of at most `token_budget` chunk tokens (one row when even one row exceeds it) that
    holds whole prompts (a multiple of `per_prompt`, a power-of-two count of prompts) or a
    divisor of `per_prompt`; it divides `rows`."""
    prompts = max(rows // per_prompt, 1)
    sizes = {per_prompt << j for j in range(prompts.bit_length()) if prompts % (1 << j) == 0}
    sizes |= {d for d in range(1, per_prompt + 1) if per_prompt % d == 0}
    fitting = [g for g in sizes if g * width <= token_budget and rows % g == 0]
    return max(fitting) if fitting else 1


def prefill_group(rows: int, per_prompt: int, width: int, shards: int, token_budget: int) -> int:
    """Rows per prefill call of `rows` rows (`per_prompt` per prompt) of `width` tokens split
    over `shards` devices: the same group_rows of each device's rows, at most `token_budget`
    chunk tokens in all (at least one row per device). The budget counts the whole group: on an
    fsdp mesh XLA computes a layer's matmuls for all of the group's tokens on every device
    (partial sums over the split weight, then all-reduced)."""
    return shards * group_rows(rows // shards, per_prompt, width, token_budget // shards)


def has_vision(chunk: ModelInputs) -> bool:
    return bool(len(chunk.pixel_values) or len(chunk.pixel_values_videos))


def text_slice(chunk: ModelInputs, start: int, stop: int) -> ModelInputs:
    """Tokens [start, stop) of a text-only chunk, with their own positions."""
    positions = chunk.position_ids[:, start:stop]
    return dataclasses.replace(chunk, input_ids=chunk.input_ids[start:stop],
                               mm_token_type_ids=chunk.mm_token_type_ids[start:stop],
                               loss_mask=chunk.loss_mask[start:stop], position_ids=positions,
                               next_position=int(positions.max()) + 1)


def prepend(token: int, position: int, chunk: ModelInputs | None) -> ModelInputs:
    head = encode_ids([token], position, trainable=True)
    return head if chunk is None else head.extend(chunk)


def with_pending(chunk: ModelInputs, pending: int, position: int, row: int, caller: str) -> ModelInputs:
    """Row `row`'s next chunk with its pending token (sampled at `position`, not yet in the cache;
    -1: none) in front. A chunk that does not start right after it is refused, naming `caller`."""
    start = position + (pending >= 0)
    if chunk.length and int(chunk.position_ids.min()) != start:
        raise ValueError(f"{caller}: row {row} chunk starts at position {int(chunk.position_ids.min())}, "
                         f"expected {start}")
    return chunk if pending < 0 else prepend(pending, position, chunk)


def pack_rows(lengths: Sequence[int], width: int) -> tuple[list[tuple[int, int]], int]:
    """Places sequences of `lengths` (each at most `width`) whole into rows of `width` tokens,
    in order, each into the first row with room (first fit). Returns ((row, offset) of each
    sequence, the rows used); the same lengths always give the same layout."""
    if any(n > width for n in lengths):
        raise ValueError(f"pack_rows: a sequence of {max(lengths)} tokens does not fit rows of {width}")
    filled: list[int] = []
    places = []
    for n in lengths:
        row = next((r for r, used in enumerate(filled) if used + n <= width), len(filled))
        if row == len(filled):
            filled.append(0)
        places.append((row, filled[row]))
        filled[row] += n
    return places, len(filled)
