"""Asynchronous rollouts (rl/pipeline.py, rl.max_staleness, mesh.rollout_devices) on 8 fake
CPU devices: at staleness 1 and 2 every consumed step is within its bound, the metrics say how
stale, and a SIGTERM / rerun repeats and loses no step; the producer is gated; a bad split is
named. tests/slow/test_async_rl.py holds the two long end-to-end checks (a split mesh at
staleness 0 reproduces the colocated synchronous run; a slow crop does not stall the trainer).
The helpers below are shared with it."""
import dataclasses
import json
import os
import signal
import threading
import time

import jax
import numpy as np
import pytest

from paravt_jax.agent.protocol import PromptFormat
from paravt_jax.agent.rollout import RolloutConfig
from paravt_jax.data import synthetic as syn
from paravt_jax.data.paravt_parquet import load_rl_rows
from paravt_jax.infra import sharding as sh
from paravt_jax.infra.preemption import Preempted
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.rl.pipeline import Pipeline, PipelineError, Policy
from paravt_jax.rl.trainer import RLConfig, train_rl
from paravt_jax.run_config import build_run
from paravt_jax.sampling import Sampler
from paravt_jax.text.tokenizer import train_tokenizer
from paravt_jax.train.step import OptimizerConfig

TIMING = ("_s", "compiles", "compiles_total", "tokens_per_s", "staleness", "staleness_max", "policy_version",
          "queue_depth")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("data"))
    ds = syn.write_dataset(root, num_train=4, num_eval=1, durations=(30.0,), seed=2, height=96, width=160)
    tok = train_tokenizer(syn.corpus(list(ds.questions) + list(ds.eval_questions)))
    return load_rl_rows(ds.rl_train, root)[0], tok


def rl_config(steps: int, **changes) -> RLConfig:
    config = RLConfig(steps=steps, prompts_per_step=2, samples_per_prompt=2, default_nframes=4,
                      nframes_choices=(2, 4),
                      rollout=RolloutConfig(max_turns=1, max_new_tokens=12, subagent_max_tokens=8,
                                            prompt=PromptFormat(overview_max_pixels=64 * 96)),
                      optimizer=OptimizerConfig(learning_rate=1e-4))
    return dataclasses.replace(config, **changes)


def meshes(rollout: int):
    """(training mesh, rollout mesh): fsdp over the first 8 - rollout devices, tensor over the
    rest (colocated: fsdp over all 8, no rollout mesh)."""
    devices = jax.devices()
    if not rollout:
        return sh.make_mesh({"fsdp": -1}, devices), None
    return sh.make_mesh({"fsdp": -1}, devices[:-rollout]), sh.make_mesh({"tensor": -1}, devices[-rollout:])


def run(rows, tok, workdir, config, rollout: int, **kwargs):
    train_mesh, rollout_mesh = meshes(rollout)
    model = init_model(preset("tiny"), seed=2, mesh=train_mesh)
    return train_rl(model, tok, rows, str(workdir), config, rollout_mesh=rollout_mesh, **kwargs)


def without_timing(history):
    return [{k: v for k, v in h.items() if not k.endswith(TIMING)} for h in history]


def logged(path):
    """((episode id, sample, turn count), the turns' texts) of each logged episode."""
    records = [json.loads(line) for line in open(path)]
    return [((r["episode_id"], r["sample"], len(r["turns"])), [t["text"] for t in r["turns"]]) for r in records]


def lines(workdir):
    return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


