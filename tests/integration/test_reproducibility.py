"""Same commit, config, seed and packages, same numbers (paravt_jax/infra/reproducibility.py): on 1 or 2
cores, beside a busy process, whatever order crops finish in; the manifest every run records;
the built-in data's content hash."""
import json
import os
import random
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from paravt_jax.infra import reproducibility

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# metrics that measure time (or compile work, which a warm cache changes), not the model
TIMING = re.compile(r"(^time$|_s$|_s_|compile|minutes|wall|elapsed|per_s|queue|wait)")


def needs_two_cores():
    if reproducibility.usable_cpus() < 2:
        pytest.skip("needs 2 usable CPUs to compare a 1-core process with a 2-core one")


def numbers(record: dict) -> dict:
    """A metrics record without its timing values."""
    return {k: v for k, v in record.items() if not TIMING.search(k.split("/")[-1])}


def plain_env(**extra) -> dict:
    """The main job's environment: no fake devices, no fast-compile flag (the suite's)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", reproducibility.CPU_THREADS_ENV, reproducibility.ONEDNN_ISA_ENV)}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **extra)
    return env


SUM_PROGRAM = ("import hashlib, numpy as np, paravt_jax, jax, jax.numpy as jnp; "
               "x = jax.random.normal(jax.random.PRNGKey(0), (1 << 20,), jnp.float32); "
               "print(hashlib.sha256(np.asarray(jax.jit(jnp.sum)(x)).tobytes()).hexdigest())")


def run_sum(cores: str, **env) -> str:
    out = subprocess.run(["taskset", "-c", cores, sys.executable, "-c", SUM_PROGRAM], env=plain_env(**env),
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_fix_cpu_threads_sets_the_constant_unless_the_environment_names_one():
    assert reproducibility.fix_cpu_threads(env := {}) == str(reproducibility.CPU_THREADS)
    assert env == {"PJRT_NPROC": str(reproducibility.CPU_THREADS)}
    assert reproducibility.fix_cpu_threads({"PJRT_NPROC": "6"}) == "6"
    with pytest.raises(ValueError, match="PJRT_NPROC='two'"):
        reproducibility.fix_cpu_threads({"PJRT_NPROC": "two"})
    assert os.environ["PJRT_NPROC"] == str(reproducibility.CPU_THREADS)  # importing the package set it


def test_fix_cpu_isa_pins_avx2_kernels_and_exact_math_unless_told_otherwise():
    R = reproducibility
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert R.fix_cpu_isa(env, machine="x86_64") == "AVX2"
    assert env["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=8",
                                        "--xla_cpu_enable_platform_dependent_math=false", "--xla_cpu_max_isa=AVX2"]
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert R.fix_cpu_isa(env, machine="x86_64") == "AVX2" and env["XLA_FLAGS"].count("max_isa") == 1  # idempotent
    assert R.kernel_isa(env, machine="x86_64") == ("avx2" if R.cpu_isa() in ("avx512f", "avx2") else R.cpu_isa())
    assert R.kernel_isa(dict(env, XLA_FLAGS="--xla_cpu_max_isa=AVX2"), machine="x86_64") == R.cpu_isa()  # partial
    # the environment's own settings are kept; off x86 only the exact math
    env = {"XLA_FLAGS": "--xla_cpu_max_isa=AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    R.fix_cpu_isa(env, machine="x86_64")
    assert env == {"XLA_FLAGS": "--xla_cpu_max_isa=AVX512 --xla_cpu_enable_platform_dependent_math=false",
                   "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    assert R.kernel_isa(env, machine="x86_64") == R.cpu_isa()
    env = {}
    assert R.fix_cpu_isa(env, machine="aarch64") == "exact math"
    assert env == {"XLA_FLAGS": "--xla_cpu_enable_platform_dependent_math=false"}
    assert R.fix_cpu_isa(env := {"PARAVT_CPU_ISA": "native"}) == "native" and env == {"PARAVT_CPU_ISA": "native"}
    with pytest.raises(ValueError, match="PARAVT_CPU_ISA='avx512'"):
        R.fix_cpu_isa({"PARAVT_CPU_ISA": "avx512"})
    # jaxlib releases older than the flags: nothing set (XLA would abort on an unknown flag)
    assert [R.pin_supported(v) for v in ("0.10.2", "0.11.2", "1.0", "0.9.1", "0.4.38", None, "dev")] == [
        True, True, True, False, False, False, False]
    # importing the package pinned this process
    assert "--xla_cpu_enable_platform_dependent_math=false" in os.environ["XLA_FLAGS"].split()


TRANSPOSED_DOT = ("import hashlib, numpy as np, paravt_jax, jax, jax.numpy as jnp; "
                  "x = jax.random.normal(jax.random.PRNGKey(1), (96, 128), jnp.float32); "
                  "print(hashlib.sha256(np.asarray(jax.jit(lambda x: x.T @ x)(x)).tobytes()).hexdigest())")


def test_the_pin_reaches_onednn_and_xla():
    """A product with a transposed left operand (a weight gradient's) runs in oneDNN, which picks
    its kernel by the host's extension: on an AVX-512 host the pin changes its bits (so the pin is
    in force; on an AVX2 host both are its AVX2 kernel); the exact math changes an RMSNorm's
    reciprocal square root on any x86 host."""
    if not reproducibility.x86_host():
        pytest.skip("the pin's extension is x86-64's")
    def run(program, pin):
        return subprocess.run([sys.executable, "-c", program], env=plain_env(PARAVT_CPU_ISA=pin),
                              capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    if reproducibility.cpu_isa() == "avx512f":
        assert run(TRANSPOSED_DOT, "AVX2") != run(TRANSPOSED_DOT, "native")
    elif reproducibility.cpu_isa() == "avx2":
        assert run(TRANSPOSED_DOT, "AVX2") == run(TRANSPOSED_DOT, "native")
    rsqrt = TRANSPOSED_DOT.replace("lambda x: x.T @ x", "lambda x: jax.lax.rsqrt(x * x + 1)")
    assert run(rsqrt, "AVX2") != run(rsqrt, "native")


def test_a_float32_sum_follows_the_thread_count_not_the_cores():
    """The cause, measured: XLA:CPU's reduction gives other bits with another pool size (so the
    test below can fail); with the package's fixed size, 1 core and 2 give the same bits."""
    needs_two_cores()
    assert run_sum("0", PJRT_NPROC="1") != run_sum("0", PJRT_NPROC="2")
    assert run_sum("0") == run_sum("0,1")


