"""The `paravt-jax` console script as a user runs it: exit statuses, --help, bad values
refused at start; `run` stopped by SIGTERM, SIGINT and SIGKILL, then resumed."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(os.path.dirname(sys.executable), "paravt-jax")  # installed next to this python
COMMANDS = ("run", "sft", "train", "export", "generate", "forward", "eval", "plan", "sweep", "report")


def environment():
    return dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")


def script(*args, timeout=300):
    """The installed console script (this checkout's code first on the path)."""
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, env=environment(), timeout=timeout)


def test_console_script_help_and_quiet_success(tmp_path, builtin_root):
    assert os.access(SCRIPT, os.X_OK), f"{SCRIPT}: install the package (pip install -e .)"
    out = script("--help")
    assert out.returncode == 0 and out.stderr == ""
    for command in COMMANDS:
        assert f"\n  {command} " in out.stdout
    assert "130/143" in out.stdout
    out = script("run", "--help")
    assert out.returncode == 0 and out.stderr == ""
    assert "usage: paravt-jax run" in out.stdout and "--workdir" in out.stdout
    assert "rl.reward.mode = 'f1'" in out.stdout and "--config.FIELD=VALUE" in out.stdout
    # a successful command exits 0 and prints nothing of its return value
    out = script("plan", f"--config={ROOT}/configs/paragrpo.py:tiny", "--mesh=data=1,fsdp=1,tensor=1",
                 f"--config.data.builtin_root={builtin_root}",
                 "--device_memory_gb=16", "--activations=estimate", f"--json={tmp_path / 'plan.json'}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "TRAINER" in out.stdout and "MemoryPlan(" not in out.stderr and len(out.stderr) < 500, out.stderr
    out = script("fly")
    assert out.returncode == 2 and "unknown command 'fly'" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    from paravt_jax.cli import main

    assert main(["paravt-jax", command, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"usage: paravt-jax {command}" in out
    if command != "report":
        assert "--config" in out  # the flags block


BAD = [
    (("run", "--config.rl.reward.mode=bogus"), "rl.reward.mode='bogus': must be one of ('f1', 'exact', 'llm')"),
    (("train", "--config.rl.optimizer.learning_rate=-0.0001"),
     "rl.optimizer.learning_rate=-0.0001: must be a finite number > 0"),
    (("run", "--config.rl.dispatch.max_parallel=0"), "rl.dispatch.max_parallel=0: must be an integer >= 1"),
    (("sft", "--config.sft.steps=-1"), "sft.steps=-1: must be an integer >= 0"),
    (("train", "--config.rl.steps=-3"), "rl.steps=-3: must be an integer >= 0"),
    (("sft", "--config.sft.batch_size=0"), "sft.batch_size=0: must be an integer >= 1"),
    (("sft", "--config.sft.micro_batches=0"), "sft.micro_batches=0: must be an integer >= 1"),
    (("sft", "--config.sft.micro_batches=3"), "sft.micro_batches=3: must divide the 8 rows of a step"),
    (("train", "--config.rl.micro_batches=0"), "rl.micro_batches=0: must be an integer >= 1"),
    (("train", "--config.rl.samples_per_prompt=0"), "rl.samples_per_prompt=0: must be an integer >= 1"),
    (("train", "--config.rl.prompts_per_step=-1"), "rl.prompts_per_step=-1: must be an integer >= 1"),
    (("run", "--config.data.num_train=0"), "data.num_train=0: must be an integer >= 1"),
    (("run", "--config.sft.checkpoint_every=-5"), "sft.checkpoint_every=-5: must be an integer >= 0"),
    (("run", f"--config={ROOT}/configs/paragrpo.py:huge"), "unknown preset 'huge'; choose from"),
    (("eval", "--limit=-2"), "--limit=-2"),
    (("eval", "--config.driver.max_parallel=0"), "driver.max_parallel=0: must be an integer >= 1"),
    (("eval", "--config.grounding_visual=clip"), "grounding_visual='clip': must be one of ('images', 'video')"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_values_are_refused_at_start(args, message, tmp_path, capsys):
    from paravt_jax.cli import main

    command, *flags = args
    workdir = [f"--workdir={tmp_path / 'run'}"] if command != "eval" else [f"--output_dir={tmp_path / 'run'}"]
    assert main(["paravt-jax", command, *flags, *workdir]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "run")  # refused before any work


ONE_LINE = [
    (("sft", "--config.sft.stepz=3"),
     "--config.sft.stepz: 'sft' has no field 'stepz'; did you mean --config.sft.steps?"),
    (("train", f"--config={ROOT}/configs/paragrpo.py:tiny", "--config.rl.stepz=3"),
     "'rl' has no field 'stepz'; did you mean --config.rl.steps?"),
    (("run", "--config.rll.steps=3"), "the config' has no field 'rll'; did you mean --config.rl?"),
    (("train", "--config.rl.eval_nframes=(4,)"),
     "--config.rl.eval_nframes: moved; it is --config.rl.evals.eval.nframes"),
    (("run", "--config.eval.limit=1"), "--config.eval.limit: moved; it is --config.evals.held_out.limit"),
    (("eval", "--config.driver.nframez=3"), "has no field 'nframez'; did you mean --config.driver.nframes?"),
    (("run", f"--config={ROOT}/configs/no_such_file.py:tiny"), "no_such_file.py' does not exist"),
    (("plan", f"--config={ROOT}/configs/no_such_file.py"), "no_such_file.py' does not exist"),
    (("eval", "--config.datasets=bogus"), "datasets='bogus': unknown dataset 'bogus'; choose from charades,"),
    (("plan", "--mesh=bogus"), "--mesh='bogus': unknown mesh preset 'bogus'"),
    (("sweep", "--workdir=unused"), "sweep: --config=FILE[:ARG] is required"),
]


@pytest.mark.parametrize("args,message", ONE_LINE, ids=[" ".join(a[:1] + a[-1:]) for a, _ in ONE_LINE])
def test_bad_command_lines_are_one_line_with_status_2(args, message, tmp_path, capsys):
    """A misspelt field (with the right hint), a missing config file, an unknown dataset or mesh:
    one line on stderr, no traceback, status 2, nothing written."""
    from paravt_jax.cli import main

    command, *flags = args
    where = {"eval": [f"--output_dir={tmp_path / 'run'}"], "plan": []}.get(command, [f"--workdir={tmp_path / 'run'}"])
    assert main(["paravt-jax", command, *flags, *where]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "\\n" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "run")


RANDOM_OR_TOY = [
    (("run", f"--config={ROOT}/configs/paragrpo.py:qwen3vl_8b"),
     "model.checkpoint is empty: the '8b' model has no built-in checkpoint (only tiny, toy have); give "
     "--config.model.checkpoint=DIR (a local HF Qwen3-VL checkpoint), or --config.model.init=random"),
    (("train", f"--config={ROOT}/configs/paragrpo.py:qwen3vl_2b", "--config.model.checkpoint=/ckpt"),
     "data.sft, data.rl_train, data.rl_eval empty: the built-in toy data serves the toy presets (tiny, toy)"),
    (("sft", f"--config={ROOT}/configs/sft.py:qwen3vl_8b", "--config.model.init=random",
      "--config.model.checkpoint=/c"),
     "model.init='random' and model.checkpoint='/c': choose one"),
    (("forward", f"--config={ROOT}/configs/base.py:small125m"), "the 'small125m' model has no built-in checkpoint"),
    (("eval", f"--config={ROOT}/configs/eval.py:paravt_8b"), "the '8b' model has no built-in checkpoint"),
]


@pytest.mark.parametrize("args,message", RANDOM_OR_TOY, ids=[" ".join(a[:2]) for a, _ in RANDOM_OR_TOY])
def test_random_init_and_toy_data_are_asked_for_by_name(args, message, tmp_path, capsys):
    """A large preset without a checkpoint no longer trains a random model on the toy data."""
    from paravt_jax.cli import main

    command, *flags = args
    where = {"eval": [f"--output_dir={tmp_path / 'run'}"], "forward": []}.get(command,
                                                                              [f"--workdir={tmp_path / 'run'}"])
    assert main(["paravt-jax", command, *flags, *where]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "run")


def test_model_init_random_asks_for_both():
    from paravt_jax.cli.config_checks import check_config, check_data_sources
    from paravt_jax.configs import paragrpo
    from paravt_jax.run_config import build_run

    config = paragrpo.get_config("qwen3vl_8b")
    config.model.init = "random"
    check_config(config)
    check_data_sources(build_run(config))  # a smoke test of the recipe on the toy data: allowed by name
    check_data_sources(build_run(paragrpo.get_config("toy")))


def test_several_bad_values_are_listed_together():
    from paravt_jax.cli.config_checks import check_config
    from paravt_jax.config import ConfigValueError
    from paravt_jax.configs import paragrpo

    config = paragrpo.get_config("tiny")
    config.rl.step.temperature, config.evals.held_out.nframes, config.evals.held_out.mode = 0.0, (4, 0), "crops"
    with pytest.raises(ConfigValueError) as err:
        check_config(config)
    assert "rl.step.temperature=0.0: must be a finite number > 0" in str(err.value)
    assert "evals.held_out.mode='crops'" in str(err.value)
    assert "evals.held_out.nframes=(4, 0): must be a list of integers >= 1" in str(err.value)


# ----------------------------------------------------------------------------- preemption
RUN = ["--config.sft.steps=3", "--config.sft.batch_size=2", "--config.sft.nframes=2", "--config.rl.steps=2",
       "--config.rl.prompts_per_step=1", "--config.rl.samples_per_prompt=2", "--config.rl.rollout.max_new_tokens=4",
       "--config.rl.rollout.max_turns=1", "--config.rl.rollout.subagent_max_tokens=4", "--config.rl.eval_every=0",
       "--config.rl.nframes_gating=False", "--config.rl.default_nframes=4", "--config.evals.held_out.limit=1",
       "--config.evals.held_out.nframes=(4,)", "--config.evals.held_out.after_sft=(4,)",
       "--config.evals.held_out.max_new_tokens=4", "--config.evals.held_out.max_turns=1"]


# A log line (paravt_jax/infra/logs.py): level letter, month and day, time, message.
LOG_LINE = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d (\[process \d+\] )?")


def run_until(workdir, builtin_root, marker, signum, extra=()):
    """Starts `paravt-jax run` (via `python -m paravt_jax.cli`), sends `signum` once a line of
    its log (stderr) contains `marker`, and returns (exit status, stdout, stderr)."""
    args = [sys.executable, "-m", "paravt_jax.cli", "run", f"--config={ROOT}/configs/paragrpo.py:tiny",
            f"--workdir={workdir}", f"--config.data.builtin_root={builtin_root}", *RUN, *extra]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment())
    lines = []
    try:
        for line in process.stderr:
            lines.append(line)
            if signum is not None and marker in line:
                process.send_signal(signum)
                signum = None
        status = process.wait(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    return status, process.stdout.read(), "".join(lines)


def metric_steps(workdir, phase):
    with open(os.path.join(workdir, phase, "metrics.jsonl")) as f:
        return [json.loads(line)["step"] for line in f]


def claims_completion(workdir) -> bool:
    return os.path.exists(os.path.join(workdir, "summary.json")) or os.path.exists(os.path.join(workdir, "final"))
