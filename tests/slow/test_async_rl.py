"""The asynchronous rollouts' slow end-to-end checks (tests/integration/test_async_rl.py runs the
others by default): the bounded-staleness run at bound 2 (bound 1 runs by default), a split mesh
at staleness 0 reproduces the colocated synchronous run (two 2-step runs on 8 fake devices), and
a slow crop does not stall the trainer while steps are queued (three steps with crops 1.5 s
slower)."""
import time

import jax
import numpy as np
import pytest
from flax import nnx

from integration import test_async_rl as integration_tests
from integration.test_async_rl import logged, rl_config, run, without_timing
from paravt_jax.agent import dispatch
from paravt_jax.data.paravt_parquet import RLRow
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.rl.advantages import AdvantageConfig
from paravt_jax.rl.trainer import RLConfig, train_rl
from paravt_jax.text.tokenizer import train_tokenizer
from paravt_jax.train.step import OptimizerConfig

dataset = integration_tests.dataset  # the fixture


@pytest.mark.parametrize("bound", [2])
def test_bounded_staleness_on_4_plus_4_devices_and_a_sigterm_rerun_repeats_nothing(dataset, tmp_path, bound):
    integration_tests.test_bounded_staleness_on_4_plus_4_devices_and_a_sigterm_rerun_repeats_nothing(
        dataset, tmp_path, bound)


def test_a_split_mesh_at_staleness_0_is_the_colocated_synchronous_run(dataset, tmp_path):
    """Same seed, 2 steps: colocated on fsdp=8 vs training on fsdp=4 and sampling on tensor=4.
    The same episodes are sampled (ids, samples, turns) and most of their texts are the same;
    metrics and parameters agree up to float reduction order (the meshes sum in different
    orders): metrics within rel 5e-3 / abs 5e-3 (step 0's rewards are all equal, so its
    advantages and gradients are float noise, 1e-11 and 3e-3), parameters within 5e-4 (Adam
    turns that noise into learning-rate-sized moves: 2 steps at 1e-4). Texts are not all equal:
    the random tiny model's next-token distribution is nearly flat, so the tensor-parallel
    logits' other summation order can change a sampled token (seen with the packages of
    2026-12-04's lock, at the same commit that passed with the day before's)."""
    rows, tok = dataset
    config = rl_config(2, log_episodes=4)
    model_a, colocated = run(rows, tok, tmp_path / "colocated", config, 0)
    model_b, split = run(rows, tok, tmp_path / "split", config, 4)
    same = total = 0
    for step in (0, 1):
        name = f"step_{step:06d}.jsonl"
        ours, theirs = (logged(tmp_path / arm / "episodes" / name) for arm in ("colocated", "split"))
        assert [key for key, _ in ours] == [key for key, _ in theirs]
        same += sum(a == b for (_, a), (_, b) in zip(ours, theirs))
        total += len(ours)
    assert total == 8 and same >= total - 2, f"{same} of {total} logged episodes sampled the same text"
    a, b = without_timing(colocated.history), without_timing(split.history)
    assert [sorted(h) for h in a] == [sorted(h) for h in b]
    for step_a, step_b in zip(a, b):
        for key, value in step_a.items():
            assert step_b[key] == pytest.approx(value, rel=5e-3, abs=5e-3), key
    assert [h["staleness"] for h in split.history] == [0, 0] and "staleness" not in colocated.history[0]
    leaves = [jax.tree.leaves(jax.tree.map(np.asarray, nnx.state(m, nnx.Param))) for m in (model_a, model_b)]
    assert max(float(np.abs(x - y).max()) for x, y in zip(*leaves, strict=True)) < 5e-4


def test_a_slow_crop_does_not_stall_the_trainer_while_steps_are_queued(tmp_path, monkeypatch):
    """Scripted turns that call crop_video, each crop 1.5 s slower: at staleness 2 the trainer
    takes the later steps from the queue without waiting for their crops (the time it waited
    is less than their rollouts took by at least one crop's sleep; a synchronous step waits
    for all of its rollout)."""
    from paravt_jax.data.events import Event
    from paravt_jax.data.synthetic import write_video
    from support.scripted import ScriptedSampler
    from unit.test_orchestration import rl_script

    video = write_video(str(tmp_path / "circle.mp4"), 40.0, [Event(10.0, 14.0, "blue", "circle")], fps=4.0,
                        height=96, width=128, seed=1)
    texts = [t for s in [rl_script("What colour", g) for g in range(4)] + [rl_script("shape", 0)] for t in s]
    tok = train_tokenizer((texts + ["What colour is the circle? What shape is it?"]) * 10)
    rows = [RLRow(0, "What colour is the circle?", video, "blue", "oe", {}),
            RLRow(1, "What shape is it?", video, "circle", "oe", {})]
    read = dispatch.read_frames
    sleep = 1.5

    def slow_read(*args, **kwargs):
        time.sleep(sleep)
        return read(*args, **kwargs)

    monkeypatch.setattr(dispatch, "read_frames", slow_read)
    config = RLConfig(steps=3, prompts_per_step=2, samples_per_prompt=4, nframes_gating=False, default_nframes=2,
                      seed=3, max_staleness=2, advantage=AdvantageConfig(kl_ctl=0.0),
                      optimizer=OptimizerConfig(learning_rate=1e-4))
    _, result = train_rl(init_model(preset("tiny"), seed=2), tok, rows, str(tmp_path / "run"), config,
                         make_sampler=lambda model, sampler_config: ScriptedSampler(tok, rl_script))
    history = result.history
    assert all(h["rollout_s"] >= sleep for h in history)  # every step ran a slow crop
    queued = history[1:]
    assert sum(h["data_wait_s"] for h in queued) <= sum(h["rollout_s"] for h in queued) - sleep, queued
    assert any(h["queue_depth"] >= 1 and h["data_wait_s"] < 0.05 for h in queued), queued
