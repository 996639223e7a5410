"""Counts XLA compilations: how many programs this process compiled (or loaded from the
persistent compilation cache), which, and how long that took.

JAX reports every backend compile through `jax.monitoring` (the same event `JAX_LOG_COMPILES`
prints): one per jitted program and input signature, and one per `jnp` operation run eagerly
on a new shape. A steady training run compiles nothing; every compile after warm-up is a
stall that costs seconds on a CPU and minutes for an 8B program on an accelerator. The
listener is process-wide (JAX keeps one list of listeners), so it is registered once and
readers take differences of `snapshot()`s.
"""
from __future__ import annotations

import collections
import dataclasses
import threading

from jax import monitoring

# jax._src.dispatch.BACKEND_COMPILE_EVENT (jax 0.10 and 0.11)
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_lock = threading.Lock()
_log: list[tuple[str, float]] = []  # (program name, seconds), in compile order
_installed = False


def _listen(event: str, duration: float, **kwargs) -> None:
    if event == BACKEND_COMPILE_EVENT:
        with _lock:
            _log.append((str(kwargs.get("fun_name", "?")), float(duration)))


def install() -> None:
    """Registers the listener (once per process; later calls do nothing)."""
    global _installed
    with _lock:
        if not _installed:
            monitoring.register_event_duration_secs_listener(_listen)
            _installed = True


@dataclasses.dataclass(frozen=True)
class Compiles:
    """The compilations between two snapshots (or since the process started)."""
    count: int
    seconds: float
    names: tuple[str, ...]  # program names in compile order

    def summary(self, limit: int = 6) -> str:
        """'3 programs in 1.2 s: _decode x2, grads' (the most frequent names first)."""
        top = collections.Counter(self.names).most_common(limit)
        listed = ", ".join(name if n == 1 else f"{name} x{n}" for name, n in top)
        more = len(set(self.names)) - len(top)
        return f"{self.count} programs in {self.seconds:.1f} s: {listed}" + (f" and {more} more" if more > 0 else "")


@dataclasses.dataclass(frozen=True)
class Snapshot:
    position: int  # compiles logged before it

    def since(self) -> Compiles:
        """The compilations since this snapshot."""
        with _lock:
            part = _log[self.position:]
        return Compiles(len(part), sum(s for _, s in part), tuple(n for n, _ in part))


def snapshot() -> Snapshot:
    install()
    with _lock:
        return Snapshot(len(_log))


def total() -> Compiles:
    """Every compilation since the listener was installed."""
    return Snapshot(0).since()
