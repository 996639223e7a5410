"""Loaders, the shared loop (resume, SIGTERM, metrics), short SFT and RL runs."""
import dataclasses
import json
import os
import signal

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt_jax.agent.protocol import PromptFormat
from paravt_jax.agent.rollout import RolloutConfig
from paravt_jax.data import synthetic as syn
from paravt_jax.data.paravt_parquet import SchemaError, load_rl_rows, load_sft_rows
from paravt_jax.episodes.rewards import RewardConfig
from paravt_jax.eval.held_out import HeldOutConfig
from paravt_jax.models.qwen3_vl import init_model, preset
from paravt_jax.rl.advantages import AdvantageConfig
from paravt_jax.rl.trainer import RLConfig, periodic_evaluators, step_shapes, train_rl
from paravt_jax.sft.objective import HEAD, sft_loss
from paravt_jax.sft.trainer import SFTConfig, train_sft
from paravt_jax.text.tokenizer import train_tokenizer
from paravt_jax.train.loop import LoopConfig, data_indices, run_loop
from paravt_jax.train.step import OptimizerConfig, TrainStep
from support.tfevents import read_events


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("data"))
    ds = syn.write_dataset(root, num_train=4, num_eval=1, durations=(30.0,), seed=2, height=96, width=160)
    questions = list(ds.questions) + list(ds.eval_questions)
    return root, ds, train_tokenizer(syn.corpus(questions))


def test_loaders_skip_missing_videos_and_name_missing_columns(dataset, tmp_path, caplog):
    root, ds, _ = dataset
    rows, report = load_rl_rows(ds.rl_train, root)
    assert len(rows) == 4 and report.missing_videos == 0
    assert rows[0].question_type in ("mcq", "tvg", "oe") and os.path.isfile(rows[0].video_path)
    first = pq.read_table(ds.rl_train).to_pylist()[0]["videos"][0]["video"]
    assert rows[0].video_key == first and not os.path.isabs(first)  # the gating key: the table's path
    table = pq.read_table(ds.rl_train).to_pylist()
    table[1]["videos"] = [{"video": "videos/nope.mp4"}]
    table[2]["videos"] = [{"video": "file://" + os.path.join(root, table[2]["videos"][0]["video"])}]
    pq.write_table(pa.Table.from_pylist(table), tmp_path / "rl.parquet")
    rows, report = load_rl_rows(str(tmp_path / "rl.parquet"), root)
    assert len(rows) == 3 and report.missing_videos == 1 and report.examples[0].endswith("nope.mp4")
    assert "skipped 1 of 4 rows" in caplog.text
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "extra_info"} for r in table]),
                   tmp_path / "bad.parquet")
    with pytest.raises(SchemaError, match=r"bad.parquet: missing column\(s\) \['extra_info'\]"):
        load_rl_rows(str(tmp_path / "bad.parquet"), root)
    sft, report = load_sft_rows(ds.sft, root)
    assert len(sft) == report.rows and sft[0][0]["role"] == "system"
    assert report.kinds == tuple(r["kind"] for r in pq.read_table(ds.sft).to_pylist())  # the kind column
    pq.write_table(pq.read_table(ds.sft).drop(["kind"]), tmp_path / "plain.parquet")
    assert load_sft_rows(str(tmp_path / "plain.parquet"), root)[1].kinds == ("",) * len(sft)  # none: ""
    with pytest.raises(SchemaError, match="missing column"):
        load_sft_rows(ds.rl_train, root)


