"""Multimodal RoPE: host-side 3-D position ids (the `get_rope_index` rules) and the
device-side interleaved MRoPE tables."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from paravt_jax.models.qwen3_vl.config import TextConfig

TEXT, IMAGE, VIDEO = 0, 1, 2


def split_video_grids(video_grid_thw) -> np.ndarray:
    """Each video (t, h, w) becomes t grids (1, h, w): timestamps separate temporal groups."""
    if video_grid_thw is None:
        return np.zeros((0, 3), np.int64)
    grid = np.asarray(video_grid_thw, np.int64).reshape(-1, 3)
    out = np.repeat(grid, grid[:, 0], axis=0)
    out[:, 0] = 1
    return out


def sequence_positions(types: np.ndarray, grids: dict[int, list], cursor: dict[int, int],
                       start: int = 0, spatial_merge_size: int = 2,
                       where: str = "sequence") -> np.ndarray:
    """3-D positions [3, n] for one unpadded token sequence whose first token gets `start`.

    Text runs advance by their length; each vision run takes the next grid of its modality
    (`cursor` is advanced in place) and advances by max(h, w)/merge. The position after the
    sequence is always max(positions) + 1, so a continuation chunk starts exactly there.
    """
    names = {IMAGE: "image", VIDEO: "video"}
    m = spatial_merge_size
    chunks, current, offset = [], start, 0
    for kind, group in itertools.groupby(np.asarray(types).tolist()):
        n = len(list(group))
        if kind == TEXT:
            chunks.append(np.broadcast_to(np.arange(current, current + n), (3, n)))
            current += n
        elif kind in (IMAGE, VIDEO):
            if cursor[kind] >= len(grids[kind]):
                raise ValueError(f"{where}: more {names[kind]} token runs than {names[kind]} grids "
                                 f"({len(grids[kind])} grid groups given)")
            _, h, w = grids[kind][cursor[kind]]
            cursor[kind] += 1
            gh, gw = int(h) // m, int(w) // m
            if n != gh * gw:
                raise ValueError(
                    f"{where}: a run of {n} {names[kind]} pad tokens at offset {offset} does not "
                    f"match its grid {[1, int(h), int(w)]}, which needs {gh * gw} tokens")
            rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
            chunks.append(np.stack([np.full(n, current), current + rows.reshape(-1),
                                    current + cols.reshape(-1)]))
            current += max(gh, gw)
        else:
            raise ValueError(f"{where}: unknown mm_token_type {kind}")
        offset += n
    if not chunks:
        return np.zeros((3, 0), np.int64)
    return np.concatenate(chunks, axis=1).astype(np.int64)


def get_rope_index(mm_token_type_ids: np.ndarray, attention_mask: np.ndarray,
                   image_grid_thw=None, video_grid_thw=None,
                   spatial_merge_size: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """3-D MRoPE positions for a (left- or right-) padded batch.

    mm_token_type_ids, attention_mask: [B, L] (0 text, 1 image pad, 2 video pad).
    Returns position_ids [3, B, L] (padding positions 0) and rope_deltas [B], where a token
    decoded at step s after the prompt gets position n_valid + s + delta on all three axes.
    Each vision run consumes the next grid of its modality (images and video groups each in
    batch order) and must hold exactly (h/m)*(w/m) tokens.
    """
    types = np.asarray(mm_token_type_ids, np.int64)
    mask = np.asarray(attention_mask).astype(bool)
    batch, length = types.shape
    grids = {
        IMAGE: list(np.asarray(image_grid_thw, np.int64).reshape(-1, 3)) if image_grid_thw is not None else [],
        VIDEO: list(split_video_grids(video_grid_thw)),
    }
    cursor = {IMAGE: 0, VIDEO: 0}
    positions = np.zeros((3, batch, length), np.int64)
    deltas = np.zeros((batch,), np.int64)
    for b in range(batch):
        valid = np.nonzero(mask[b])[0]
        flat = sequence_positions(types[b, valid], grids, cursor, 0, spatial_merge_size,
                                  where=f"sample {b}")
        if flat.size:
            positions[:, b, valid] = flat
            deltas[b] = flat.max() + 1 - len(valid)
    return positions, deltas


def mrope_selector(config: TextConfig) -> np.ndarray:
    """For each of the head_dim/2 frequencies, which axis (0=T, 1=H, 2=W) drives it."""
    half = config.head_dim // 2
    sel = np.zeros((half,), np.int32)
    j = np.arange(half)
    sec = config.mrope_section
    sel[(j % 3 == 1) & (j < 3 * sec[1])] = 1
    sel[(j % 3 == 2) & (j < 3 * sec[2])] = 2
    return sel


def mrope_tables(position_ids: jax.Array, config: TextConfig, dtype) -> tuple[jax.Array, jax.Array]:
    """position_ids [3, B, L] -> cos, sin [B, L, head_dim] in `dtype` (interleaved MRoPE).

    The tables are materialised once (optimization barrier): otherwise XLA fuses cos/sin
    into every consumer, recomputing them per element of q and k in every layer (on CPU
    that was ~1 ms per layer of a 512-token prefill at batch 8, inside the cache write)."""
    half = config.head_dim // 2
    inv = 1.0 / (config.rope_theta ** (jnp.arange(0, config.head_dim, 2, dtype=jnp.float32)
                                       / config.head_dim))
    freqs = position_ids.astype(jnp.float32)[..., None] * inv  # [3, B, L, half]
    sel = jnp.asarray(mrope_selector(config))
    f = jnp.where(sel == 1, freqs[1], jnp.where(sel == 2, freqs[2], freqs[0]))
    emb = jnp.concatenate([f, f], axis=-1)
    assert emb.shape[-1] == 2 * half
    return jax.lax.optimization_barrier((jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)))
