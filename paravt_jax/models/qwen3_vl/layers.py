"""Small numerical building blocks shared by the vision tower and the text decoder.

Precision rules (docs/model.md, "Precision"): norms accumulate in float32, softmax runs in
float32, the vision rotary is applied in float32, the text rotary in the compute dtype.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def make_param(rngs: nnx.Rngs, shape: Sequence[int], axes: Sequence[str | None],
               init: str, dtype, stddev: float = 0.02) -> nnx.Param:
    """A parameter carrying its logical axis names in the `axes` metadata."""
    if len(shape) != len(axes):
        raise ValueError(f"shape {tuple(shape)} and axes {tuple(axes)} differ in rank")
    if init == "normal":
        value = stddev * jax.random.normal(rngs.params(), tuple(shape), jnp.float32)
    elif init == "ones":
        value = jnp.ones(tuple(shape), jnp.float32)
    elif init == "zeros":
        value = jnp.zeros(tuple(shape), jnp.float32)
    else:
        raise ValueError(f"unknown init {init!r}")
    return nnx.Param(value.astype(dtype), axes=tuple(axes))


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Normalise in float32, cast back to x.dtype, then scale in x.dtype (HF order)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return normed.astype(x.dtype) * weight.astype(x.dtype)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-6) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    y = jnp.einsum("...i,io->...o", x, kernel.astype(x.dtype))
    if bias is not None:
        y = y + bias.astype(x.dtype)
    return y


def gelu_tanh(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=True)


def gelu_exact(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=False)


def rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """NeoX-style rotary (pairs i and i + d/2). cos/sin broadcast against x."""
    return x * cos + rotate_half(x) * sin


def run_layers(layer_fn: Callable, carry, stacked_params, num_layers: int, *, scan: bool,
               remat: bool, constrain: Callable | None = None):
    """Applies `carry = layer_fn(carry, params_i, i)` for i in range(num_layers).

    Parameters are stored stacked along a leading `layers` axis; `scan=True` runs one
    `lax.scan` (one compiled body, fast compiles for deep models), `scan=False` unrolls.
    `constrain` (e.g. a sharding constraint) is applied to the carry between layers, outside
    the rematerialised function, so the layer inputs remat saves take its layout.
    """
    fn = jax.checkpoint(layer_fn, prevent_cse=not scan) if remat else layer_fn
    pin = constrain or (lambda c: c)
    carry = pin(carry)
    if scan:
        def body(c, xs):
            params_i, i = xs
            return pin(fn(c, params_i, i)), None

        carry, _ = jax.lax.scan(body, carry, (stacked_params, jnp.arange(num_layers)))
        return carry
    for i in range(num_layers):
        carry = pin(fn(carry, jax.tree.map(lambda p, i=i: p[i], stacked_params), i))
    return carry


def to_dtype(name: str):
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def as_numpy_int(x, name: str) -> np.ndarray | None:
    if x is None:
        return None
    arr = np.asarray(x)
    if arr.dtype.kind not in "iub":
        raise TypeError(f"{name}: expected an integer array, got dtype {arr.dtype}")
    return arr.astype(np.int64)
