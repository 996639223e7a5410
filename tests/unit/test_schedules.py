"""The RL schedules (paravt_jax/rl/schedules.py) over a recording stand-in for RLStep's phases:
which schedule a config gets, the order of a synchronous step's phases, the periodic evaluation,
the unreadable-step streak, and the asynchronous schedule's producer (its staleness bound, the
weights it samples with, a precompiled first policy, a failure reaching the trainer)."""
import dataclasses
import threading
import time
import types

import pytest

from paravt_jax.rl.pipeline import PipelineError, Policy
from paravt_jax.rl.schedules import Asynchronous, Synchronous, schedule_for
from paravt_jax.train.loop import UnreadableDataError


@dataclasses.dataclass
class Scored:
    rollouts: list
    skipped: list


class Phases:
    """RLStep's phases on plain values: the state is the number of updates so far, a policy's
    model is the name of its weights, a rollout names the step and the weights it came from."""

    def __init__(self, steps=4, max_staleness=0, eval_every=0, prompts_per_step=2, rows=4, unreadable=(),
                 fail_at=None):
        self.config = types.SimpleNamespace(steps=steps, max_staleness=max_staleness, eval_every=eval_every,
                                            prompts_per_step=prompts_per_step)
        self.rows = list(range(rows))
        self.unreadable, self.fail_at = set(unreadable), fail_at
        self.calls, self.lock = [], threading.Lock()

    def record(self, *call):
        with self.lock:
            self.calls.append(call)

    def collect_with(self, model, index):
        self.record("collect", index, model, threading.current_thread().name)
        if index == self.fail_at:
            raise OSError(f"no video for step {index}")
        if index in self.unreadable:
            return [], [f"row{index}.mp4"]
        return [f"step{index}@{model}"], []

    def collect(self, state, index):
        return self.collect_with(f"w{state}", index)

    def score(self, rollouts, skipped):
        self.record("score", len(rollouts))
        return Scored(rollouts, skipped)

    def gather(self, scored):
        self.record("gather", tuple(scored.rollouts))
        return scored

    def learn(self, state, index, scored, timings):
        self.record("learn", index, tuple(scored.rollouts), tuple(sorted(timings)))
        return state + 1, {"trained_on": scored.rollouts[0], "tokens": 8, **timings}

    def evaluate(self, state, evaluators, index):
        self.record("evaluate", index, state, tuple(evaluators))
        return {"eval/score": float(state)}

    def policy(self, state, version):
        self.record("policy", state, version)
        return Policy(version, f"w{state}")

    def precompile(self, state, index, model=None):
        self.record("precompile", index, model)


def run(schedule, start=0, state=0):
    history = []
    try:
        for index in range(start, schedule.phases.config.steps):
            state, metrics = schedule.step(state, index)
            history.append(metrics)
    finally:
        schedule.close()
    return state, history


def test_the_config_chooses_the_schedule():
    mesh = types.SimpleNamespace(size=4, shape={"tensor": 4})
    assert type(schedule_for(Phases(max_staleness=0))) is Synchronous
    assert type(schedule_for(Phases(max_staleness=1))) is Asynchronous
    split = schedule_for(Phases(max_staleness=0), ["check"], rollout_mesh=mesh)  # devices of its own
    assert type(split) is Asynchronous and split.rollout_mesh is mesh and split.evaluators == ["check"]


def test_a_synchronous_step_samples_from_the_current_weights_then_trains():
    phases = Phases(steps=3)
    state, history = run(Synchronous(phases))
    assert state == 3
    assert [m["trained_on"] for m in history] == ["step0@w0", "step1@w1", "step2@w2"]
    main = threading.current_thread().name
    assert phases.calls[:4] == [("collect", 0, "w0", main), ("score", 1), ("gather", ("step0@w0",)),
                                ("learn", 0, ("step0@w0",), ("reward_s", "rollout_s"))]
    assert all("tokens" not in m and m["tokens_per_s"] > 0 for m in history)  # tokens over the step's seconds
    assert all("staleness" not in m and "publish_s" not in m for m in history)


@pytest.mark.parametrize("max_staleness", [0, 2])
def test_the_periodic_evaluation_follows_every_nth_step_and_needs_evaluators(max_staleness):
    phases = Phases(steps=5, eval_every=2, max_staleness=max_staleness)
    _, history = run(schedule_for(phases, ["held_out"]))
    assert [c for c in phases.calls if c[0] == "evaluate"] == [("evaluate", 1, 2, ("held_out",)),
                                                               ("evaluate", 3, 4, ("held_out",))]
    assert [m.get("eval/score") for m in history] == [None, 2.0, None, 4.0, None]
    quiet = Phases(steps=2, eval_every=1, max_staleness=max_staleness)
    run(schedule_for(quiet, []))  # no evaluators: nothing to run
    assert not [c for c in quiet.calls if c[0] == "evaluate"]