def test_sft_curriculum_draws_the_first_steps_from_the_named_kinds(tmp_path):
    from paravt_jax.data import events as ev
    from paravt_jax.sft.trainer import SFTConfig, curriculum_rows, step_rows

    ds = ev.write_events_dataset(str(tmp_path), num_train=4, num_eval=1, seed=5, duration=24.0,
                                 sft_modes=("subagent",), tool_free_share=0.0)
    rows, report = load_sft_rows(ds.sft, str(tmp_path))
    assert len(report.kinds) == len(rows) and set(report.kinds) == {"main_subagent", "subagent"}
    assert curriculum_rows(report.kinds, SFTConfig()) is None  # first_steps = 0: no curriculum
    first = curriculum_rows(report.kinds, SFTConfig(first_steps=3, first_kinds=("main_subagent",)))
    assert len(first) == 4 and all(report.kinds[i] == "main_subagent" for i in first)
    assert all(rows[i][0]["role"] == "system" for i in first)  # main trajectories open with the tool schema
    config = SFTConfig(first_steps=3, first_kinds=("main_subagent",), batch_size=3)
    drawn = [step_rows(i, config, len(rows), first) for i in range(6)]
    assert all(set(d) <= set(first) for d in drawn[:3])  # the curriculum's steps: main rows only
    assert {report.kinds[i] for d in drawn[3:] for i in d} == {"main_subagent", "subagent"}  # then all
    assert drawn[4] == step_rows(4, SFTConfig(batch_size=3), len(rows), None)  # the plain order after it
    with pytest.raises(ValueError, match=r"first_kinds \['tool_free'\] name no SFT row; .*main_subagent"):
        curriculum_rows(report.kinds, SFTConfig(first_steps=3, first_kinds=("tool_free",)))
    with pytest.raises(ValueError, match="needs sft.first_kinds"):
        curriculum_rows(report.kinds, SFTConfig(first_steps=3))
    # a K bound: the first phase keeps only the main rows drawn at K <= the bound
    from paravt_jax.sft.frames import example_nframes
    varied = SFTConfig(first_steps=3, first_kinds=("main_subagent",), nframes_choices=(4, 64))
    ks = {i: example_nframes(i, varied) for i in first}
    assert set(ks.values()) == {4, 64}  # this seed draws both at the four main rows
    bounded = curriculum_rows(report.kinds, dataclasses.replace(varied, first_max_nframes=16))
    assert bounded == [i for i in first if ks[i] == 4]
    with pytest.raises(ValueError, match=r"first_max_nframes=2 leaves no row of \['main_subagent'\]"):
        curriculum_rows(report.kinds, dataclasses.replace(varied, first_max_nframes=2))
    with pytest.raises(ValueError, match="first_max_nframes.*needs frame_sampling='count'"):
        SFTConfig(first_max_nframes=16, frame_sampling="fps")


def test_sft_overview_budget_per_row_follows_the_choices(tmp_path):
    from paravt_jax.data import events as ev
    from paravt_jax.data.sft_examples import FrameSpec, sft_inputs
    from paravt_jax.sft.frames import example_nframes

    assert {example_nframes(i, SFTConfig(nframes=6)) for i in range(20)} == {6}  # no choices: nframes
    config = SFTConfig(nframes=6, nframes_choices=(2, 4, 8), seed=1)
    drawn = [example_nframes(i, config) for i in range(60)]
    assert set(drawn) == {2, 4, 8} and drawn == [example_nframes(i, config) for i in range(60)]
    assert drawn != [example_nframes(i, SFTConfig(nframes_choices=(2, 4, 8), seed=2)) for i in range(60)]
    ds = ev.write_events_dataset(str(tmp_path), num_train=2, num_eval=1, seed=5, duration=24.0,
                                 sft_modes=("subagent",), tool_free_share=0.0)
    rows, report = load_sft_rows(ds.sft, str(tmp_path))
    main = rows[report.kinds.index("main_subagent")]
    tok = train_tokenizer(["<think> a b c </think>"])
    images = {k: len(sft_inputs(main, tok, str(tmp_path), FrameSpec(nframes=k)).image_grid_thw) for k in (2, 8)}
    assert images[8] - images[2] == 6  # the overview's frames are images; the crops' counts are fixed


def test_data_order_is_deterministic():
    a = data_indices(0, 10, 4, seed=3)
    assert a == data_indices(0, 10, 4, seed=3) and sorted(a[:4]) == [0, 1, 2, 3]
    assert data_indices(6, 4, 4, seed=3) == a[6:10]


def _toy_loop(workdir, steps, stop_after=None, signum=signal.SIGTERM):
    model = init_model(preset("tiny"), seed=0)
    step = TrainStep(model, OptimizerConfig(learning_rate=1e-3), sft_loss, HEAD)
    from paravt_jax.text.inputs import encode_ids
    from paravt_jax.train.batch import micro_batches, pack

    seqs = [encode_ids(list(range(1 + i, 20 + i)), 0, True) for i in range(8)]

    def step_fn(state, index):
        chosen = data_indices(index * 2, 2, len(seqs), 0)
        packed = pack([seqs[i] for i in chosen])
        if stop_after is not None and index == stop_after:
            os.kill(os.getpid(), signum)
        return step.step(state, micro_batches(packed, 1, model.config.vision))

    return run_loop("toy", workdir, step.init_state(), step_fn, LoopConfig(steps, async_checkpoints=False))


def logged_steps(workdir, tag="toy/loss"):
    """(metrics.jsonl steps, TensorBoard steps over every event file) of `tag`."""
    lines = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    events = sorted(f for f in os.listdir(os.path.join(workdir, "tensorboard")) if f.startswith("events.out.tfevents"))
    steps = sorted(s for f in events for s, v in read_events(os.path.join(workdir, "tensorboard", f)) if tag in v)
    return [l["step"] for l in lines if tag in l], steps


