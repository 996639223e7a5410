"""The loop every trainer shares: deterministic data order, resume from the latest
checkpoint, periodic and preemption (SIGTERM) checkpoints, non-finite-step accounting,
metrics. Trainers supply `step(state, index) -> (state, metrics)`."""
from __future__ import annotations

import dataclasses
import signal
import time
from typing import Callable

import numpy as np

from paravt_jax.checkpointing import Checkpointer
from paravt_jax.metrics_writer import MetricsWriter


class NonFiniteError(RuntimeError):
    pass


def data_indices(cursor: int, count: int, size: int, seed: int) -> list[int]:
    """Rows cursor..cursor+count-1 of an endless sequence of seeded per-epoch permutations."""
    if size <= 0:
        raise ValueError("the dataset is empty")
    out = []
    for position in range(cursor, cursor + count):
        epoch, offset = divmod(position, size)
        out.append(int(np.random.default_rng([seed, epoch]).permutation(size)[offset]))
    return out


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    steps: int
    checkpoint_every: int = 0  # 0 = only at the end / on SIGTERM
    keep_checkpoints: int = 3
    max_bad_steps: int = 3  # consecutive non-finite steps that stop the run
    async_checkpoints: bool = True


@dataclasses.dataclass
class LoopResult:
    state: object
    steps_done: int
    preempted: bool
    history: list[dict]


def run_loop(name: str, workdir: str, state, step_fn: Callable, config: LoopConfig,
             meta_fn: Callable[[int], dict] = lambda i: {},
             writer: MetricsWriter | None = None) -> LoopResult:
    """Runs steps [start, config.steps) where start comes from the latest checkpoint in
    workdir/checkpoints (if any)."""
    checkpoints = Checkpointer(f"{workdir}/checkpoints", keep=config.keep_checkpoints,
                               async_save=config.async_checkpoints)
    start = 0
    restored = checkpoints.restore_latest(state)
    if restored is not None:
        state, meta = restored
        start = int(meta["next_step"])
        print(f"[{name}] resumed from {checkpoints.directory} at step {start}", flush=True)
    writer = writer or MetricsWriter(workdir, total_steps=config.steps)
    stop = {"sigterm": False}
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        stop["sigterm"] = True

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread
        previous = None
    history, bad, index = [], 0, start
    try:
        for index in range(start, config.steps):
            t0 = time.perf_counter()
            state, metrics = step_fn(state, index)
            metrics["step_s"] = time.perf_counter() - t0
            history.append(metrics)
            writer.write(index, metrics, prefix=f"{name}/")
            bad = bad + 1 if metrics.get("skipped") else 0
            if bad >= config.max_bad_steps:
                checkpoints.save(index + 1, state, {"next_step": index + 1, **meta_fn(index + 1)}, force=True)
                raise NonFiniteError(f"[{name}] {bad} consecutive non-finite steps, the last at step {index}")
            done = index + 1
            periodic = config.checkpoint_every and done % config.checkpoint_every == 0
            if periodic or done == config.steps or stop["sigterm"]:
                checkpoints.save(done, state, {"next_step": done, **meta_fn(done)}, force=True)
            if stop["sigterm"]:
                print(f"[{name}] SIGTERM: checkpoint at step {done} written, exiting", flush=True)
                checkpoints.close()
                return LoopResult(state, done, True, history)
        checkpoints.close()
        return LoopResult(state, config.steps, False, history)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