def test_unreadable_steps_are_skipped_until_a_whole_epoch_in_a_row():
    """4 rows, 2 prompts a step: one unreadable step is skipped (no update), a readable one
    resets the count, two unreadable steps in a row are the whole dataset: the run stops."""
    phases = Phases(steps=4, rows=4, prompts_per_step=2, unreadable={0, 2, 3})
    schedule = Synchronous(phases)
    state, skipped = schedule.step(0, 0)
    assert state == 0 and skipped["unreadable_step"] == 1.0 and skipped["skipped_episodes"] == 1
    assert skipped["rollouts"] == 0 and "rollout_s" in skipped and "tokens_per_s" not in skipped
    state, _ = schedule.step(state, 1)
    assert state == 1 and schedule.unreadable_prompts == 0
    state, _ = schedule.step(state, 2)
    assert schedule.unreadable_prompts == 2
    with pytest.raises(UnreadableDataError, match=r"4 prompts in a row \(the dataset has 4\).*row3\.mp4"):
        schedule.step(state, 3)


@pytest.mark.parametrize("bound", [1, 2])
def test_the_asynchronous_schedule_samples_ahead_within_its_bound(bound):
    phases = Phases(steps=5, max_staleness=bound)
    state, history = run(schedule_for(phases))
    assert state == 5
    for index, metrics in enumerate(history):
        version = metrics["policy_version"]
        assert metrics["trained_on"] == f"step{index}@w{version}"  # sampled by that version's weights
        assert 0 <= index - version <= bound and metrics["staleness"] == metrics["staleness_max"] == index - version
        assert ("publish_s" in metrics) == (index < 4)  # no weights after the last update
    assert history[0]["policy_version"] == 0
    collects = [c for c in phases.calls if c[0] == "collect"]
    assert [c[1] for c in collects] == [0, 1, 2, 3, 4] and {c[3] for c in collects} == {"rollout-producer"}
    # the trainer publishes version i + 1 from the state after update i
    assert [c for c in phases.calls if c[0] == "policy"] == [("policy", i, i) for i in range(5)]


def test_a_resumed_asynchronous_run_samples_its_first_step_with_the_restored_weights():
    phases = Phases(steps=4, max_staleness=2)
    state, history = run(schedule_for(phases), start=2, state=2)
    assert state == 4 and history[0]["trained_on"] == "step2@w2" and history[0]["policy_version"] == 2


def test_precompiling_on_a_rollout_mesh_hands_its_weights_to_the_first_step():
    mesh = types.SimpleNamespace(size=4, shape={"tensor": 4})
    phases = Phases(steps=2, max_staleness=0)
    schedule = schedule_for(phases, rollout_mesh=mesh)
    schedule.prepare(0, 0)
    assert phases.calls == [("policy", 0, 0), ("precompile", 0, "w0")]
    _, history = run(schedule)
    assert [c for c in phases.calls if c[0] == "policy"] == [("policy", 0, 0), ("policy", 1, 1)]  # not placed twice
    assert [m["staleness"] for m in history] == [0, 0]
    colocated = Phases(steps=1, max_staleness=1)
    schedule_for(colocated).prepare(0, 0)  # colocated: the training weights themselves
    assert colocated.calls == [("precompile", 0, None)]
    synchronous = Phases(steps=1)
    schedule_for(synchronous).prepare(0, 0)
    assert synchronous.calls == [("precompile", 0, None)]


def test_a_producer_failure_reaches_the_trainer_at_its_step():
    phases = Phases(steps=4, max_staleness=1, fail_at=2)
    schedule = schedule_for(phases)
    state, _ = schedule.step(0, 0)
    state, _ = schedule.step(state, 1)
    with pytest.raises(PipelineError, match="failed before step 2") as failed:
        schedule.step(state, 2)
    assert isinstance(failed.value.__cause__, OSError) and "no video for step 2" in str(failed.value.__cause__)
    schedule.close()
    assert not schedule.pipeline._thread.is_alive()


def test_closing_early_stops_the_producer_and_drops_what_it_sampled_ahead():
    phases = Phases(steps=6, max_staleness=2)
    schedule = schedule_for(phases)
    schedule.step(0, 0)
    deadline = time.time() + 10
    while len([c for c in phases.calls if c[0] == "collect"]) < 4 and time.time() < deadline:
        time.sleep(0.01)  # steps 1..3 need at most version 1, published by step 0
    schedule.close()
    assert not schedule.pipeline._thread.is_alive()
    assert [c[1] for c in phases.calls if c[0] == "collect"] == [0, 1, 2, 3]
    schedule.close()  # a second close is harmless