@pytest.mark.parametrize("signum", [signal.SIGTERM])  # SIGINT: tests/slow/test_training.py
def test_resume_is_bit_exact_and_a_signal_checkpoints_then_stops(tmp_path, signum):
    from paravt_jax.infra.preemption import Preempted

    straight = _toy_loop(str(tmp_path / "a"), 4)
    with pytest.raises(Preempted, match=f"{signal.Signals(signum).name}: checkpoint at step 2 of 4") as stopped:
        _toy_loop(str(tmp_path / "b"), 4, stop_after=1, signum=signum)  # the signal arrives during step 1
    assert stopped.value.exit_status == 128 + signum
    assert os.path.isdir(tmp_path / "b" / "checkpoints" / "2")
    assert signal.getsignal(signum) is not None and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    resumed = _toy_loop(str(tmp_path / "b"), 4)
    assert resumed.steps_done == 4 and len(resumed.history) == 2
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(straight.state.params),
                                                    jax.tree.leaves(resumed.state.params)))
    assert [h["loss"] for h in straight.history[2:]] == [h["loss"] for h in resumed.history]
    lines = [json.loads(l) for l in open(tmp_path / "a" / "metrics.jsonl")]
    assert [l["step"] for l in lines] == [0, 1, 2, 3] and "toy/loss" in lines[0]
    events = [f for f in os.listdir(tmp_path / "a" / "tensorboard") if f.startswith("events.out.tfevents")]
    parsed = read_events(str(tmp_path / "a" / "tensorboard" / events[0]))
    assert [s for s, v in parsed if "toy/loss" in v] == [0, 1, 2, 3]
    assert abs(parsed[1][1]["toy/loss"] - lines[0]["toy/loss"]) < 1e-5
    assert logged_steps(tmp_path / "b") == ([0, 1, 2, 3], [0, 1, 2, 3])


def test_resume_drops_metrics_logged_past_the_restored_step(tmp_path):
    """A kill between a step's metrics line and its checkpoint (here: steps 2 and 3 logged,
    the checkpoint at 2, a torn last line) must not leave those steps twice."""
    from paravt_jax.infra.checkpointing import Checkpointer
    from paravt_jax.infra.metrics_writer import MetricsWriter

    workdir = str(tmp_path / "run")
    _toy_loop(workdir, 2)
    stale = MetricsWriter(workdir, console=False)
    for step in (2, 3):
        stale.write(step, {"loss": 9.0}, prefix="toy/")
    stale.close()
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        f.write('{"step": 4, "toy/lo')
    assert Checkpointer(os.path.join(workdir, "checkpoints")).latest_step() == 2
    _toy_loop(workdir, 4)
    assert logged_steps(workdir) == ([0, 1, 2, 3], [0, 1, 2, 3])
    lines = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    assert all(l["toy/loss"] != 9.0 for l in lines)


def test_a_resume_in_the_same_second_truncates_the_earlier_event_file(tmp_path, monkeypatch):
    """Event files were named by the second and the host: a writer opened in the same second as
    the interrupted run's appended to its file, and resume() (which truncates the other files)
    left the stale steps there (seen as a flaky duplicate in the test above)."""
    from paravt_jax.infra import metrics_writer
    from paravt_jax.infra.metrics_writer import MetricsWriter

    monkeypatch.setattr(metrics_writer.time, "time", lambda: 1796400000.0)
    stale = MetricsWriter(str(tmp_path), console=False)
    stale.write(2, {"loss": 9.0}, prefix="toy/")
    stale.close()
    resumed = MetricsWriter(str(tmp_path), console=False)
    resumed.resume(2)
    resumed.write(2, {"loss": 1.0}, prefix="toy/")
    resumed.close()
    files = sorted(os.listdir(tmp_path / "tensorboard"))
    assert len(files) == 2
    values = [v["toy/loss"] for f in files for _, v in read_events(str(tmp_path / "tensorboard" / f))
              if "toy/loss" in v]
    assert values == [1.0]


def test_short_sft_lowers_its_loss(dataset, tmp_path):
    root, ds, tok = dataset
    rows, _ = load_sft_rows(ds.sft, root)
    _, result = train_sft(init_model(preset("tiny"), seed=1), tok, rows, root, str(tmp_path),
                          SFTConfig(steps=6, batch_size=4, nframes=2, max_pixels=64 * 96,
                                    optimizer=OptimizerConfig(learning_rate=3e-3, weight_decay=0.0)))
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0] - 0.3, losses


