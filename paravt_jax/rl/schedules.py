"""How `train_rl` runs its steps: the synchronous and the asynchronous schedule over an RL step's
phases (rl/trainer.py's `RLStep`, as `Phases` names them).

A schedule is what train/loop.py's `run_loop` drives: `step(state, index) -> (state, metrics)`,
`prepare(state, index)` (the first step's programs compiled ahead, `rl.precompile`) and
`close()` once the loop ends. Both hand a step's scored episodes to `Schedule.train_on`
(the update, or a skipped step when none of its videos could be read) and finish it with
`Schedule.finish` (throughput, the periodic evaluation).

- `Synchronous` (rl.max_staleness = 0, colocated): each step samples from the current
  weights, then trains on what it sampled.
- `Asynchronous` (rl.max_staleness > 0, or rollouts on devices of their own): a producer
  thread (rl/pipeline.py) samples ahead from the weights the trainer publishes after each
  update, at most max_staleness versions old when trained on; its first step's policy is the
  state the loop starts (or resumes) from."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from absl import logging

from paravt_jax.eval.evaluator import Evaluator
from paravt_jax.infra import distributed as dist
from paravt_jax.rl.pipeline import Pipeline, Policy, Taken
from paravt_jax.train.loop import UnreadableDataError


class Phases(Protocol):
    """What a schedule uses of an RL step (rl/trainer.py's RLStep)."""
    config: Any  # the run's RLConfig: steps, prompts_per_step, max_staleness, eval_every
    rows: list  # the dataset's rows

    def collect(self, state, index: int) -> tuple[list, list[str]]: ...
    def collect_with(self, model, index: int) -> tuple[list, list[str]]: ...
    def score(self, rollouts: list, skipped: list[str]) -> Any: ...
    def gather(self, scored) -> Any: ...
    def learn(self, state, index: int, scored, timings: dict) -> tuple[Any, dict]: ...
    def evaluate(self, state, evaluators: Sequence[Evaluator], index: int) -> dict: ...
    def policy(self, state, version: int) -> Policy: ...
    def precompile(self, state, index: int, model=None) -> None: ...


def unreadable_step(index: int, skipped: list[str], prompts_in_a_row: int, dataset_size: int) -> dict:
    """The metrics of a step none of whose videos could be read (the update is skipped); raises
    UnreadableDataError once `prompts_in_a_row` (this step's included) reach a whole epoch."""
    names = "; ".join(skipped)
    if prompts_in_a_row >= dataset_size:
        raise UnreadableDataError(f"[rl] no video could be read for {prompts_in_a_row} prompts in a row "
                                  f"(the dataset has {dataset_size}); the last step's: {names}")
    logging.warning(f"[rl] step {index} skipped, none of its videos could be read: {names}")
    return {"unreadable_step": 1.0, "skipped_episodes": len(skipped), "rollouts": 0}


def pipeline_metrics(taken: Taken) -> dict:
    """An asynchronous step's staleness (versions behind: the mean and the max over the
    processes, each of which sampled its share with one version; its oldest version) and the
    waits of this process. Collective in a multi-process run."""
    stale = [taken.staleness]
    if dist.process_count() > 1:
        stale = dist.allgather_objects(taken.staleness)
    return {"staleness": float(np.mean(stale)), "staleness_max": max(stale),
            "policy_version": taken.produced.index - max(stale), "queue_depth": taken.queue_depth,
            "data_wait_s": taken.data_wait_s, "weights_wait_s": taken.produced.weights_wait_s}


def throughput(metrics: dict, start: float) -> None:
    """tokens_per_s: the step's loss tokens over its seconds so far (an unreadable step has none)."""
    if "tokens" in metrics:
        metrics["tokens_per_s"] = metrics.pop("tokens") / max(time.perf_counter() - start, 1e-9)


@dataclasses.dataclass
class Schedule:
    """What both schedules share: training on a step's scored episodes and finishing the step.
    `evaluators` run after every `rl.eval_every`-th step."""
    phases: Phases
    evaluators: Sequence[Evaluator] = ()
    unreadable_prompts: int = 0  # prompts in a row whose videos could not be read

    def train_on(self, state, index: int, scored, timings: dict) -> tuple[Any, dict]:
        """The update on step `index`'s scored episodes (every process's), its metrics with
        `timings` (the rollout side's); a skipped step when there are none."""
        if not scored.rollouts:
            self.unreadable_prompts += self.phases.config.prompts_per_step
            metrics = unreadable_step(index, scored.skipped, self.unreadable_prompts, len(self.phases.rows))
            return state, {**timings, **metrics}
        self.unreadable_prompts = 0
        return self.phases.learn(state, index, scored, timings)

    def evaluates_after(self, index: int) -> bool:
        every = self.phases.config.eval_every
        return bool(every and self.evaluators and (index + 1) % every == 0)

    def finish(self, state, index: int, metrics: dict, start: float) -> tuple[Any, dict]:
        """The step's throughput since `start`, then the periodic evaluation if one is due."""
        throughput(metrics, start)
        if self.evaluates_after(index):
            metrics.update(self.phases.evaluate(state, self.evaluators, index))
        return state, metrics

    def close(self) -> None:
        """Nothing to stop (the asynchronous schedule stops its producer)."""


@dataclasses.dataclass
class Synchronous(Schedule):
    """Each step samples from the current weights, then trains on its episodes."""

    def prepare(self, state, index: int) -> None:
        self.phases.precompile(state, index)

    def step(self, state, index: int) -> tuple[Any, dict]:
        t0 = time.perf_counter()
        rollouts, skipped = self.phases.collect(state, index)
        t1 = time.perf_counter()
        scored = self.phases.gather(self.phases.score(rollouts, skipped))
        timings = {"rollout_s": t1 - t0, "reward_s": time.perf_counter() - t1}
        state, metrics = self.train_on(state, index, scored, timings)
        return self.finish(state, index, metrics, t0)


@dataclasses.dataclass
class Asynchronous(Schedule):
    """A producer thread samples and scores each step's episodes ahead (rl/pipeline.py); the
    trainer takes them in step order, gathers them over processes, trains and publishes its
    new weights. `rollout_mesh`: the devices that sample (None: the trainer's)."""
    rollout_mesh: object = None
    pipeline: Pipeline | None = None  # started by this invocation's first step
    precompiled: dict[int, Policy] = dataclasses.field(default_factory=dict)  # the weights prepare() sampled with

    def prepare(self, state, index: int) -> None:
        """Compiles step `index`'s programs ahead; on a rollout mesh with the weights placed
        there, which the first step then samples with (not copied twice)."""
        if self.rollout_mesh is None:  # the training weights themselves
            self.phases.precompile(state, index)
            return
        self.precompiled[index] = self.phases.policy(state, index)
        self.phases.precompile(state, index, self.precompiled[index].model)

    def produce(self, model, index: int) -> tuple[Any, dict]:
        """The producer thread's work: step `index`'s episodes sampled by `model` and scored on
        this process, with the seconds of each."""
        t0 = time.perf_counter()
        rollouts, skipped = self.phases.collect_with(model, index)
        t1 = time.perf_counter()
        scored = self.phases.score(rollouts, skipped)
        return scored, {"rollout_s": t1 - t0, "reward_s": time.perf_counter() - t1}

    def start(self, state, index: int) -> Pipeline:
        """The producer for steps [index, steps), sampling first from the weights in `state`."""
        config = self.phases.config
        where = "the training devices" if self.rollout_mesh is None else (
            f"{self.rollout_mesh.size} devices of their own ({dict(self.rollout_mesh.shape)})")
        logging.info(f"[rl] asynchronous rollouts on {where}, up to {config.max_staleness} policy versions stale")
        first = self.precompiled.pop(index, None) or self.phases.policy(state, index)
        return Pipeline(self.produce, first, index, config.steps, config.max_staleness)

    def step(self, state, index: int) -> tuple[Any, dict]:
        t0 = time.perf_counter()
        if self.pipeline is None:
            self.pipeline = self.start(state, index)
        taken = self.pipeline.take(index)
        scored, timings = taken.produced.value
        state, metrics = self.train_on(state, index, self.phases.gather(scored),
                                       {**timings, **pipeline_metrics(taken)})
        if index + 1 < self.phases.config.steps:
            t_publish = time.perf_counter()
            self.pipeline.publish(self.phases.policy(state, index + 1))
            metrics["publish_s"] = time.perf_counter() - t_publish
        return self.finish(state, index, metrics, t0)

    def close(self) -> None:
        """Stops the producer (the steps it sampled ahead and nobody took are dropped)."""
        if self.pipeline is not None:
            self.pipeline.close()


def schedule_for(phases: Phases, evaluators: Sequence[Evaluator] = (), rollout_mesh=None) -> Schedule:
    """Synchronous at rl.max_staleness = 0 on the training devices; asynchronous otherwise."""
    if rollout_mesh is None and phases.config.max_staleness == 0:
        return Synchronous(phases, evaluators)
    return Asynchronous(phases, evaluators, rollout_mesh=rollout_mesh)
