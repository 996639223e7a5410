"""`paravt-jax sweep` and `paravt-jax report`: one real two-arm sweep of configs/ablations.py
(shared SFT of one step, one RL step per arm) run once for the module, then checks of its
workdirs, re-run skipping, the report, and the refusals."""
import contextlib
import csv
import fcntl
import io
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

from conftest import once_per_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ABLATIONS = f"{ROOT}/configs/ablations.py"
# The cheapest honest main job: every stage runs, on one question, a few tokens each.
MINI = ["--config.sft.steps=1", "--config.sft.batch_size=2", "--config.sft.nframes=2",
        "--config.rl.steps=1", "--config.rl.prompts_per_step=1", "--config.rl.samples_per_prompt=2",
        "--config.rl.rollout.max_new_tokens=8", "--config.rl.rollout.max_turns=1",
        "--config.rl.rollout.subagent_max_tokens=8",
        "--config.evals.held_out.limit=1", "--config.evals.held_out.max_new_tokens=8",
        "--config.evals.held_out.max_turns=1", "--config.evals.held_out.nframes=(4,)"]
TWO_ARMS = "^(vanilla|paragrpo),"  # two arms of the tiny grid (one seed in tiny)


def sweep_main(*args):
    """(statuses, the command's output then its log lines) of an in-process sweep."""
    from paravt_jax.cli import sweep

    out, log = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(log):
        result = sweep.main(["paravt-jax", *args])
    return result, out.getvalue() + log.getvalue()


def sweep_arguments(base: str) -> list[str]:
    return [f"--config={ABLATIONS}:tiny", f"--workdir={base}/root", "--shared_sft", f"--only={TWO_ARMS}",
            f"--config.data.builtin_root={base}/builtin", *MINI]


def run_sweep(base: str) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.pop("XLA_FLAGS", "")).strip()
    if flags:  # XLA reads a value that does not start with "--" as a file name
        env["XLA_FLAGS"] = flags
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "paravt_jax.cli", "sweep", *sweep_arguments(base)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    with open(os.path.join(base, "sweep.json"), "w") as f:
        json.dump({"stdout": done.stdout, "seconds": time.perf_counter() - start}, f)


@pytest.fixture(scope="module")
def sweep_run():
    """The real sweep, as a user runs it: `python -m paravt_jax.cli sweep` in a subprocess on
    one CPU device (the tests' 8 fake devices make compiles several times slower); run once per
    session, whichever pytest-xdist workers take this module's tests (the workers' tests that
    write into its root, or read what a rerun rewrites, take it through `swept_alone` or `swept`)."""
    base = once_per_session("sweep", run_sweep)
    with open(os.path.join(base, "sweep.json")) as f:
        ran = json.load(f)
    return {"root": os.path.join(base, "root"), "common": sweep_arguments(base), **ran}