def test_sft_reads_each_row_at_its_drawn_overview_budget(dataset, tmp_path, monkeypatch):
    """train_sft builds every row's inputs at the K that example_nframes draws for it."""
    from paravt_jax.sft import trainer
    from paravt_jax.sft.frames import example_nframes

    root, ds, tok = dataset
    rows, _ = load_sft_rows(ds.sft, root)
    seen = {}

    def recording(row, tokenizer, video_root, frames):
        seen[next(i for i, r in enumerate(rows) if r is row)] = frames.nframes
        return real(row, tokenizer, video_root, frames)

    real = trainer.sft_inputs
    monkeypatch.setattr(trainer, "sft_inputs", recording)
    config = SFTConfig(steps=1, batch_size=4, nframes=2, nframes_choices=(1, 2, 3), max_pixels=64 * 96, seed=3,
                       optimizer=OptimizerConfig(learning_rate=1e-3, weight_decay=0.0))
    train_sft(init_model(preset("tiny"), seed=1), tok, rows, root, str(tmp_path), config)
    assert len(seen) == 4 and seen == {i: example_nframes(i, config) for i in seen}
    assert len(set(seen.values())) > 1  # seed 3 draws more than one K for these rows


def test_sft_with_fixed_shapes_compiles_one_step_program(dataset, tmp_path):
    """train_width + train_frames with token-budget micro-batches: every micro-batch has as many
    rows as the budget holds and the same padded frames, whatever each step's examples (here
    overviews of 1 to 3 frames), so no step after the first compiles (without full rows the steps
    whose rows or frames fall in another bucket compile)."""
    root, ds, tok = dataset
    rows, _ = load_sft_rows(ds.sft, root)
    config = SFTConfig(steps=8, batch_size=8, nframes=2, nframes_choices=(1, 2, 3), max_pixels=64 * 96, seed=1,
                       max_tokens_per_micro_batch=2 * 1024, train_width=1024, train_frames=64,
                       optimizer=OptimizerConfig(learning_rate=1e-3, weight_decay=0.0))
    _, result = train_sft(init_model(preset("tiny"), seed=1), tok, rows, root, str(tmp_path), config)
    assert result.history[0]["compiles"] > 0
    assert [h["compiles"] for h in result.history[1:]] == [0] * 7, [h["compiles"] for h in result.history]


def test_sft_trains_dense_tool_rows_as_direct_answers_when_asked(dataset, tmp_path, monkeypatch):
    """sft.direct_from_nframes: the rows drawn at K >= 3 that call the tool are read in their
    direct form, the others as they are."""
    from paravt_jax.data.sft_examples import direct_answer
    from paravt_jax.sft import trainer

    root, ds, tok = dataset
    rows, _ = load_sft_rows(ds.sft, root)
    seen = {}

    def recording(messages, tokenizer, video_root, frames):
        index = next(i for i, r in enumerate(rows) if r is messages or r[:2] == messages[:2])
        seen[index] = (frames.nframes, messages)
        return real(messages, tokenizer, video_root, frames)

    real = trainer.sft_inputs
    monkeypatch.setattr(trainer, "sft_inputs", recording)
    config = SFTConfig(steps=2, batch_size=8, nframes=2, nframes_choices=(1, 3), max_pixels=64 * 96, seed=3,
                       direct_from_nframes=3, optimizer=OptimizerConfig(learning_rate=1e-3, weight_decay=0.0))
    train_sft(init_model(preset("tiny"), seed=1), tok, rows, root, str(tmp_path), config)
    dense = [i for i, (k, _) in seen.items() if k == 3 and direct_answer(rows[i]) is not None]
    assert dense and any(k == 1 for k, _ in seen.values())
    for i, (_, messages) in seen.items():
        assert messages == (direct_answer(rows[i]) if i in dense else rows[i])


