"""The loop every trainer shares: deterministic data order, resume from the latest
checkpoint, periodic and preemption (SIGTERM / SIGINT) checkpoints, non-finite-step accounting,
metrics. Trainers supply `step(state, index) -> (state, metrics)`."""
from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable

import numpy as np
from absl import logging

from paravt_jax.infra import distributed as dist
from paravt_jax.infra import preemption
from paravt_jax.infra.checkpointing import Checkpointer
from paravt_jax.infra.metrics_writer import MetricsWriter
from paravt_jax.train import compiles


class NonFiniteError(RuntimeError):
    pass


class UnreadableDataError(RuntimeError):
    """A whole epoch's worth of examples in a row could not be read: the data is broken."""


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
    checkpoint_every: int = 0  # 0 = only at the end / on SIGTERM or SIGINT
    keep_checkpoints: int = 3
    max_bad_steps: int = 3  # consecutive non-finite steps that stop the run
    async_checkpoints: bool = True
    # steps of each invocation that may compile (its programs' first shapes); a later step
    # that compiles prints a warning naming the programs
    warmup_steps: int = 2


@dataclasses.dataclass
class LoopResult:
    state: object
    steps_done: int
    history: list[dict]  # this invocation's steps only (metrics.jsonl holds the whole run)


def stop_requested_everywhere() -> int | None:
    """The signal that asked any process to stop (all processes stop at the same step, since
    a checkpoint is a collective write)."""
    signum = preemption.stop_requested()
    if dist.process_count() > 1:
        signum = max((s or 0) for s in dist.allgather_objects(signum)) or None
    return signum


def compile_metrics(step: compiles.Compiles, run: compiles.Compiles, evaluation: int = 0) -> dict:
    """A step's XLA compilations (count and seconds; those of a periodic evaluation inside the
    step, which the step reports as `eval_compiles`, left out of the count) and the process's
    running total."""
    return {"compiles": step.count - evaluation, "compile_s": round(step.seconds, 3), "compiles_total": run.count}


def prepare(prepare_fn: Callable, state, start: int) -> dict:
    """Runs `prepare_fn(state, start)`; the compiles and seconds it took."""
    t0, before = time.perf_counter(), compiles.snapshot()
    prepare_fn(state, start)
    seconds, compiled = time.perf_counter() - t0, before.since()
    logging.info(f"[loop] compiled {compiled.count} programs before step {start} in {seconds:.1f} s")
    return {"precompiles": compiled.count, "precompile_s": round(seconds, 3)}


def run_loop(name: str, workdir: str, state, step_fn: Callable, config: LoopConfig,
             meta_fn: Callable[[int], dict] = lambda i: {}, prepare_fn: Callable | None = None) -> LoopResult:
    """Runs steps [start, config.steps) where start comes from the latest checkpoint in
    workdir/checkpoints (if any); metrics an interrupted run logged for steps >= start are
    dropped first. `prepare_fn(state, start)`, if given, runs once before the first step
    (outside its timing; e.g. compiling its programs ahead): its compiles and seconds go into
    the first step's metrics as `precompiles` and `precompile_s`. On SIGTERM or SIGINT the
    current step finishes, a checkpoint is written and `preemption.Preempted` is raised (the
    rerun resumes from that checkpoint)."""
    checkpoints = Checkpointer(f"{workdir}/checkpoints", keep=config.keep_checkpoints,
                               async_save=config.async_checkpoints)
    start = 0
    restored = checkpoints.restore_latest(state)
    if restored is not None:
        state, meta = restored
        start = int(meta["next_step"])
        logging.info(f"[{name}] resumed from {checkpoints.directory} at step {start}")
    writer = MetricsWriter(workdir, total_steps=config.steps)
    writer.resume(start)
    history, bad = [], 0
    with preemption.deferred():  # from here a signal means: finish the step, checkpoint, stop
        if start < config.steps:
            logging.info(f"[{name}] step {start}/{config.steps}: the first step of a run also compiles its programs "
                         f"(minutes for large models)")
        prepared = prepare(prepare_fn, state, start) if prepare_fn is not None and start < config.steps else {}
        for index in range(start, config.steps):
            t0, cpu0 = time.perf_counter(), time.process_time()
            before = compiles.snapshot()
            state, metrics = step_fn(state, index)
            # the process's CPU seconds (all its threads): the step's work, which other jobs on
            # a shared machine slow less than its wall time
            metrics.update(step_s=time.perf_counter() - t0, step_cpu_s=time.process_time() - cpu0)
            compiled = before.since()
            metrics.update(compile_metrics(compiled, compiles.total(), int(metrics.get("eval_compiles", 0))))
            if metrics["compiles"] and index >= start + config.warmup_steps:
                logging.warning(f"[{name}] step {index} compiled {compiled.summary()} "
                                f"(shapes outside the run's buckets)")
            if index == start:
                metrics.update(prepared)
            history.append(metrics)
            writer.write(index, metrics, prefix=f"{name}/")
            bad = bad + 1 if metrics.get("skipped") else 0
            if bad >= config.max_bad_steps:
                checkpoints.save(index + 1, state, {"next_step": index + 1, **meta_fn(index + 1)}, force=True)
                checkpoints.close()
                raise NonFiniteError(f"[{name}] {bad} consecutive non-finite steps, the last at step {index}")
            done = index + 1
            signum = stop_requested_everywhere()
            periodic = config.checkpoint_every and done % config.checkpoint_every == 0
            if periodic or done == config.steps or signum:
                checkpoints.save(done, state, {"next_step": done, **meta_fn(done)}, force=True)
            if signum:
                checkpoints.close()
                writer.close()
                raise preemption.Preempted(signum, f"[{name}] {signal.Signals(signum).name}: checkpoint at "
                                                   f"step {done} of {config.steps} written to "
                                                   f"{checkpoints.directory}; rerun to resume")
        checkpoints.close()
        writer.close()
    return LoopResult(state, config.steps, history)