@contextlib.contextmanager
def sweep_lock(sweep_run, exclusive: bool):
    with open(sweep_run["root"] + ".use.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield sweep_run


@pytest.fixture
def swept(sweep_run):
    """The shared sweep, read while no other worker's test reruns it (a rerun rewrites the
    root's report)."""
    with sweep_lock(sweep_run, exclusive=False) as run:
        yield run


@pytest.fixture
def swept_alone(sweep_run):
    """The shared sweep, for a test that reruns it: no other worker's test reads it meanwhile."""
    with sweep_lock(sweep_run, exclusive=True) as run:
        yield run


def test_arms_ran_in_workdirs_named_by_their_overrides(swept):
    root = swept["root"]
    names = sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))
    assert names == ["_sft", "paragrpo,seed=0", "vanilla,seed=0"]
    for name in names:
        summary = json.load(open(os.path.join(root, name, "summary.json")))
        assert [(r["tools"], r["nframes"]) for r in summary["eval"]] == [(False, 4), (True, 4)]
        assert os.path.isfile(os.path.join(root, name, "sweep_done.json"))
        assert os.path.isfile(os.path.join(root, name, "final", "model.safetensors"))
    # The shared SFT ran once; the arms trained RL from its export with no SFT of their own.
    assert len(json.load(open(f"{root}/_sft/summary.json"))["sft_loss"]) == 1
    assert not os.path.exists(f"{root}/_sft/rl/metrics.jsonl")
    for name in ("vanilla,seed=0", "paragrpo,seed=0"):
        record = json.load(open(os.path.join(root, name, "sweep_arm.json")))
        assert record["overrides"]["model.checkpoint"] == os.path.join(root, "_sft", "final")
        assert record["overrides"]["sft.steps"] == 0 and record["overrides"]["seed"] == 0
        assert not os.path.exists(os.path.join(root, name, "sft"))
        assert len(open(os.path.join(root, name, "rl", "metrics.jsonl")).read().splitlines()) == 1
    vanilla = json.load(open(f"{root}/vanilla,seed=0/sweep_arm.json"))["overrides"]
    assert vanilla["rl.advantage.anchor_weight"] == 0.0 and vanilla["rl.nframes_gating"] is False
    assert vanilla["rl.rollout.prompt.think_prefix"] is False and vanilla["rl.advantage.anchor_mode"] == "sequence"
    assert "rl.advantage.anchor_weight" not in json.load(open(f"{root}/paragrpo,seed=0/sweep_arm.json"))["overrides"]
    print(f"\n[test_sweep] real 2-arm sweep (+ shared SFT) took {swept['seconds']:.0f} s")


def test_rerun_skips_finished_arms(swept_alone):
    swept = swept_alone
    root = swept["root"]
    stamps = {n: os.path.getmtime(os.path.join(root, n, "summary.json")) for n in ("_sft", "vanilla,seed=0")}
    start = time.perf_counter()
    statuses, out = sweep_main(*swept["common"])
    assert time.perf_counter() - start < 60
    assert [s["status"] for s in statuses] == ["skipped"] * 3, out
    assert "vanilla,seed=0: finished before, skipped" in out
    assert stamps == {n: os.path.getmtime(os.path.join(root, n, "summary.json")) for n in stamps}
    assert len(open(os.path.join(root, "vanilla,seed=0", "rl", "metrics.jsonl")).read().splitlines()) == 1
    assert "other settings" not in out
    # Finished arms are kept even when the sweep's settings changed since; it says so.
    changed = [a.replace("held_out.limit=1", "held_out.limit=2") for a in swept["common"]]
    statuses, out = sweep_main(*changed)
    assert [s["status"] for s in statuses] == ["skipped"] * 3 and out.count("ran with other settings") == 3


def test_report_table_and_plots(swept, tmp_path):
    from paravt_jax.cli import report

    root = swept["root"]
    prefix = str(tmp_path / "cmp")
    out = io.StringIO()
    with redirect_stdout(out):
        report.main(["paravt-jax", root, f"--out={prefix}"])
    rows = list(csv.DictReader(open(f"{prefix}.csv")))
    assert [r["group"] for r in rows] == ["_sft", "vanilla", "paragrpo"]
    for row in rows:
        arm = row["arms"]
        summary = json.load(open(os.path.join(root, arm, "summary.json")))
        for result in summary["eval"]:
            tag = f"eval_{'tools' if result['tools'] else 'notools'}_K{result['nframes']}"
            assert float(row[f"{tag}_accuracy.mean"]) == pytest.approx(result["accuracy"])
            assert float(row[f"{tag}_format_compliance.mean"]) == pytest.approx(result["format_compliance"])
            if result["tools"]:
                assert float(row[f"{tag}_kappa.mean"]) == pytest.approx(result["kappa"])
        assert float(row["minutes.mean"]) == pytest.approx(summary["minutes"])
        if arm == "_sft":
            assert float(row["rl_steps.mean"]) == 0 and row["rl_kappa_final.mean"] == ""
            continue
        last = json.loads(open(os.path.join(root, arm, "rl", "metrics.jsonl")).read().splitlines()[-1])
        assert float(row["rl_steps.mean"]) == 1 and float(row["sft_steps.mean"]) == 0
        for metric in ("reward", "format_compliance", "kappa", "anchor_reward", "calls_per_tool_turn"):
            assert float(row[f"rl_{metric}_final.mean"]) == pytest.approx(last[f"rl/{metric}"])
            assert float(row[f"rl_{metric}_best.mean"]) == pytest.approx(last[f"rl/{metric}"])
    text = open(f"{prefix}.md").read()
    for group in ("_sft", "vanilla", "paragrpo"):
        assert f"| {group} |" in text
    assert "no tools K=4 acc" in text and "kappa final" in text
    assert "arms with a manifest ran under one environment" in text  # one machine, one commit
    for metric in ("format_compliance", "kappa", "reward"):
        path = f"{prefix}_{metric}.png"
        assert os.path.getsize(path) > 1000 and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # The sweep itself wrote the same report into its root.
    assert list(csv.DictReader(open(f"{root}/report.csv"))) == rows