# here only the token-budget variant runs end to end, the others in tests/slow/test_training.py
# (the other RL-step tests here and the multi-host tests cover the rest); sequence anchors and
# gating off are unit-tested (test_advantages, test_gating)
@pytest.mark.parametrize("anchor_mode,gating,max_tokens", [("token", True, 1)])
def test_two_rl_steps(dataset, tmp_path, anchor_mode, gating, max_tokens):
    """Two RL steps; max_tokens=1: token-budget micro-batches (each row its own micro-batch,
    episodes packed into rows), with the padding fraction logged."""
    root, ds, tok = dataset
    rows, _ = load_rl_rows(ds.rl_train, root)
    config = RLConfig(steps=2, prompts_per_step=2, samples_per_prompt=2, nframes_gating=gating,
                      default_nframes=4, nframes_choices=(2, 4),
                      rollout=RolloutConfig(max_turns=1, max_new_tokens=12, subagent_max_tokens=8,
                                            prompt=PromptFormat(overview_max_pixels=64 * 96)),
                      reward=RewardConfig(), advantage=AdvantageConfig(anchor_mode=anchor_mode),
                      optimizer=OptimizerConfig(learning_rate=1e-4), max_tokens_per_micro_batch=max_tokens,
                      log_episodes=3)
    os.makedirs(tmp_path / "episodes")
    (tmp_path / "episodes" / "step_000005.jsonl").write_text("{}\n")  # left by an earlier, longer run
    _, result = train_rl(init_model(preset("tiny"), seed=2), tok, rows, str(tmp_path), config)
    assert sorted(os.listdir(tmp_path / "episodes")) == ["step_000000.jsonl", "step_000001.jsonl"]
    assert result.steps_done == 2 and len(result.history) == 2
    # the episode log: 3 of each step's 4 rollouts, both prompts first, with their rewards
    for step in (0, 1):
        with open(tmp_path / "episodes" / f"step_{step:06d}.jsonl") as f:
            records = [json.loads(line) for line in f]
        assert [(r["group"], r["sample"]) for r in records] == [(0, 0), (0, 1), (1, 0)]
        assert all(r["step"] == step and r["turns"] and r["overview_times"] for r in records)
        assert all(len(r["overview_times"]) == r["nframes"] for r in records)
        assert all(set(r["rewards"]) >= {"total", "acc_reward", "format_reward", "tool_reward"} for r in records)
        assert all(r["advantage"]["min"] <= r["advantage"]["mean"] <= r["advantage"]["max"] for r in records)
    from paravt_jax.experiments.view import render

    pages = render(str(tmp_path))  # an RL-only workdir: episodes/ beside metrics.jsonl
    assert pages["episodes"] == 6 and len(pages["pages"]) == 2
    assert pages["thumbnails"] > 0 and not pages["missing_videos"]
    for h in result.history:
        assert h["rollouts"] == 4 and np.isfinite(h["loss"]) and not h["skipped"]
        assert 0 <= h["padding_fraction"] < 1
        drawn = {k for k in h if k.startswith("nframes_")}
        assert drawn <= ({"nframes_2", "nframes_4"} if gating else {"nframes_4"})
        assert ("anchor/positions" in h) == (anchor_mode == "token")


# run by tests/slow/test_training.py (~57 s; the shared layout's step equality runs here by default:
# tests/integration/test_shared_prompts.py)
def shared_prompts_train_on_the_same_episodes(dataset, tmp_path):
    """rl.share_prompts end to end: the first step (the same policy, so the same rollouts) scores
    the same rewards and trains the same tokens as with each episode whole, and logs the prompt
    tokens it did not compute again on fewer row slots; the second step runs. (The
    gradients' equality is tests/integration/test_shared_prompts.py's: in this tiny run every
    sample of a prompt earns the same reward, so the normalised advantages are rounding noise.)"""
    root, ds, tok = dataset
    rows, _ = load_rl_rows(ds.rl_train, root)
    results = {}
    for share in (False, True):  # the whole episodes' first step is the comparison's
        config = RLConfig(steps=2 if share else 1, prompts_per_step=2, samples_per_prompt=3, default_nframes=4,
                          nframes_choices=(4,),
                          rollout=RolloutConfig(max_turns=1, max_new_tokens=12, subagent_max_tokens=8,
                                                prompt=PromptFormat(overview_max_pixels=64 * 96)),
                          optimizer=OptimizerConfig(learning_rate=1e-4), max_tokens_per_micro_batch=4096,
                          share_prompts=share)
        _, result = train_rl(init_model(preset("tiny"), seed=2), tok, rows, str(tmp_path / str(share)), config)
        results[share] = result.history
    whole, shared = results[False][0], results[True][0]
    for key in ("reward", "acc_reward", "format_reward", "loss_tokens", "rollouts", "kappa"):
        assert shared[key] == whole[key], key
    assert shared["loss_tokens"] > 0 and np.isfinite(shared["loss"]) and not shared["skipped"]
    assert shared["shared_prompt_tokens"] > 0 and "shared_prompt_tokens" not in whole
    assert shared["padding_fraction"] > whole["padding_fraction"]  # the same rows, fewer tokens in them
    assert len(results[True]) == 2 and not results[True][1]["skipped"]


