"""Metrics kept as sums and counts, so that accumulating micro-batches is exact.

Each value is a `WeightedMean(total, count)` (mean = total / count) or a `RunningMax(value,
count)`; `merge_stats` combines two dicts of them and `finalize_stats` turns one into plain
numbers. Both are pytrees, so they pass through `jax.jit` / `lax.scan` unchanged. Every loss
the training engine runs (the PPO loss, the SFT loss) reports its metrics this way.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp


class WeightedMean(NamedTuple):
    """A mean kept as (total, count). Merging adds both; `.value` = total / max(count, 1)."""

    total: jax.Array
    count: jax.Array

    def merge(self, other: WeightedMean) -> WeightedMean:
        return WeightedMean(self.total + other.total, self.count + other.count)

    @property
    def value(self) -> jax.Array:
        return self.total / jnp.maximum(self.count, 1)


class RunningMax(NamedTuple):
    """A maximum over tokens, with the number of tokens it was taken over. Merging takes the
    larger maximum; `.value` is the maximum, or 0 when no token was seen."""

    maximum: jax.Array
    count: jax.Array

    def merge(self, other: RunningMax) -> RunningMax:
        return RunningMax(jnp.maximum(self.maximum, other.maximum), self.count + other.count)

    @property
    def value(self) -> jax.Array:
        return jnp.where(self.count > 0, self.maximum, 0.0)


def merge_stats(a: Mapping[str, WeightedMean | RunningMax],
                b: Mapping[str, WeightedMean | RunningMax]) -> dict:
    """Combine two micro-batches' metrics (same keys)."""
    if set(a) != set(b):
        raise ValueError(f"metric keys differ: {sorted(set(a) ^ set(b))}")
    return {k: a[k].merge(b[k]) for k in a}


def finalize_stats(stats: Mapping[str, WeightedMean | RunningMax]) -> dict[str, jax.Array]:
    """Plain values: the mean of each `WeightedMean`, the value of each `RunningMax`."""
    return {k: v.value for k, v in stats.items()}