def test_report_groups_seeds_with_mean_and_spread(swept):
    """The two real arms relabelled as two seeds of one group: mean and sample std."""
    import dataclasses

    from paravt_jax.experiments import report

    arms = [dataclasses.replace(report.load_arm(os.path.join(swept["root"], n)), group="both")
            for n in ("vanilla,seed=0", "paragrpo,seed=0")]
    (group,) = report.summarize_groups(arms)
    for key in ("rl_reward_final", "eval_notools_K4_accuracy", "minutes"):
        values = [a.numbers[key] for a in arms]
        mean, std, low, high, count = group.stats[key]
        assert (count, low, high) == (2, min(values), max(values))
        assert mean == pytest.approx(statistics.mean(values)) and std == pytest.approx(statistics.stdev(values))
    assert report.group_of("vanilla,seed=1") == "vanilla" == report.group_of("seed=2,vanilla")
    assert report.group_of("anchor_weight=0.0,seed=1,x=2") == "anchor_weight=0.0,x=2"


def test_dry_run_prints_one_command_per_arm_that_parses_to_the_arm_config(tmp_path):
    from paravt_jax.experiments import sweep

    root = str(tmp_path / "dry")
    lines, out = sweep_main(f"--config={ABLATIONS}:qwen3vl_8b", f"--workdir={root}", "--dry_run",
                            "--config.rl.steps=7")
    assert out.splitlines() == lines and len(lines) == 15  # 5 arms x 3 seeds
    assert not os.path.exists(root)
    names = [shlex.split(line)[5].split("/")[-1] for line in lines]
    assert names[:3] == ["vanilla,seed=0", "vanilla,seed=1", "vanilla,seed=2"] and "paragrpo,seed=2" in names
    vanilla = shlex.split(lines[1])
    assert vanilla[:5] == ["python", "-m", "paravt_jax.cli", "run", f"--config={ABLATIONS}:qwen3vl_8b"]
    for flag in ("--config.rl.advantage.anchor_weight=0.0", "--config.rl.nframes_gating=False",
                 "--config.rl.rollout.prompt.think_prefix=False", "--config.seed=1", "--config.rl.steps=7"):
        assert flag in vanilla
    # The printed command, parsed as cli.main parses it, gives the config the sweep builds
    # for that arm from the preset and the command-line override.
    base = _parse_config(["paravt-jax", f"--config={ABLATIONS}:qwen3vl_8b", "--config.rl.steps=7"])[0]
    plan = sweep.make_plan(base, f"{ABLATIONS}:qwen3vl_8b", root, {"rl.steps": 7})
    parsed, workdir = _parse_config(["paravt-jax"] + vanilla[4:])
    assert parsed.to_dict() == sweep.apply_overrides(base, plan.arms[1].overrides).to_dict()
    anchor = (parsed.rl.advantage.anchor_weight, base.rl.advantage.anchor_weight)
    assert (parsed.seed, base.seed, *anchor) == (1, 0, 0.0, 0.5)
    assert parsed.rl.steps == 7 and workdir == f"{root}/vanilla,seed=1"
    changed, _ = sweep_main(f"--config={ABLATIONS}:qwen3vl_8b", f"--workdir={root}", "--dry_run",
                            "--config_changed=ok")
    assert all(shlex.split(line)[-1] == "--config_changed=ok" for line in changed)