def test_periodic_evaluation_uses_the_rollout_mode_and_logs_its_episodes(dataset, tmp_path, monkeypatch):
    """The held-out check during RL runs episodes as the rollouts do (here: subagent), on the
    first `limit` held-out rows, with and without tools, logs both, and (with episode
    logging on) writes every episode it ran to eval_episodes/step_XXXXXX.jsonl."""
    import dataclasses

    from paravt_jax.eval import held_out as evaluate_module

    root, ds, tok = dataset
    rows, _ = load_rl_rows(ds.rl_train, root)
    calls = []
    real = evaluate_module.evaluate_episodes

    def recording(sampler, tokenizer, eval_rows, **kwargs):
        calls.append((len(eval_rows), kwargs["tools"], kwargs["rollout"].mode, kwargs["nframes"]))
        return real(sampler, tokenizer, eval_rows, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate_episodes", recording)
    config = dataclasses.replace(_rl_config(1), eval_every=1, evals={"eval": HeldOutConfig(nframes=(2, 4), limit=1)},
                                 log_episodes=1)
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, mode="subagent"))
    os.makedirs(tmp_path / "eval_episodes")
    (tmp_path / "eval_episodes" / "step_000003.jsonl").write_text("{}\n")  # left by an earlier, longer run
    _, result = train_rl(init_model(preset("tiny"), seed=2), tok, rows, str(tmp_path), config,
                         evaluators=periodic_evaluators(config, rows[-2:]))
    assert calls == [(1, False, "subagent", 2), (1, True, "subagent", 2), (1, False, "subagent", 4),
                     (1, True, "subagent", 4)]
    record = result.history[0]
    assert record["eval_tools/samples"] == 1 and "eval_notools/accuracy" in record  # the first K
    assert record["eval_tools_K4/samples"] == 1 and "eval_notools_K4/accuracy" in record
    assert not any(key.startswith("eval_tools_K2") for key in record)
    assert os.listdir(tmp_path / "eval_episodes") == ["step_000000.jsonl"]
    with open(tmp_path / "eval_episodes" / "step_000000.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert [(r["step"], r["stage"], r["nframes"], r["tools"], r["episode_id"]) for r in records] == [
        (0, "periodic", k, tools, f"eval{rows[-2].index}") for k in (2, 4) for tools in (False, True)]
    assert all(len(r["overview_times"]) == r["nframes"] and r["turns"] and set(r["rewards"]) == {"acc_reward"}
               for r in records)
    # one question: its reward is the accuracy
    assert [r["rewards"]["acc_reward"] for r in records] == [
        record[f"{tag}/accuracy"] for tag in ("eval_notools", "eval_tools", "eval_notools_K4", "eval_tools_K4")]


def test_held_out_settings_evaluated_at_once_equal_one_at_a_time(dataset):
    """`concurrent`: the held-out settings run two at a time in threads on one sampler give the
    outcomes of one at a time (metrics and episodes), in the settings' order; 0 is refused."""
    from paravt_jax.config import ConfigValueError
    from paravt_jax.eval.evaluator import evaluate
    from paravt_jax.eval.held_out import HeldOut

    root, ds, tok = dataset
    rows, _ = load_rl_rows(ds.rl_train, root)
    model = init_model(preset("tiny"), seed=2)
    rollout = dataclasses.replace(_rl_config(1).rollout, mode="subagent", max_new_tokens=8, subagent_max_tokens=8)

    def outcomes(concurrent):
        held_out = HeldOut.grid(rows[:2], (2, 4), tools_major=True, rollout=rollout, max_turns=1,
                                concurrent=concurrent)
        return [(o.name, o.metrics, o.records) for o in evaluate([held_out], model, tok)]

    one = outcomes(1)
    assert [name for name, _, _ in one] == ["eval_notools", "eval_notools_K4", "eval_tools", "eval_tools_K4"]
    assert outcomes(2) == one and all(records for _, _, records in one)
    with pytest.raises(ConfigValueError, match="concurrent"):
        HeldOutConfig(concurrent=0)


def test_no_program_compiles_after_the_second_step_nor_in_later_evaluations(dataset, tmp_path):
    """16 RL steps whose tool responses sometimes need two prefill pieces (a piece of 16 tokens)
    and a held-out check every 4 steps: the steps compile nothing after step 1 and the checks
    nothing after the first (each once reused the rollouts' fixed shapes, the other picked
    its own buckets and compiled when a longer episode came)."""
    import dataclasses

    from paravt_jax.rl.shapes import ShapeConfig

    root, ds, tok = dataset
    rows, _ = load_rl_rows(ds.rl_train, root)
    config = dataclasses.replace(_rl_config(16), eval_every=4, evals={"eval": HeldOutConfig(nframes=(4,), limit=2)},
                                 shapes=ShapeConfig(extend_width=16))
    check = periodic_evaluators(config, rows[-2:])[0]  # the held-out check: the rollouts' shapes
    assert check.rollout.prompt_shape == step_shapes(config, 2).prompt and check.rollout.prompt_shape.width
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, max_turns=2))
    _, result = train_rl(init_model(preset("tiny"), seed=2), tok, rows, str(tmp_path), config,
                         evaluators=periodic_evaluators(config, rows[-2:]))
    steps = result.history
    assert len(steps) == 16 and steps[0]["compiles"] > 0
    assert [h["compiles"] for h in steps[2:]] == [0] * 14, [h["compiles"] for h in steps]
    checks = [h["eval_compiles"] for h in steps if "eval_compiles" in h]
    assert len(checks) == 4 and checks[0] > 0 and checks[1:] == [0, 0, 0], checks


