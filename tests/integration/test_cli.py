import io
import os
import re
import subprocess
from contextlib import redirect_stderr, redirect_stdout

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli_logged(*args) -> tuple[str, str]:
    """(stdout, stderr) of `paravt-jax ARGS`: the command's output, and its log lines."""
    from paravt_jax.cli import main

    out, log = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(log):
        status = main(["paravt-jax", *args])
    assert status == 0, (out.getvalue() + log.getvalue())[-2000:]
    return out.getvalue(), log.getvalue()


def run_cli(*args) -> str:
    return run_cli_logged(*args)[0]


def test_forward_main_job_with_overrides(builtin_root):
    text = run_cli("forward", f"--config={ROOT}/configs/base.py:tiny",
                   f"--config.data.builtin_root={builtin_root}", "--config.demo.frames=4",
                   "--config.demo.repeats=2")
    assert "True" in text.split("logits_finite")[1].splitlines()[0]
    assert "(4 overview frames)" in text
    assert builtin_root in text
    assert "(1, 1000)" not in text and ", 1000)" in text.split("logits")[1].splitlines()[0]


def test_launch_scripts_dry_run():
    env = dict(os.environ, DRY_RUN="1")
    out = subprocess.run(["bash", f"{ROOT}/launch/local.sh"], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "python -m paravt_jax.cli run --config=configs/paragrpo.py:toy"
    out = subprocess.run(["bash", f"{ROOT}/launch/local.sh", "forward"], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.strip() == "python -m paravt_jax.cli forward --config=configs/base.py:tiny"
    out = subprocess.run(["bash", f"{ROOT}/launch/local.sh", "forward", "--config=configs/base.py:small125m"],
                         capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "python -m paravt_jax.cli forward --config=configs/base.py:small125m"


def test_configs_load_with_presets_and_overrides():
    import importlib

    from ml_collections import config_flags  # noqa: F401

    for name in ("paragrpo", "vanilla_grpo", "sft"):
        module = importlib.import_module(f"paravt_jax.configs.{name}")
        for preset in ("tiny", "qwen3vl_2b", "qwen3vl_8b"):
            c = module.get_config(preset)
            assert c.rl.samples_per_prompt >= 2
        if name == "vanilla_grpo":
            assert c.rl.advantage.anchor_weight == 0.0 and not c.rl.nframes_gating
            assert not c.rl.rollout.prompt.think_prefix
    assert module.get_config("qwen3vl_8b").rl.steps == 0  # sft.py: RL off


def test_unknown_command_and_field_are_refused(builtin_root, capsys):
    from paravt_jax.cli import main

    assert main(["paravt-jax", "fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err
    argv = ["paravt-jax", "forward", f"--config={ROOT}/configs/base.py:tiny", "--config.model.no_such_field=1"]
    assert main(argv) == 2
    assert "no_such_field" in capsys.readouterr().err


def test_main_job_end_to_end_then_export(builtin_root, tmp_path):
    """A miniature of README command 1: SFT, RL (with a periodic eval), evaluation table,
    curves PNG, final HF checkpoint; then `export` restores the RL checkpoint."""
    import json

    from paravt_jax.infra import reproducibility
    from paravt_jax.models.qwen3_vl import load_pretrained

    workdir = str(tmp_path / "run")
    common = [f"--config={ROOT}/configs/paragrpo.py:tiny", f"--workdir={workdir}",
              f"--config.data.builtin_root={builtin_root}"]
    text, log = run_cli_logged("run", *common, "--config.sft.steps=2", "--config.sft.batch_size=2",
                               "--config.sft.nframes=2", "--config.sft.train_frames=8", "--config.rl.steps=1",
                               "--config.rl.samples_per_prompt=2",
                               "--config.rl.prompts_per_step=1", "--config.rl.rollout.max_new_tokens=8",
                               "--config.rl.rollout.max_turns=1",
                               "--config.rl.rollout.subagent_max_tokens=8", "--config.rl.eval_every=1",
                               "--config.evals.held_out.limit=1", "--config.evals.held_out.max_new_tokens=8",
                               "--config.evals.held_out.max_turns=1",
                               "--config.evals.held_out.after_sft=(4,)")
    assert "| tools | K | accuracy |" in text and "| yes | 64 |" in text
    assert "[run] after SFT:" in text and "[run] after RL:" in text
    # the tables are the output (stdout); progress goes to the log (stderr), one format
    assert "| tools |" not in log and "[rl/ 0/1]" not in text
    assert re.search(r"^I\d{4} \d\d:\d\d:\d\d \[run\] done in .* min; final model", log, re.M), log[-2000:]
    assert re.search(r"^I\d{4} \d\d:\d\d:\d\d \[rl/ 0/1\] loss ", log, re.M), log[-2000:]
    summary = json.load(open(f"{workdir}/summary.json"))
    assert [(r["tools"], r["nframes"]) for r in summary["eval_after_sft"]] == [(False, 4), (True, 4)]
    assert summary["eval_after_sft"] == json.load(open(f"{workdir}/sft/eval.json"))["results"]
    assert os.path.isfile(summary["curves"]) and summary["curves"].endswith(".png")
    # what produced the run (paravt_jax/infra/reproducibility.py), in its summary and its config file
    manifest = summary["manifest"]
    for field in ("commit", "dirty", "lock", "packages", "python", "platform", "device", "cpu", "xla_flags",
                  "data", "seed"):
        assert field in manifest, field
    assert manifest["data"]["content"] and manifest["seed"] == 0 and manifest["packages"]["jax"]
    assert manifest["cpu"]["xla_threads"] and manifest["cpu"]["usable"] >= 1
    assert reproducibility.differences(manifest, json.load(open(f"{workdir}/run_config.json"))["manifest"]) == []
    assert len(summary["sft_loss"]) == 2 and len(summary["eval"]) == 4
    rl_lines = [json.loads(l) for l in open(f"{workdir}/rl/metrics.jsonl")]
    assert "rl/eval_tools/accuracy" in rl_lines[0] and "rl/kappa" in rl_lines[0]
    assert load_pretrained(f"{workdir}/final").config.text.hidden_size == 64
    # the episode logs: the RL step's 2 rollouts; each held-out setting's episode (2 after SFT, 4 final)
    steps = [json.loads(line) for line in open(f"{workdir}/rl/episodes/step_000000.jsonl")]
    assert [(r["step"], r["sample"]) for r in steps] == [(0, 0), (0, 1)]
    evaluated = [json.loads(line) for line in open(f"{workdir}/eval/episodes.jsonl")]
    assert [(r["stage"], r["tools"], r["nframes"]) for r in evaluated] == [
        ("after_sft", False, 4), ("after_sft", True, 4), ("final", False, 4), ("final", False, 64),
        ("final", True, 4), ("final", True, 64)]
    assert "[view] 8 episodes" in run_cli_logged("view", workdir)[1]
    assert os.path.isfile(f"{workdir}/view/step_000000.html") and os.path.isfile(f"{workdir}/view/eval.html")
    _, log = run_cli_logged("export", *common)
    assert f"-> {workdir}/export" in log and os.path.isfile(f"{workdir}/export/model.safetensors")


def test_mesh_preset_builds_the_named_mesh(builtin_root):
    import jax
    from flax import nnx

    from paravt_jax.cli.assembly import build_model
    from paravt_jax.configs import paragrpo
    from paravt_jax.run_config import build_run, builtin_assets

    config = paragrpo.get_config("tiny")
    config.data.builtin_root = builtin_root
    config.mesh_preset = "gpu8_tp2"
    model = build_model(build_run(config), default_dir=builtin_assets(build_run(config)).model_dir)
    meshes = {tuple(x.sharding.mesh.shape.items()) for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert meshes == {(("data", 1), ("fsdp", 4), ("tensor", 2))}
    config.mesh_preset = "v9-8"
    with pytest.raises(KeyError, match="v9-8"):
        build_model(build_run(config))


def test_after_sft_evaluation_is_stored_and_read_back_on_resume(tmp_path, monkeypatch):
    """The cold start's table is evaluated once (sft/eval.json) and read back by a resumed run,
    unless the evaluation settings (other than how many run at once) or the SFT step count
    changed since."""
    from paravt_jax.cli import jobs
    from paravt_jax.configs import paragrpo
    from paravt_jax.eval.evaluator import Outcome
    from paravt_jax.eval.held_out import EvalResult
    from paravt_jax.run_config import build_run

    calls = []

    def fake_evaluate_all(config, model, tokenizer, eval_rows, stage="final", **episode_log):
        nframes = tuple(config.evals["held_out"].after_sft)  # config: the RunConfig
        calls.append((stage, nframes))
        return [Outcome("eval", {}, {}, EvalResult(tools, k, 0.5 + len(calls), 1.0, 1.0, 2.0, len(eval_rows), 1.0))
                for tools in (False, True) for k in nframes]

    monkeypatch.setattr(jobs, "evaluate_all", fake_evaluate_all)
    config = paragrpo.get_config("tiny")
    config.evals.held_out.after_sft = (4, 16)
    workdir = str(tmp_path)
    first = jobs.evaluate_after_sft(build_run(config), None, None, ["row"], workdir)
    assert calls == [("after_sft", (4, 16))] and len(first) == 4 and os.path.isfile(f"{workdir}/sft/eval.json")
    assert jobs.evaluate_after_sft(build_run(config), None, None, ["row"], workdir) == first and len(calls) == 1
    config.evals.held_out.concurrent = 2  # speed only: still the stored table
    assert jobs.evaluate_after_sft(build_run(config), None, None, ["row"], workdir) == first and len(calls) == 1
    config.evals.held_out.limit = 3  # other settings: the stored table is not theirs
    again = jobs.evaluate_after_sft(build_run(config), None, None, ["row"], workdir)
    assert len(calls) == 2 and again[0]["accuracy"] != first[0]["accuracy"]
    config.sft.steps += 100  # a longer SFT in the same workdir: another cold start
    jobs.evaluate_after_sft(build_run(config), None, None, ["row"], workdir)
    assert len(calls) == 3


def test_reward_trend_compares_the_first_and_last_third():
    from paravt_jax.cli.jobs import reward_trend

    assert reward_trend([0.1, 0.2]) is None  # under three steps: no thirds
    trend = reward_trend([0.1, 0.2, 0.0, 0.5, 0.4, 0.6, 0.9])  # thirds of 2 steps
    assert trend["per_third"] == 2 and trend["steps"] == 7
    assert trend["first"] == 0.15 and trend["last"] == 0.75 and trend["change"] == 0.6
    assert reward_trend([1.0, 0.0, 0.0])["change"] == -1.0  # a falling reward reads negative


def test_held_out_and_generate_episodes_are_the_configs():
    """The held-out evaluation and `generate` run the RL episode of the config (sub-agent summary
    budget, overview and crop frame sizes, think prefix, calls per turn), decoded greedily; the
    evaluation's own budget (evals.held_out.max_new_tokens, max_turns, mode) is the only change."""
    from paravt_jax.cli.jobs import generate_episode
    from paravt_jax.configs import paragrpo, vanilla_grpo
    from paravt_jax.eval.held_out import FINAL_ANSWER_TOKENS, episode_config
    from paravt_jax.run_config import build_run

    config = paragrpo.get_config("toy")
    config.rl.dispatch.max_parallel, config.rl.dispatch.max_frames = 3, 6
    e, rl = build_run(config).evals["held_out"], build_run(config).rl
    tools = episode_config(rl.rollout, tools=True, max_new_tokens=e.max_new_tokens, max_turns=e.max_turns,
                           mode=e.mode)
    assert (tools.subagent_max_tokens, tools.prompt.overview_max_pixels, tools.temperature) == (32, 96 * 160, 0.0)
    assert (tools.max_new_tokens, tools.max_turns, tools.mode) == (160, 2, "subagent")
    assert tools.protocol.final_answer and tools.protocol.final_answer_tokens == FINAL_ANSWER_TOKENS
    assert tools.prompt.think_prefix and tools.prompt.tools
    plain = episode_config(rl.rollout, tools=False)
    assert plain.max_turns == 0 and not plain.prompt.tools and not plain.protocol.final_answer
    rollout, dispatch = generate_episode(build_run(config))
    assert dataclasses_equal_but_temperature(rollout, rl.rollout) and rollout.temperature == 0.0
    assert (dispatch.max_pixels, dispatch.max_parallel, dispatch.max_frames) == (96 * 160, 3, 6)
    baseline = build_run(vanilla_grpo.get_config("tiny")).rl.rollout  # no think prefix in the baseline's episodes
    assert not episode_config(baseline, tools=True).prompt.think_prefix


def dataclasses_equal_but_temperature(a, b) -> bool:
    import dataclasses

    return dataclasses.replace(a, temperature=0.0) == dataclasses.replace(b, temperature=0.0)


def test_generate_prints_the_question_video_and_parsed_answer(builtin_root):
    text = run_cli("generate", f"--config={ROOT}/configs/paragrpo.py:tiny",
                   f"--config.data.builtin_root={builtin_root}",
                   "--config.rl.rollout.max_new_tokens=8", "--config.rl.rollout.max_turns=1",
                   "--config.rl.rollout.subagent_max_tokens=7", "--config.generate.nframes=2")
    lines = text.splitlines()
    question = next(l for l in lines if l.startswith("[generate] question: "))
    video = next(l for l in lines if l.startswith("[generate] video: "))
    answer = next(l for l in lines if l.startswith("[generate] answer: "))
    assert len(question) > len("[generate] question: ") + 10
    assert ".mp4 (K = 2 overview frames; subagent mode, up to 1 tool rounds of 5 calls" in video
    assert "crops of at most 16 frames of 15360 pixels, summaries of at most 7 tokens" in video
    assert "(expected '" in answer and "[generate] completion:" in text