def sft_metrics(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [numbers(json.loads(line)) for line in f]


# sft.train_frames: both SFT steps in one program (the second batch holds 8 frames, the first 4:
# per-batch frame counts would compile a second program, ~11 s)
TINY_RUN = ["--config.sft.steps=2", "--config.sft.batch_size=2", "--config.sft.nframes=2",
            "--config.sft.train_frames=8", "--config.rl.steps=2",
            "--config.rl.samples_per_prompt=2", "--config.rl.prompts_per_step=1",
            "--config.rl.rollout.max_new_tokens=8",
            "--config.rl.rollout.max_turns=1", "--config.rl.rollout.subagent_max_tokens=8", "--config.rl.eval_every=0",
            "--config.evals.held_out.limit=1", "--config.evals.held_out.max_new_tokens=8",
            "--config.evals.held_out.max_turns=1",
            "--config.evals.held_out.nframes=(4,)", "--config.evals.held_out.after_sft=(4,)"]


def tiny_main_job(workdir: str, builtin_root: str) -> dict:
    command = [sys.executable, "-m", "paravt_jax.cli", "run", f"--config={ROOT}/configs/paragrpo.py:tiny",
               f"--workdir={workdir}", f"--config.data.builtin_root={builtin_root}", *TINY_RUN]
    done = subprocess.run(command, env=plain_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(workdir, "rl", "metrics.jsonl")) as f:
        rl = [numbers(json.loads(line)) for line in f]
    with open(os.path.join(workdir, "eval", "episodes.jsonl")) as f:
        episodes = [numbers(json.loads(line)) for line in f]
    timing = ("workdir", "minutes", "training_minutes", "curves", "manifest")
    kept = {k: v for k, v in summary.items() if k not in timing}
    return {"summary": kept,
            "rl": rl, "episodes": episodes, "table": done.stdout, "manifest": summary["manifest"]}


def busy(seconds: float) -> subprocess.Popen:
    """A process that keeps a core busy for `seconds` (the main job's two XLA threads then share
    the machine with it; one spinner, not one a core: the suite's other worker runs beside)."""
    program = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
    return subprocess.Popen([sys.executable, "-c", program], start_new_session=True)


def check_tiny_main_job_twice_the_second_beside_a_busy_process(tmp_path, builtin_root):
    """The tiny main job run twice, the second while another process keeps a core busy:
    the same tables, histories, per-step metrics and episodes (timing aside). Run by
    tests/slow/test_reproducibility.py (~100 s); the default tier checks two runs' bits through
    bench/cpu_threads.py's fixed arms (test_bench) and the manifest in test_cli's main job."""
    first = tiny_main_job(str(tmp_path / "first"), builtin_root)
    load = busy(600)
    try:
        second = tiny_main_job(str(tmp_path / "second"), builtin_root)
    finally:
        os.killpg(load.pid, 9)
        load.wait()
    assert first["table"] == second["table"] and "| yes | 4 |" in first["table"]
    assert first["summary"] == second["summary"]
    assert first["rl"] == second["rl"] and len(first["rl"]) == 2 and "rl/loss" in first["rl"][0]
    assert first["episodes"] == second["episodes"] and first["episodes"]
    # full precision: histories are the metrics files' values, not rounded copies
    assert first["summary"]["rl"][0]["loss"] == first["rl"][0]["rl/loss"]
    for field in ("commit", "dirty", "lock", "packages", "python", "platform", "device", "cpu", "xla_flags",
                  "data", "seed"):
        assert field in first["manifest"], field
    assert first["manifest"]["data"]["content"] and first["manifest"]["seed"] == 0
    assert first["manifest"]["packages"]["jax"] and first["manifest"]["cpu"]["xla_threads"] == "2"
    assert first["manifest"]["cpu"]["malloc"] == os.environ.get("GLIBC_TUNABLES", "")  # speed only: recorded
    assert reproducibility.differences(first["manifest"], second["manifest"]) == []


def test_manifest_differences_put_the_numeric_fields_first():
    a = {"commit": "abc", "cpu": {"usable": 1, "xla_threads": "2", "model": "X"}, "seed": 0}
    b = {"commit": "abd", "cpu": {"usable": 8, "xla_threads": "8", "model": "X"}, "seed": 0}
    assert reproducibility.differences(a, b) == ["commit: 'abc' -> 'abd'", "cpu.xla_threads: '2' -> '8'",
                                                 "cpu.usable: 1 -> 8"]


def test_the_lock_file_is_read_and_checked(tmp_path):
    pins = reproducibility.read_lock(os.path.join(ROOT, reproducibility.LOCK_FILE))
    assert pins["jax"] == "0.10.2" and pins["torch"] == "2.14.1" and "paravt-jax" not in pins
    assert pins["torchvision"] == "0.29.1"
    assert reproducibility.version_matches("2.13.0", "2.13.0+cpu")
    assert not reproducibility.version_matches("2.13.0", "2.14.0")
    bad = tmp_path / "bad.lock"
    bad.write_text("jax>=0.10\n")
    with pytest.raises(ValueError, match=r"bad.lock:1: expected NAME==VERSION"):
        reproducibility.read_lock(str(bad))
    state = reproducibility.lock_state()
    assert state["file"] == "requirements.lock" and len(state["sha256"]) == 16


# ---------------------------------------------------------------- built-in data
SMALL = dict(num_train=2, num_eval=1, durations=(16.0,))


def test_two_generations_of_the_builtin_data_have_one_content_hash(tmp_path):
    from paravt_jax.data.builtin import content_hash, ensure_builtin

    a = ensure_builtin(str(tmp_path / "a"), **SMALL)
    b = ensure_builtin(str(tmp_path / "b"), **SMALL)
    assert a.content == b.content == content_hash(a.root) and len(a.content) == 64
    assert os.path.basename(a.root) == os.path.basename(b.root)  # keyed by arguments and generator
    assert a.identity() == b.identity() and a.identity()["generator"]


def test_a_changed_builtin_set_is_refused_and_new_generator_code_gets_its_own(tmp_path, monkeypatch):
    from paravt_jax.data import builtin

    assets = builtin.ensure_builtin(str(tmp_path), **SMALL)
    with open(os.path.join(assets.data_dir, "rl_eval.parquet"), "ab") as f:
        f.write(b"x")
    with pytest.raises(builtin.BuiltinDataError, match=re.escape(assets.root) + " changed since it was written"):
        builtin.ensure_builtin(str(tmp_path), **SMALL)
    # another generator (its source changed) never finds the set written by the old one
    monkeypatch.setattr(builtin, "generator_hash", lambda package=builtin.PACKAGE: "0" * 16)
    fresh = builtin.ensure_builtin(str(tmp_path), **SMALL)
    assert fresh.root != assets.root and fresh.content == assets.content and fresh.generator == "0" * 16


# ---------------------------------------------------------------- completion order
def test_dispatch_and_subagent_batches_do_not_depend_on_completion_order(tmp_path, monkeypatch):
    """Crops and overviews read with random delays (so they finish in a different order each
    time): the dispatcher's results, the sub-agent batches the sampler receives and the
    rollouts are the same every time."""
    from paravt_jax.agent import dispatch as dispatch_module
    from paravt_jax.agent import rollout as rollout_module
    from paravt_jax.agent.dispatch import CropDispatcher, DispatchConfig
    from paravt_jax.agent.rollout import Episode, RolloutConfig, run_rollouts
    from paravt_jax.data.synthetic import Event, write_video
    from paravt_jax.text.tokenizer import train_tokenizer
    from support.scripted import ScriptedSampler

    video = write_video(str(tmp_path / "v.mp4"), 40.0, [Event(10.0, 14.0, "blue", "circle")], fps=4.0,
                        height=96, width=128, seed=1)
    tokenizer = train_tokenizer(["<think>look</think> the answer is blue crop_video start_time end_time"] * 20)

    def calls(*windows):
        return "<think>look</think>\n" + "\n".join(
            "<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": {"start_time": s, "end_time": e}})
            + "\n</tool_call>" for s, e in windows)

    answer = "<think>done</think>\n<answer>blue</answer>"
    scripts = [[calls((1, 5), (9, 15), (20, 30)), answer], [calls((30, 35), (2, 3)), answer], [answer],
               [calls((12, 13)), answer]]

    def run(seed: int):
        rng = random.Random(seed)
        real_crop, real_overview = dispatch_module.read_frames, rollout_module.read_frames

        def slow(real):
            def read(*args, **kwargs):
                time.sleep(rng.uniform(0.0, 0.05))
                return real(*args, **kwargs)
            return read
        monkeypatch.setattr(dispatch_module, "read_frames", slow(real_crop))
        monkeypatch.setattr(rollout_module, "read_frames", slow(real_overview))
        prompts = []
        sampler = ScriptedSampler(tokenizer, scripts,
                                  summary=lambda text: prompts.append(text) or f"seen {len(prompts)}")
        episodes = [Episode("e0", "What colour?", "blue", "oe", video, nframes=4),
                    Episode("e1", "Which shape?", "circle", "oe", video, nframes=4)]
        with CropDispatcher(DispatchConfig(max_workers=8, max_parallel=3)) as dispatcher:
            rollouts, skipped = run_rollouts(sampler, tokenizer, episodes, 2, RolloutConfig(mode="subagent",
                                             max_turns=2), dispatcher)
        monkeypatch.undo()
        return {"skipped": skipped, "calls": [(c.kind, c.rows, c.seed, c.row_ids) for c in sampler.calls],
                "prompts": prompts, "ids": [r.inputs.input_ids.tolist() for r in rollouts],
                "completions": [r.completion for r in rollouts],
                "frames": [np.asarray(r.inputs.pixel_values).sum() for r in rollouts]}

    runs = [run(seed) for seed in range(3)]
    assert runs[0]["calls"] and [c[0] for c in runs[0]["calls"]].count("subagent") == 1
    assert len(runs[0]["prompts"]) == 6  # 3 + 2 + 1 crops: one sub-agent batch
    for other in runs[1:]:
        assert other == runs[0]


