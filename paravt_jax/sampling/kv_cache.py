"""KV cache layout, buckets and sharding for the sampler.

The cache is a tuple of one [B, KV heads, S, head_dim] array per layer, for keys and for
values; `CacheSpec.shape` names the whole (stacked) extent, `layer_shape` one array."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from paravt_jax import sharding as sh

CACHE_AXES = ("layers", "batch", "kv_heads", "cache_length", "head_dim")


def bucket(n: int, minimum: int = 1, multiple: int | None = None) -> int:
    """Smallest power of two >= max(n, minimum); with `multiple`, rounded up to it beyond it."""
    n = max(int(n), minimum, 1)
    if multiple and n > multiple:
        return int(-(-n // multiple) * multiple)
    return 1 << (n - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    layers: int
    batch: int
    capacity: int
    kv_heads: int
    head_dim: int
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.layers, self.batch, self.kv_heads, self.capacity, self.head_dim)

    @property
    def layer_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def bytes(self) -> int:
        return 2 * int(np.prod(self.shape)) * jnp.dtype(self.dtype).itemsize


def cache_sharding(mesh, spec: CacheSpec):
    """The sharding of one layer's [B, KV, S, hd] cache array (None without a mesh)."""
    if mesh is None:
        return None
    return sh.named_sharding(mesh, CACHE_AXES[1:], spec.layer_shape)


def constrain(x, sharding):
    """with_sharding_constraint on an array or on every array of a tuple (a cache)."""
    if sharding is None:
        return x
    if isinstance(x, (tuple, list)):
        return tuple(jax.lax.with_sharding_constraint(a, sharding) for a in x)
    return jax.lax.with_sharding_constraint(x, sharding)
