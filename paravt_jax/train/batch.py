"""Sequences -> padded training arrays, and micro-batches with their own vision inputs.

Task-agnostic: a sequence is a `ModelInputs` (tokens, positions, loss mask, vision). What a
loss needs beyond that (RL: advantages, behaviour and proximal log-probs) travels as named
per-token EXTRAS, [N, T] arrays aligned with the tokens: extra[b, t] belongs to token t. Log-
probs follow the sampler's convention: logprob[b, t] is log p(token t | tokens < t), 0 at t = 0.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from paravt_jax.models.qwen3_vl.vision import pad_frames_to_buckets, vision_layout
from paravt_jax.sampling.kv_cache import bucket
from paravt_jax.text.inputs import ModelInputs, collate_vision

# Fields of every batch; an extra may not reuse one of these names.
TOKEN_FIELDS = ("input_ids", "attention_mask", "position_ids", "loss_mask", "visual_index",
                "pixel_values", "vision_meta")


@dataclasses.dataclass(frozen=True)
class Packed:
    """Right-padded [N, T] numpy arrays for a list of sequences; extras: name -> [N, T]."""
    sequences: tuple[ModelInputs, ...]
    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray  # [3, N, T]
    loss_mask: np.ndarray
    extras: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)


def _check_extra_names(names) -> None:
    clash = sorted(set(names) & set(TOKEN_FIELDS))
    if clash:
        raise ValueError(f"per-token extras {clash} reuse batch field names {TOKEN_FIELDS}")


def pack(sequences: Sequence[ModelInputs], extras: Mapping[str, Sequence[np.ndarray]] | None = None,
         min_length: int = 16, multiple: int = 256) -> Packed:
    """Right-pads to a bucketed length so the train step compiles once per bucket.

    extras: name -> one [L_b] array per sequence (its own length), padded with zeros into an
    [N, T] array of the arrays' common dtype."""
    extras = dict(extras or {})
    _check_extra_names(extras)
    n = len(sequences)
    width = bucket(max(s.length for s in sequences), min_length, multiple)
    ids = np.zeros((n, width), np.int32)
    mask = np.zeros((n, width), np.int32)
    positions = np.zeros((3, n, width), np.int32)
    loss = np.zeros((n, width), np.int32)
    padded = {}
    for name, arrays in extras.items():
        if len(arrays) != n:
            raise ValueError(f"extra {name!r}: {len(arrays)} arrays for {n} sequences")
        padded[name] = np.zeros((n, width), np.result_type(*[np.asarray(a).dtype for a in arrays]))
    for b, s in enumerate(sequences):
        length = s.length
        ids[b, :length], mask[b, :length], positions[:, b, :length], loss[b, :length] = (
            s.input_ids, 1, s.position_ids, s.loss_mask)
        loss[b, 0] = 0  # the first token has no prediction
        for name, arrays in extras.items():
            padded[name][b, :length] = arrays[b]
    return Packed(tuple(sequences), ids, mask, positions, loss, padded)


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """One micro-batch on the host. Token arrays [B, T] (position_ids [3, B, T]); vision
    inputs for its own rows; extras: name -> [B, T] per-token arrays the loss reads."""
    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    loss_mask: np.ndarray
    visual_index: np.ndarray | None
    pixel_values: np.ndarray | None
    vision_meta: tuple | None
    extras: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def with_extras(self, **extras) -> TrainBatch:
        """A copy with these extras added or replaced."""
        _check_extra_names(extras)
        return dataclasses.replace(self, extras={**self.extras, **extras})

    def device_tree(self) -> dict:
        """The flat dict the jitted step receives: the batch fields and the extras side by side."""
        # Not dataclasses.asdict: it deep-copies every array (pixels included) on each call.
        tree = {name: getattr(self, name) for name in TOKEN_FIELDS}
        tree.update(self.extras)
        return tree


def _vision(sequences: Sequence[ModelInputs], width: int, vision_config):
    visual_index, pixels, grids = collate_vision(sequences, len(sequences), width)
    if pixels is None:
        return None, None, None
    pixels, grids = pad_frames_to_buckets(pixels, grids)  # few distinct shapes: few compiles
    return visual_index, pixels, vision_layout(grids, vision_config).device_arrays()


def micro_batches(packed: Packed, num_micro: int, vision_config,
                  extras: Mapping[str, np.ndarray] | None = None) -> list[TrainBatch]:
    """Splits rows into `num_micro` equal micro-batches (rows must divide evenly). extras:
    name -> [N, T] per-token arrays for the loss (not `packed.extras` implicitly: the caller
    chooses what goes to the device), split by rows like the tokens."""
    extras = dict(extras or {})
    _check_extra_names(extras)
    n = packed.input_ids.shape[0]
    if n % num_micro:
        raise ValueError(f"{n} rows do not split into {num_micro} micro-batches")
    for name, array in extras.items():
        if np.shape(array) != packed.input_ids.shape:
            raise ValueError(f"extra {name!r} has shape {np.shape(array)}, the tokens {packed.input_ids.shape}")
    size = n // num_micro
    out = []
    for i in range(num_micro):
        rows = slice(i * size, (i + 1) * size)
        visual_index, pixels, meta = _vision(packed.sequences[rows], packed.input_ids.shape[1], vision_config)
        out.append(TrainBatch(
            input_ids=packed.input_ids[rows], attention_mask=packed.attention_mask[rows],
            position_ids=packed.position_ids[:, rows], loss_mask=packed.loss_mask[rows],
            visual_index=visual_index, pixel_values=pixels, vision_meta=meta,
            extras={name: array[rows] for name, array in extras.items()}))
    return out