# ---------------------------------------------------------------- report
def test_report_names_the_fields_in_which_the_arms_environments_differ(tmp_path):
    """Arms run under another commit or XLA:CPU thread count are flagged with those fields (the
    seed, which differs by design, and the host's core count, which no longer changes a number,
    are not); an arm without a manifest is named."""
    from paravt_jax.experiments import report

    base = {"commit": "a" * 40, "dirty": False, "lock": {"sha256": "1" * 16}, "packages": {"jax": "0.10.2"},
            "device": {"kind": "cpu"}, "cpu": {"usable": 2, "xla_threads": "2", "model": "X"}, "seed": 0}
    arms = {"paragrpo,seed=0": base, "paragrpo,seed=1": {**base, "seed": 1, "cpu": {**base["cpu"], "usable": 1}},
            "vanilla,seed=0": {**base, "commit": "b" * 40, "cpu": {**base["cpu"], "xla_threads": "8"}},
            "old,seed=0": None}
    for name, manifest in arms.items():
        (tmp_path / "root" / name).mkdir(parents=True)
        summary = {"eval": [], **({"manifest": manifest} if manifest else {})}
        (tmp_path / "root" / name / "summary.json").write_text(json.dumps(summary))
    text = report.write_report([str(tmp_path / "root")], str(tmp_path / "out"))["text"]
    section = text[text.index("## Environment"):]
    assert "No manifest (run before runs recorded one): old,seed=0." in section
    assert "**The arms ran under different environments** in 2 field(s)" in section
    rows = [line.split(" | ")[0].strip("| ") for line in section.splitlines() if line.startswith("| ")][1:]
    assert rows == ["commit", "cpu.xla_threads"]
    same = report.write_report([str(tmp_path / "root" / n) for n in list(arms)[:2]], str(tmp_path / "same"))
    assert "All 2 arms with a manifest ran under one environment: commit aaaaaaaaaaaa" in same["text"]
