"""Asynchronous rollouts with bounded staleness: a producer thread samples the episodes of step
j from the newest policy it has while the trainer updates on the episodes of earlier steps.

Versions count updates: version v is the policy after v optimizer steps, so the trainer runs
step i with version i and publishes version i + 1 after it. The producer starts step j only once
a policy of version >= j - max_staleness has been published, and samples it with the newest one
published by then; the trainer consumes step j's episodes at version j, so every consumed group
is at most `max_staleness` versions behind the policy it trains (AReaL's bound,
`max_head_offpolicyness`). The gate also bounds the queue: at most max_staleness + 1 steps are
produced and not yet consumed. max_staleness = 0 is the synchronous schedule: step j is sampled
from version j, after the update of step j - 1.

The pipeline carries opaque items: `produce(policy, index)` returns whatever the trainer needs
(rl/trainer.py: the step's scored rollouts); what a policy is (a model on the rollout devices)
is the publisher's business. Items are produced in step order and consumed in step order.
Nothing here is collective: a multi-process run would publish from the trainer's thread."""
from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable

from absl import logging


@dataclasses.dataclass(frozen=True)
class Policy:
    version: int  # optimizer updates behind these weights
    model: object  # what the producer samples with


@dataclasses.dataclass(frozen=True)
class Produced:
    """One step's item and how it was made."""
    index: int  # the step it is for
    version: int  # the policy version that sampled it
    value: object  # produce()'s result
    produce_s: float  # seconds produce() took
    weights_wait_s: float  # seconds the producer waited for a recent enough policy first


@dataclasses.dataclass(frozen=True)
class Taken:
    """What the trainer gets for step `index`: the item, its staleness and the queue's state."""
    produced: Produced
    staleness: int  # versions between the sampling policy and the trainer's (index)
    data_wait_s: float  # seconds the trainer waited for it
    queue_depth: int  # items ready when the trainer asked (0: it waited for this one)


class PipelineError(RuntimeError):
    """The producer failed; the cause is chained."""


class Pipeline:
    """`Pipeline(produce, first, start, stop, max_staleness)` starts a producer thread for
    steps [start, stop) from policy `first` (version start); `take(i)` blocks for step i's item,
    `publish(policy)` hands the producer newer weights, `close()` stops the thread and returns
    the items produced and never taken (dropped: a stop before the end)."""

    def __init__(self, produce: Callable[[object, int], object], first: Policy, start: int, stop: int,
                 max_staleness: int):
        if max_staleness < 0:
            raise ValueError(f"max_staleness={max_staleness} must be >= 0")
        self._produce, self._start, self._stop, self._bound = produce, start, stop, max_staleness
        self._policy = first
        self._items: collections.deque[Produced] = collections.deque()
        self._failure: BaseException | None = None
        self._closing = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)
        self._thread.start()

    # -- producer side ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            for index in range(self._start, self._stop):
                t0, oldest = time.perf_counter(), index - self._bound
                with self._changed:
                    self._changed.wait_for(lambda: self._closing or self._policy.version >= oldest)  # noqa: B023
                    if self._closing:
                        return
                    policy = self._policy
                waited = time.perf_counter() - t0
                t1 = time.perf_counter()
                value = self._produce(policy.model, index)
                item = Produced(index, policy.version, value, time.perf_counter() - t1, waited)
                with self._changed:
                    self._items.append(item)
                    self._changed.notify_all()
        except BaseException as e:  # handed to the trainer, which raises it
            with self._changed:
                self._failure = e
                self._changed.notify_all()

    # -- trainer side -------------------------------------------------------------------
    def publish(self, policy: Policy) -> None:
        """Newer weights for the producer (it picks them up before its next step)."""
        with self._changed:
            if policy.version <= self._policy.version:
                raise ValueError(f"publish: version {policy.version} is not newer than {self._policy.version}")
            self._policy = policy
            self._changed.notify_all()

    def take(self, index: int) -> Taken:
        """Step `index`'s item (blocking until it is produced); raises PipelineError when the
        producer failed."""
        t0 = time.perf_counter()
        with self._changed:
            depth = len(self._items)
            self._changed.wait_for(lambda: self._items or self._failure is not None)
            if not self._items:
                raise PipelineError(f"the rollout producer failed before step {index}") from self._failure
            item = self._items.popleft()
        if item.index != index:
            raise PipelineError(f"the trainer asked for step {index} but the producer made step {item.index}")
        staleness = index - item.version
        if not 0 <= staleness <= self._bound:  # the gate in _run makes this impossible
            raise PipelineError(f"step {index} was sampled by version {item.version}: {staleness} versions "
                                f"behind, outside [0, {self._bound}]")
        return Taken(item, staleness, time.perf_counter() - t0, depth)

    def close(self) -> int:
        """Stops the producer (after the step it is sampling, if any) and joins it; the number
        of produced items never taken."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join()
        dropped = len(self._items)
        self._items.clear()
        if dropped:
            logging.info(f"[rl] {dropped} produced steps of rollouts were not used (stopped before them)")
        return dropped
