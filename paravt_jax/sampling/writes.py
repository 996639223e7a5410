"""An extend's writes into the suffix cache (`write_chunks`, `write_width`): the chunks of
`Sampler.extend`, `extend_turns` and `admit_turns`, in text pieces within the prefill token
budget; with a write slot per row, only the rows that write, in groups gathered by index
(`prefill_rows`)."""
from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from paravt_jax.models.qwen3_vl.text import KVCache
from paravt_jax.sampling import prefill as prefill_program
from paravt_jax.sampling import programs
from paravt_jax.sampling.chunks import chunk_width, has_vision, text_slice
from paravt_jax.sampling.kv_cache import row_group, writing_groups
from paravt_jax.text.inputs import ModelInputs


def write_width(sampler, chunks: Sequence[ModelInputs | None]) -> int:
    """The slots an extend of `chunks` writes: their bucket, or a multiple of
    config.extend_width when they hold no image."""
    width = chunk_width(chunks, sampler.config.min_chunk_bucket)
    piece = sampler.config.extend_width
    if piece and all(c is None or not has_vision(c) for c in chunks):
        width = piece * -(-max([c.length for c in chunks if c is not None] + [1]) // piece)
    return width


def write_chunks(sampler, suffix: KVCache, prefix: KVCache, write_index, chunks: Sequence[ModelInputs | None],
                 width: int, prefix_rows: np.ndarray | None = None) -> tuple[jax.Array, KVCache]:
    """An extend's prefill: `chunks` (one per row, None = nothing) written into `suffix` from
    `write_index` (one slot for every row, or [B] each row's own: groups of the rows that
    write, `prefill_rows`), in pieces of config.extend_width when they hold no image (with a
    slot per row, also pieces narrow enough that a group keeps within the prefill token
    budget). `prefix_rows` [B] (a slot per row only; None: all): the rows that read their
    prompt's prefix. Returns (logits [B, V] of each row's last chunk token, the suffix)."""
    rows = suffix.valid.shape[0]
    piece = sampler.config.extend_width
    group = row_group(rows) if np.ndim(write_index) == 1 else rows
    if np.ndim(write_index) == 1 and group * (piece or width) > sampler.backend.prefill_tokens:
        piece = max(sampler.backend.prefill_tokens // group // 16 * 16, 16)
    if not (piece and all(c is None or not has_vision(c) for c in chunks)):
        return sampler.prefill(suffix, prefix, write_index, chunks, width, prefix_rows=prefix_rows)
    width = piece * -(-width // piece)
    logits = None
    for start in range(0, width, piece):
        part = [None if c is None or c.length <= start else text_slice(c, start, start + piece) for c in chunks]
        out, suffix = sampler.prefill(suffix, prefix, write_index + start, part, piece, prefix_rows=prefix_rows)
        ends_here = np.array([c is not None and start < c.length <= start + piece for c in chunks]
                             + [False] * (rows - len(chunks)))
        # picked from the first piece on, so that the program compiles on a run's first
        # extend, not on the first one whose responses need two pieces
        logits = programs.pick_rows(ends_here, out, out if logits is None else logits)
    return logits, suffix


def prefill_rows(sampler, cache: KVCache, prefix: KVCache | None, write_index: np.ndarray,
                  chunks: list[ModelInputs | None], width: int, prefix_rows: np.ndarray | None
                  ) -> tuple[jax.Array, KVCache]:
    """`Sampler.prefill` with a slot per row (write_index [B]; a row at or past the capacity writes
    nothing): the rows that write, in groups of `row_group` rows gathered by index
    (kv_cache.writing_groups), so that a refill of a few rows computes those rows, not every
    row of the cache, through one program whatever their number. Returns (logits [B, V],
    those of the rows that write; the cache)."""
    rows = cache.valid.shape[0]
    chunks = list(chunks) + [None] * (rows - len(chunks))
    reach = int(np.max(write_index[write_index < cache.capacity], initial=0))  # the furthest row that writes
    size = row_group(rows)
    plan = sampler.prefill_plan(rows, cache.capacity, reach, width, size, 1)
    logits, reads = None, None if prefix_rows is None else np.asarray(prefix_rows, bool)
    for index, targets in writing_groups(write_index, cache.capacity, size):
        slots = np.where(targets < rows, write_index[index], cache.capacity)  # padding entries write nothing
        part = [chunks[r] if t < rows else None for r, t in zip(index, targets)]
        chunk = sampler.prefill_chunk(part, size, width, 0, slots, 0)
        chunk = chunk._replace(row_index=index, prefix_rows=reads)
        out, cache = prefill_program.prefill(sampler.graphdef, sampler.params, sampler.weights, cache, prefix, chunk,
                                             plan)
        logits = programs.put_rows(programs.zero_rows(out, rows) if logits is None else logits, out, targets,
                                   programs.mesh_sharding(out))
    return logits, cache
