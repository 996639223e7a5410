"""Stopping on SIGTERM (preemption) and SIGINT (Ctrl-C) without losing or faking work.

Inside `guard()` (the CLI wraps every command in it) either signal raises `Preempted` at once,
except inside `deferred()` regions: a training loop's steps and writes that must not be torn
(checkpoints, the final model, the summary). There the signal is only recorded; the loop
finishes its step, writes a checkpoint and raises `Preempted` itself (`stop_requested()`).
A second signal inside a deferred region stops at once (an impatient Ctrl-C).

`Preempted` derives from BaseException, like KeyboardInterrupt, so that a handler meant for
one failing item (`except Exception` around a sweep arm or an eval sample) cannot swallow it.
The CLI turns it into exit status 128 + the signal number (143 for SIGTERM, 130 for SIGINT),
what a shell reports for a process that signal ended; rerunning the same command resumes.
"""
from __future__ import annotations

import contextlib
import signal
import threading

from absl import logging

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(BaseException):
    """The job was asked to stop by `signum`; `message` says what was saved."""

    def __init__(self, signum: int, message: str = ""):
        self.signum = signum
        self.message = message or f"stopped by {signal.Signals(signum).name}"
        super().__init__(self.message)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class _State:
    def __init__(self):
        self.guards = 0  # nesting depth of guard()
        self.deferred = 0  # nesting depth of deferred()
        self.signum: int | None = None  # the first signal received inside a deferred region
        self.previous: dict[int, object] = {}


_state = _State()


def _handler(signum, frame):
    if _state.deferred and _state.signum is None:
        _state.signum = signum
        logging.warning(f"[paravt-jax] {signal.Signals(signum).name} received: finishing the current step, "
                        f"then checkpoint and stop (send it again to stop at once)")
        return
    raise Preempted(signum)


@contextlib.contextmanager
def guard():
    """Installs the handlers (main thread only; elsewhere a no-op); re-entrant."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _state.guards == 0:
        _state.previous = {s: signal.signal(s, _handler) for s in SIGNALS}
        _state.signum = None
    _state.guards += 1
    try:
        yield
    finally:
        _state.guards -= 1
        if _state.guards == 0:
            for s, previous in _state.previous.items():
                signal.signal(s, previous)
            _state.previous = {}


@contextlib.contextmanager
def deferred():
    """Inside guard(): signals are recorded, not raised (see stop_requested)."""
    with guard():
        _state.deferred += 1
        try:
            yield
        finally:
            _state.deferred -= 1


def stop_requested() -> int | None:
    """The signal number recorded inside a deferred region, if any."""
    return _state.signum


def raise_if_requested(message: str = "") -> None:
    """Raises Preempted for a recorded signal (call where stopping is safe)."""
    if _state.signum is not None:
        raise Preempted(_state.signum, message)
