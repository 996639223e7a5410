"""Shape buckets: the sizes a varying dimension (rows, widths, frames, cache slots) is padded
to, so that the programs of a run compile for a few shapes, not one per call. Shared by the
sampler, the training batches and the planner."""
from __future__ import annotations


def bucket(n: int, minimum: int = 1, multiple: int | None = None) -> int:
    """Smallest power of two >= max(n, minimum); with `multiple`, rounded up to it beyond it."""
    n = max(int(n), minimum, 1)
    if multiple and n > multiple:
        return int(-(-n // multiple) * multiple)
    return 1 << (n - 1).bit_length()


def fit(n: int, fixed: int, minimum: int = 1) -> int:
    """The size of a dimension of `n` under a fixed size: exactly `fixed` when n fits in it (a
    fixed size need not be a power of two), else n's bucket (at least `fixed`); never below
    `minimum`. `fixed` 0: n's bucket. For power-of-two sizes the same as
    max(bucket(n, minimum), fixed)."""
    if fixed and n <= fixed:
        return max(fixed, minimum)
    return max(bucket(n, minimum), fixed)
