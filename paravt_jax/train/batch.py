"""Rollouts -> padded training arrays, and micro-batches with their own vision inputs.

Token arrays are aligned with the tokens: logprob[b, t] is the log-probability of token t
given tokens < t (position 0 holds 0), the same convention as the sampler's output and
`Rollout.logprobs`.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from paravt_jax.models.qwen3_vl.vision import pad_frames_to_buckets, vision_layout
from paravt_jax.sampling.kv_cache import bucket
from paravt_jax.text.inputs import ModelInputs, collate_vision


@dataclasses.dataclass(frozen=True)
class PackedRollouts:
    """Right-padded [N, T] numpy arrays for a list of sequences (rollouts or SFT examples)."""
    sequences: tuple[ModelInputs, ...]
    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray  # [3, N, T]
    loss_mask: np.ndarray
    behaviour_logp: np.ndarray
    structural_mask: np.ndarray


def pack(sequences: Sequence[ModelInputs], behaviour_logp: Sequence[np.ndarray] | None = None,
         structural_masks: Sequence[np.ndarray] | None = None, min_length: int = 16,
         multiple: int = 256) -> PackedRollouts:
    """Right-pads to a bucketed length so the train step compiles once per bucket."""
    n = len(sequences)
    width = bucket(max(s.length for s in sequences), min_length, multiple)
    ids = np.zeros((n, width), np.int32)
    mask = np.zeros((n, width), np.int32)
    positions = np.zeros((3, n, width), np.int32)
    loss = np.zeros((n, width), np.int32)
    logp = np.zeros((n, width), np.float32)
    structural = np.zeros((n, width), np.int32)
    for b, s in enumerate(sequences):
        L = s.length
        ids[b, :L], mask[b, :L], positions[:, b, :L], loss[b, :L] = (
            s.input_ids, 1, s.position_ids, s.loss_mask)
        loss[b, 0] = 0  # the first token has no prediction
        if behaviour_logp is not None:
            logp[b, :L] = behaviour_logp[b]
        if structural_masks is not None:
            structural[b, :L] = structural_masks[b]
    return PackedRollouts(tuple(sequences), ids, mask, positions, loss, logp, structural)


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """One micro-batch on the host. Arrays [B, T]; vision inputs for its own rows."""
    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    loss_mask: np.ndarray
    advantages: np.ndarray
    behaviour_logp: np.ndarray
    prox_logp: np.ndarray | None
    visual_index: np.ndarray | None
    pixel_values: np.ndarray | None
    vision_meta: tuple | None

    def device_tree(self) -> dict:
        # Not dataclasses.asdict: it deep-copies every array (pixels included) on each call.
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _vision(sequences: Sequence[ModelInputs], width: int, vision_config):
    visual_index, pixels, grids = collate_vision(sequences, len(sequences), width)
    if pixels is None:
        return None, None, None
    pixels, grids = pad_frames_to_buckets(pixels, grids)  # few distinct shapes: few compiles
    return visual_index, pixels, vision_layout(grids, vision_config).device_arrays()


def micro_batches(packed: PackedRollouts, advantages: np.ndarray, num_micro: int, vision_config,
                  prox_logp: np.ndarray | None = None) -> list[TrainBatch]:
    """Splits rows into `num_micro` equal micro-batches (rows must divide evenly)."""
    n = packed.input_ids.shape[0]
    if n % num_micro:
        raise ValueError(f"{n} rows do not split into {num_micro} micro-batches")
    size = n // num_micro
    out = []
    for i in range(num_micro):
        rows = slice(i * size, (i + 1) * size)
        visual_index, pixels, meta = _vision(packed.sequences[rows], packed.input_ids.shape[1], vision_config)
        out.append(TrainBatch(
            input_ids=packed.input_ids[rows], attention_mask=packed.attention_mask[rows],
            position_ids=packed.position_ids[:, rows], loss_mask=packed.loss_mask[rows],
            advantages=np.asarray(advantages, np.float32)[rows],
            behaviour_logp=packed.behaviour_logp[rows],
            prox_logp=None if prox_logp is None else prox_logp[rows],
            visual_index=visual_index, pixel_values=pixels, vision_meta=meta))
    return out