def test_consecutive_non_finite_steps_stop_the_run(tmp_path):
    from paravt_jax.train.loop import NonFiniteError

    calls = []

    def step_fn(state, index):
        calls.append(index)
        return state, {"loss": float("nan"), "skipped": index >= 1}

    with pytest.raises(NonFiniteError, match="3 consecutive non-finite steps, the last at step 3"):
        run_loop("nan", str(tmp_path), {"w": np.zeros(2)}, step_fn,
                 LoopConfig(steps=10, max_bad_steps=3, async_checkpoints=False))
    assert calls == [0, 1, 2, 3]


def bigram_policy(tokenizer, text: str, seed: int = 2):
    """The tiny model made into a deterministic bigram policy that writes `text` right after the
    think-prefixed generation prompt: attention and MLP outputs are zeroed (the last hidden
    state is the current token's embedding) and the lm head maps each token of the chain to
    its successor (logit margin ~50, so sampling at temperature 0.7 follows the chain)."""
    import jax.numpy as jnp

    from paravt_jax.agent.protocol import THINK_PREFIX
    from paravt_jax.text import chat
    from paravt_jax.text.inputs import encode

    model = init_model(preset("tiny"), seed=seed)
    tail = int(encode(chat.render([], add_generation_prompt=True, assistant_prefix=THINK_PREFIX),
                      tokenizer).input_ids[-1])
    chain = [tail] + tokenizer.encode(text) + [tokenizer.special.im_end]
    assert len(set(chain)) == len(chain), "a bigram chain needs distinct tokens"
    lang = model.language
    for name in ("o_proj", "down_proj"):
        lang.layers[name].value = jnp.zeros_like(lang.layers[name].value)
    embed = np.asarray(lang.embed_tokens.value)
    head = np.zeros(lang.lm_head.value.shape, np.float32)
    for current, successor in zip(chain, chain[1:]):
        head[:, successor] = 8.0 * embed[current] / np.linalg.norm(embed[current])
    lang.lm_head.value = jnp.asarray(head)
    return model


def test_rl_step_logs_the_anchor_of_forced_think_turns(dataset, tmp_path):
    """Rollouts that close the forced <think> block log R_anchor of a closed substantive think
    (0.4) and a non-zero format reward (the released scoring gives 0 to both: see
    test_turn_texts_carry_the_forced_prefix_and_the_anchor_lands_on_generated_tags)."""
    root, ds, tok = dataset
    rows, _ = load_rl_rows(ds.rl_train, root)
    text = "The red square moves</think>"
    config = RLConfig(steps=1, prompts_per_step=2, samples_per_prompt=2, nframes_gating=False, default_nframes=2,
                      rollout=RolloutConfig(max_turns=1, max_new_tokens=12,
                                            prompt=PromptFormat(overview_max_pixels=64 * 96)),
                      reward=RewardConfig(), advantage=AdvantageConfig(anchor_mode="token"),
                      optimizer=OptimizerConfig(learning_rate=1e-4))
    _, result = train_rl(bigram_policy(tok, text), tok, rows, str(tmp_path), config)
    (h,) = result.history
    assert h["anchor_reward"] == pytest.approx(0.4) and np.isfinite(h["loss"]) and not h["skipped"]
    assert h["format_reward"] == pytest.approx(0.3)  # think .2 + balanced .1 (anchor: token mode)
    assert h["format_compliance"] == 0.0 and h["response_length"] == len(tok.encode(text)) + 1


def _rl_config(steps):
    return RLConfig(steps=steps, prompts_per_step=2, samples_per_prompt=2, default_nframes=4, nframes_choices=(2, 4),
                    rollout=RolloutConfig(max_turns=1, max_new_tokens=12, subagent_max_tokens=8,
                                          prompt=PromptFormat(overview_max_pixels=64 * 96)),
                    optimizer=OptimizerConfig(learning_rate=1e-4))