@pytest.mark.parametrize("bound", [1])  # 2: tests/slow/test_async_rl.py
def test_bounded_staleness_on_4_plus_4_devices_and_a_sigterm_rerun_repeats_nothing(dataset, tmp_path, bound):
    """Every consumed step is at most `bound` versions behind (staleness = step - the version
    that sampled it, the producer never more than `bound` steps ahead). SIGTERM while the
    producer samples step 2: the trainer finishes its step, checkpoints and stops; the rerun
    resumes there, so metrics.jsonl holds each of the 5 steps once."""
    rows, tok = dataset
    config = rl_config(5, max_staleness=bound)
    built = []

    def stop_at_third(model, sampler_config):  # the producer builds one sampler a step
        built.append(threading.current_thread().name)
        if len(built) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return Sampler(model, sampler_config)

    with pytest.raises(Preempted, match="SIGTERM: checkpoint at step"):
        run(rows, tok, tmp_path, config, 4, make_sampler=stop_at_third)
    assert set(built) == {"rollout-producer"}
    first = lines(tmp_path)
    stopped_at = len(first)
    assert 1 <= stopped_at < 5 and os.path.isdir(tmp_path / "checkpoints" / str(stopped_at))
    _, resumed = run(rows, tok, tmp_path, config, 4)
    assert resumed.steps_done == 5 and len(resumed.history) == 5 - stopped_at
    logged = lines(tmp_path)
    assert [line["step"] for line in logged] == [0, 1, 2, 3, 4]
    for line in logged:
        step, version = line["step"], line["rl/policy_version"]
        assert line["rl/staleness"] == line["rl/staleness_max"] == step - version
        assert 0 <= step - version <= bound, line
        assert np.isfinite(line["rl/loss"]) and line["rl/rollouts"] == 4
    # the rerun starts from the checkpoint's weights: its first step is sampled by them
    assert logged[stopped_at]["rl/policy_version"] == stopped_at
    assert logged[0]["rl/staleness"] == 0


def test_pipeline_gates_the_producer_and_hands_its_failure_to_the_trainer():
    """The producer starts step j only once version >= j - bound is published; a failure in
    produce() reaches take() as PipelineError with the cause chained."""
    made = []

    def produce(model, index):
        made.append((index, model))
        if index == 3:
            raise ValueError("broken step 3")
        return index

    pipe = Pipeline(produce, Policy(0, "v0"), 0, 5, max_staleness=1)
    deadline = time.time() + 10
    while len(made) < 2 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert made == [(0, "v0"), (1, "v0")]  # step 2 waits for version 1
    taken = pipe.take(0)
    assert (taken.produced.value, taken.staleness, taken.queue_depth) == (0, 0, 2)
    pipe.publish(Policy(1, "v1"))
    assert pipe.take(1).staleness == 1 and pipe.take(2).produced.version == 1
    with pytest.raises(ValueError, match="not newer"):
        pipe.publish(Policy(1, "again"))
    pipe.publish(Policy(2, "v2"))
    with pytest.raises(PipelineError, match="failed before step 3") as failed:
        pipe.take(3)
    assert isinstance(failed.value.__cause__, ValueError)
    assert pipe.close() == 0 and made[2:] == [(2, "v1"), (3, "v2")]


@pytest.mark.parametrize("changes, message", [
    (dict(rollout_devices=8), r"mesh.rollout_devices=8: must be 0 \(colocated\) or fewer than the 8 devices"),
    (dict(rollout_devices=-2), r"mesh.rollout_devices=-2"),
    (dict(rollout_devices=4, rollout_axes="tensor=3"), r"mesh.rollout_axes='tensor=3' over this process's 4"),
    (dict(rollout_devices=4, rollout_axes="pipeline=4"), r"unknown axis 'pipeline'"),
    (dict(rollout_devices=4, fsdp=3), r"the training mesh of 4 devices beside mesh.rollout_devices=4"),
])
def test_a_bad_split_names_the_field(changes, message):
    from paravt_jax.cli import assembly
    from paravt_jax.config import ConfigValueError
    from paravt_jax.configs import base

    config = base.get_config("tiny")
    config.mesh.update(changes)
    with pytest.raises(ConfigValueError, match=message):
        assembly.build_mesh(build_run(config))
        assembly.build_rollout_mesh(build_run(config))


def test_a_split_with_a_mesh_preset_is_refused_and_the_default_splits_4_plus_4():
    from paravt_jax.cli import assembly
    from paravt_jax.config import ConfigValueError
    from paravt_jax.configs import base

    config = base.get_config("tiny")
    config.mesh.rollout_devices = 4
    train, rollout = assembly.build_mesh(build_run(config)), assembly.build_rollout_mesh(build_run(config))
    assert dict(train.shape) == {"data": 1, "fsdp": 4, "tensor": 1}
    assert dict(rollout.shape) == {"data": 1, "fsdp": 1, "tensor": 4}
    assert not set(train.devices.flat) & set(rollout.devices.flat)
    config.mesh_preset = "gpu8"
    with pytest.raises(ConfigValueError, match="mesh_preset='gpu8'"):
        assembly.build_mesh(build_run(config))