def _parse_config(argv):
    from absl import flags
    from ml_collections import config_flags

    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    flags.DEFINE_string("workdir", "", "", flag_values=values)
    values(argv)
    return values.config, values.workdir


def _write_config(path, sweep_body):
    path.write_text("from paravt_jax.configs import ablations\n"
                    "from paravt_jax.experiments.sweep import product\n"
                    "def get_config(arg='tiny'):\n    return ablations.get_config(arg)\n" + sweep_body)
    return str(path)


def test_unnamed_overrides_name_the_workdirs_typed_like_the_fields(tmp_path):
    config = _write_config(tmp_path / "grid.py", "def sweep():\n    return product(**{"
                           "'rl.advantage.anchor_weight': [0, 0.5], 'rl.nframes_gating': ['false'], 'seed': [1]})\n")
    root = str(tmp_path / "grid")
    lines, _ = sweep_main(f"--config={config}", f"--workdir={root}", "--dry_run")
    assert [shlex.split(line)[5] for line in lines] == [
        f"--workdir={root}/anchor_weight=0.0,nframes_gating=False,seed=1",
        f"--workdir={root}/anchor_weight=0.5,nframes_gating=False,seed=1"]
    assert "--config.rl.advantage.anchor_weight=0.0" in lines[0] and "--config.rl.nframes_gating=False" in lines[0]


def test_arm_names_are_stable_safe_and_bounded():
    from paravt_jax.configs import paragrpo
    from paravt_jax.experiments import sweep

    config = paragrpo.get_config("tiny")
    entries = [{"seed": 2, "rl.rollout.max_new_tokens": 16, "evals.held_out.max_new_tokens": 32,
                "evals.held_out.nframes": [4, 64]},
               {"evals.held_out.max_new_tokens": 32, "evals.held_out.nframes": (4, 64), "rl.rollout.max_new_tokens": 16,
                "seed": 2.0},
               {"data.video_root": "/videos/" + "x" * 200}, {"data.video_root": "/videos/" + "x" * 199 + "y"}]
    arms = sweep.build_arms(config, entries[:1] + entries[2:], "test")
    assert arms[0].name == "evals.held_out.max_new_tokens=32,nframes=4+64,rl.rollout.max_new_tokens=16,seed=2"
    assert arms[0].group == "evals.held_out.max_new_tokens=32,nframes=4+64,rl.rollout.max_new_tokens=16"
    assert sweep.build_arms(config, entries[1:2], "test")[0].name == arms[0].name  # order-free, typed
    for arm in arms[1:]:
        assert len(arm.name) <= sweep.MAX_NAME_LENGTH and "/" not in arm.name
    assert arms[1].name != arms[2].name
    with pytest.raises(sweep.SweepError, match="both get the directory name"):
        sweep.build_arms(config, [{"seed": 1}, {"seed": 1.0}], "test")
    with pytest.raises(sweep.SweepError, match=r"'seed=many'.*seed='many'.*int"):
        sweep.build_arms(config, [{"seed": "many"}], "test")


def test_config_without_sweep_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"configs/paragrpo\.py.*defines no sweep\(\)"):
        sweep_main(f"--config={ROOT}/configs/paragrpo.py:tiny", f"--workdir={tmp_path}/x")
    assert not os.path.exists(f"{tmp_path}/x")