def test_an_rl_step_with_no_readable_video_is_skipped_and_named(dataset, tmp_path, capsys):
    import dataclasses

    root, ds, tok = dataset
    rows, _ = load_rl_rows(ds.rl_train, root)
    first_step = data_indices(0, 2, len(rows), 0)
    rows = [dataclasses.replace(r, video_path=str(tmp_path / f"gone{i}.mp4")) if i in first_step else r
            for i, r in enumerate(rows)]
    _, result = train_rl(init_model(preset("tiny"), seed=2), tok, rows, str(tmp_path / "run"), _rl_config(2))
    assert result.steps_done == 2 and result.history[0]["unreadable_step"] == 1.0
    assert result.history[1]["rollouts"] == 4 and np.isfinite(result.history[1]["loss"])
    warned = [line for line in capsys.readouterr().err.splitlines() if "[rl] step 0 skipped" in line]
    assert len(warned) == 1 and warned[0].startswith("W") and all(f"gone{i}.mp4" in warned[0] for i in first_step)


def test_a_whole_unreadable_epoch_stops_rl_with_a_clear_error(dataset, tmp_path):
    import dataclasses

    from paravt_jax.train.loop import UnreadableDataError

    root, ds, tok = dataset
    rows, _ = load_rl_rows(ds.rl_train, root)
    rows = [dataclasses.replace(r, video_path=str(tmp_path / f"gone{i}.mp4")) for i, r in enumerate(rows)]
    message = r"no video could be read for 4 prompts in a row \(the dataset has 4\)"
    with pytest.raises(UnreadableDataError, match=message):
        train_rl(init_model(preset("tiny"), seed=2), tok, rows, str(tmp_path / "run"), _rl_config(5))


def test_fill_batch_repeats_the_readable_examples():
    from paravt_jax.sft.trainer import fill_batch

    assert fill_batch(["a", "b", "c"], 5) == ["a", "b", "c", "a", "b"] and fill_batch(["a"], 2) == ["a", "a"]


def test_sft_skips_and_counts_unreadable_examples_and_checkpoints_periodically(dataset, tmp_path, capsys):
    import copy

    root, ds, tok = dataset
    rows, _ = load_sft_rows(ds.sft, root)
    rows = copy.deepcopy(rows[:4])
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video at all" * 100)
    for turn in rows[1]:  # every video of example 1 now points at an unreadable file
        for item in turn["content"] if isinstance(turn["content"], list) else []:
            if item.get("type") == "video_url":
                item["video_url"]["url"] = str(broken)
    config = SFTConfig(steps=2, batch_size=4, nframes=2, max_pixels=64 * 96, checkpoint_every=1,
                       optimizer=OptimizerConfig(learning_rate=1e-3, weight_decay=0.0))
    _, result = train_sft(init_model(preset("tiny"), seed=1), tok, rows, root, str(tmp_path / "sft"), config)
    assert [h["skipped_examples"] for h in result.history] == [1, 1]
    assert all(np.isfinite(h["loss"]) for h in result.history)
    warned = [line for line in capsys.readouterr().err.splitlines() if "[sft] example 1 skipped" in line]
    assert warned and all(line.startswith("W") and "broken.mp4" in line for line in warned)
    assert sorted(os.listdir(tmp_path / "sft" / "checkpoints")) == ["1", "2"]  # sft.checkpoint_every=1


def test_precompile_compiles_the_first_step_ahead_and_changes_no_result(dataset, tmp_path):
    """rl.precompile: the first step's programs are compiled before it (decoded rollouts dropped,
    gradients run, the donated update compiled ahead of time), so the step itself compiles
    nothing, and every metric of the run is the one it has without precompiling (same seed)."""
    import dataclasses

    root, ds, tok = dataset
    rows, _ = load_rl_rows(ds.rl_train, root)
    timing = ("_s", "compiles", "compiles_total", "tokens_per_s", "precompiles")
    runs = {}
    for precompile in (True, False):  # precompiling first: its compiles are not the other run's
        config = dataclasses.replace(_rl_config(2), precompile=precompile)
        _, result = train_rl(init_model(preset("tiny"), seed=2), tok, rows, str(tmp_path / f"{precompile}"), config)
        runs[precompile] = result.history
    first = runs[True][0]
    assert first["precompiles"] > 0 and first["precompile_s"] > 0 and first["compiles"] == 0, first
    assert "precompiles" not in runs[True][1] and "precompiles" not in runs[False][0]
    strip = lambda history: [{k: v for k, v in h.items() if not k.endswith(timing)} for h in history]
    assert strip(runs[True]) == strip(runs[False])
