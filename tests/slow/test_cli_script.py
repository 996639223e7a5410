"""The installed script stopped by signals in the middle of a run, then resumed (the loop-level
signal and resume tests run by default: tests/integration/test_training.py)."""
import json
import os
import signal

from integration.test_cli_script import LOG_LINE, claims_completion, metric_steps, run_until


def test_sigterm_during_sft_checkpoints_and_stops_the_run(tmp_path, builtin_root):
    workdir = str(tmp_path / "run")
    status, out, err = run_until(workdir, builtin_root, "[sft/ 0/3]", signal.SIGTERM)
    assert status == 128 + signal.SIGTERM, err[-3000:]
    assert "SIGTERM: checkpoint at step 2 of 3" in err and "rerun to resume" in err and "Traceback" not in err
    assert sorted(os.listdir(os.path.join(workdir, "sft", "checkpoints"))) == ["2"]
    assert metric_steps(workdir, "sft") == [0, 1]
    assert not os.path.exists(os.path.join(workdir, "rl")) and not claims_completion(workdir)
    assert "[rl]" not in err and "evaluation" not in err + out
    assert "[sft] step 0/3: the first step of a run also compiles" in err  # no silent compilation


def test_run_resumes_the_interrupted_phase_and_everything_after_it(tmp_path, builtin_root):
    """SIGTERM in SFT, SIGINT in RL, SIGKILL in RL, then a clean finish: every step once,
    the final model trained on all of them, a whole summary, and a finished run left alone."""
    workdir = str(tmp_path / "run")
    status, _, _ = run_until(workdir, builtin_root, "[sft/ 0/3]", signal.SIGTERM)
    assert status == 143 and not claims_completion(workdir)
    status, out, err = run_until(workdir, builtin_root, "[rl] step 0/2", signal.SIGINT)
    assert status == 128 + signal.SIGINT, err[-3000:]
    assert "[sft] resumed" in err and "at step 2" in err and "SIGINT: checkpoint at step 1 of 2" in err
    assert metric_steps(workdir, "sft") == [0, 1, 2] and metric_steps(workdir, "rl") == [0]
    assert not claims_completion(workdir)
    # SIGKILL right after RL step 1's metrics line, before or during its checkpoint
    status, _, err = run_until(workdir, builtin_root, "[rl/ 1/2]", signal.SIGKILL)
    assert status == -signal.SIGKILL and "[rl] resumed" in err
    assert not os.path.exists(os.path.join(workdir, "summary.json"))
    status, out, err = run_until(workdir, builtin_root, "", None)
    assert status == 0, err[-3000:]
    # quiet: stderr holds log lines (and under 2,000 characters of anything else), no return value dumped
    assert len("".join(line for line in err.splitlines(True) if not LOG_LINE.match(line))) < 2000, err[-3000:]
    assert "'sft_loss'" not in err + out
    assert "[rl] resumed" in err and "[run] evaluation 2/2 (tools yes, K = 4, 1 videos)" in err
    assert "[run] the cold start's evaluation, from" in err  # evaluated once, before the SIGINT
    assert metric_steps(workdir, "sft") == [0, 1, 2] and metric_steps(workdir, "rl") == [0, 1]
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    assert len(summary["sft_loss"]) == 3 and len(summary["rl"]) == 2 and len(summary["eval"]) == 2
    assert len(summary["eval_after_sft"]) == 2
    assert summary["training_minutes"] > 0
    before = open(os.path.join(workdir, "summary.json")).read()
    status, _, err = run_until(workdir, builtin_root, "", None)
    assert status == 0 and "has finished every phase" in err
    assert open(os.path.join(workdir, "summary.json")).read() == before