def test_missing_field_is_refused_before_any_arm_starts(tmp_path):
    config = _write_config(tmp_path / "bad.py", "def sweep(arg):\n    return [{'seed': 0}, "
                           "{'arm': {'name': 'typo', 'rl.anchor_wieght': 0.0}, 'seed': 1}]\n")
    root = tmp_path / "bad_root"
    with pytest.raises(UsageError, match=r"arm 'typo,seed=1'.*'rl\.anchor_wieght' names no config field"):
        sweep_main(f"--config={config}:tiny", f"--workdir={root}")
    assert not root.exists()


def test_a_moved_key_is_refused_naming_its_new_place(tmp_path):
    config = _write_config(tmp_path / "old.py", "def sweep():\n    return [{'seed': 0, 'eval.limit': 4}]\n")
    with pytest.raises(UsageError, match=r"'eval\.limit' names a key that moved; it is 'evals\.held_out\.limit'"):
        sweep_main(f"--config={config}:tiny", f"--workdir={tmp_path}/old_root")


def test_shared_sft_runs_one_sft_per_distinct_cold_start(tmp_path):
    """Arms that change SFT fields (a shorter cold start) share one SFT run per distinct
    setting; every arm starts from its own setting's export with its SFT off."""
    config = _write_config(tmp_path / "prior.py", "def sweep():\n    return product(prior=["
                           "{'name': 'strong'}, {'name': 'weak', 'sft.steps': 3}], seed=[0, 1])\n")
    root = str(tmp_path / "prior_root")
    lines, out = sweep_main(f"--config={config}:tiny", f"--workdir={root}", "--dry_run", "--shared_sft",
                            "--config.rl.steps=7")
    runs = [(shlex.split(line)[5].split("/")[-1], shlex.split(line)) for line in lines]
    assert [name for name, _ in runs] == ["_sft", "_sft,steps=3", "strong,seed=0", "strong,seed=1",
                                          "weak,seed=0", "weak,seed=1"]
    flags = dict(runs)
    assert "--config.rl.steps=0" in flags["_sft"] and "--config.rl.steps=7" not in flags["_sft"]
    assert "--config.sft.steps=3" in flags["_sft,steps=3"] and "--config.rl.steps=0" in flags["_sft,steps=3"]
    for name, sft in (("strong,seed=1", "_sft"), ("weak,seed=0", "_sft,steps=3")):
        assert f"--config.model.checkpoint={root}/{sft}/final" in flags[name]
        assert flags[name][-1] == "--config.sft.steps=0" and "--config.rl.steps=7" in flags[name]


def test_report_gives_the_trend_over_thirds_and_plots_periodic_accuracy(tmp_path):
    """Six logged RL steps: early / late are the means of the first and last two; the
    periodic held-out accuracy (logged every third step) gets its own curve."""
    from paravt_jax.experiments import report

    arm = tmp_path / "root" / "paragrpo,seed=0"
    (arm / "rl").mkdir(parents=True)
    rewards = [0.5, 0.7, 0.2, 0.4, 1.0, 1.2]
    with open(arm / "rl" / "metrics.jsonl", "w") as f:
        for step, reward in enumerate(rewards):
            record = {"step": step, "rl/reward": reward, "rl/kappa": step / 10}
            if step % 3 == 2:
                record["rl/eval_tools/accuracy"] = 0.25 * step
                record["rl/eval_tools_K64/accuracy"] = 0.1 * step  # the periodic evaluation's second K
            f.write(json.dumps(record) + "\n")
    loaded = report.load_arm(str(arm))
    assert loaded.numbers["rl_reward_early"] == pytest.approx(0.6)
    assert loaded.numbers["rl_reward_late"] == pytest.approx(1.1)
    assert loaded.numbers["rl_kappa_late"] == pytest.approx(0.45)
    assert "rl_eval_tools_accuracy_early" not in loaded.numbers  # periodic: last and best only
    assert loaded.curves["eval_tools/accuracy"] == [(2, 0.5), (5, 1.25)]
    result = report.write_report([str(tmp_path / "root")], str(tmp_path / "out"))
    assert "reward early" in result["text"] and "| 0.600 | 1.100 |" in result["text"].replace(" ± 0.000", "")
    assert str(tmp_path / "out_eval_tools_accuracy.png") in result["plots"]
    assert loaded.curves["eval_tools_K64/accuracy"] == [(2, 0.2), (5, 0.5)]
    assert str(tmp_path / "out_eval_tools_K64_accuracy.png") in result["plots"]


def test_toy_paradox_grids_share_their_cold_starts(tmp_path):
    """The study: the 2 x 2 factorial from the main job's cold start and vanilla vs PARA-GRPO
    from a short one (toy_paradox), vanilla vs PARA-GRPO from one whose overviews vary K
    (toy_paradox_varied); 3 seeds each, one shared SFT per cold start."""
    def plan(preset, root):
        lines, _ = sweep_main(f"--config=configs/ablations.py:{preset}", f"--workdir={root}", "--dry_run",
                              "--shared_sft")
        return [shlex.split(line)[5].split("/")[-1] for line in lines], [shlex.split(line) for line in lines]

    names, _ = plan("toy_paradox", tmp_path / "p")
    assert names[:2] == ["_sft", "_sft,steps=200"] and len(names) == 2 + 6 * 3
    assert {n.rsplit(",seed=", 1)[0] for n in names[2:]} == {
        "strong,vanilla", "strong,anchor_only", "strong,gating_only", "strong,paragrpo", "weak,vanilla",
        "weak,paragrpo"}
    names, lines = plan("toy_paradox_varied", tmp_path / "v")
    assert names == ["_sft,nframes_choices=4+8+16"] + [f"varied,{arm},seed={seed}" for arm in ("vanilla", "paragrpo")
                                                         for seed in (0, 1, 2)]
    assert "--config.sft.nframes_choices=(4, 8, 16)" in lines[0]
    vanilla = lines[names.index("varied,vanilla,seed=1")]
    assert f"--config.model.checkpoint={tmp_path}/v/_sft,nframes_choices=4+8+16/final" in vanilla
    assert "--config.rl.nframes_gating=False" in vanilla


def test_long_rl_study_runs_its_core_arms_first_and_checks_held_out_accuracy_at_three_k(tmp_path):
    """toy_long (docs/long_rl.md): two cold starts, vanilla and paragrpo from both first (3
    seeds), then the factorial's other two arms; 96 steps, held-out checks every 16 at K = 4, 16,
    64 and checkpoints as often (an interrupted arm resumes)."""
    from paravt_jax.configs import ablations

    lines, _ = sweep_main("--config=configs/ablations.py:toy_long", f"--workdir={tmp_path}", "--dry_run",
                          "--shared_sft")
    names = [shlex.split(line)[5].split("/")[-1] for line in lines]
    assert names[:2] == ["_sft", "_sft,nframes_choices=4+8+16"] and len(names) == 2 + 18
    assert [n.rsplit(",seed=", 1)[0] for n in names[2:14:3]] == [
        "strong,vanilla", "strong,paragrpo", "varied,vanilla", "varied,paragrpo"]
    assert {n.rsplit(",seed=", 1)[0] for n in names[14:]} == {"strong,anchor_only", "strong,gating_only"}
    config = ablations.get_config("toy_long")
    assert (config.rl.steps, config.rl.eval_every, config.rl.checkpoint_every) == (96, 16, 16)
    assert tuple(config.rl.evals.eval.nframes) == tuple(config.evals.held_out.nframes) == (4, 16, 64)
    assert config.rl.optimizer.learning_rate == ablations.LONG_RATE  # the pilot's choice
    lines, _ = sweep_main("--config=configs/ablations.py:toy_long_pilot", f"--workdir={tmp_path}/pilot",
                          "--dry_run", "--shared_sft")
    rates = [line for line in lines if "--config.rl.optimizer.learning_rate=" in line]
    assert len(rates) == 3 and all("paragrpo" in line and "seed=0" in line for line in rates)
from paravt_jax.cli.flags import UsageError
