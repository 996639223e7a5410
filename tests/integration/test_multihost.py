"""Multi-host runs (paravt_jax.infra.distributed).

The end-to-end check starts real processes on this machine: `paravt-jax run` (RL only, 2 steps)
as 2 processes x 2 CPU devices (localhost coordinator, gloo collectives) and as 1 process x 4
devices (fewer fake devices compile faster: 104 -> 67 s), then compares rollouts, metrics, final
parameters, checkpoints and who wrote which file. That one SPMD train step on a mesh equals the
unsharded step is covered by
tests/integration/test_train_step.py::test_sharded_step_equals_single_device, not repeated here.
"""
import json
import os
import re
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from conftest import FAST_COMPILE, once_per_session
from paravt_jax.infra import distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "support", "multihost_worker.py")
DATA = dict(seed=0, num_train=4, num_eval=1, durations=(30.0,))
STEPS = 2
# Small enough for two CPU cores. kl_ctl = 0: with a KL term the step-0 gradient is the
# difference between sampler and trainer log-probs, i.e. float noise, which Adam would scale up
# to full-size updates that differ from one device layout to the next.
OVERRIDES = [
    "--config=configs/paragrpo.py:tiny", "--config.data.num_train=4", "--config.data.num_eval=1",
    "--config.data.durations=(30.0,)", "--config.sft.steps=0", f"--config.rl.steps={STEPS}",
    "--config.rl.prompts_per_step=2", "--config.rl.samples_per_prompt=2", "--config.rl.rollout.max_new_tokens=4",
    "--config.rl.rollout.max_turns=0", "--config.rl.eval_every=0", "--config.rl.nframes_gating=False",
    "--config.rl.default_nframes=2", "--config.rl.rollout.prompt.overview_max_pixels=3136",
    "--config.rl.advantage.kl_ctl=0.0", "--config.evals.held_out.nframes=()",
]
TIMEOUT_S = 1200


# ----------------------------------------------------------------------------- launching
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env(devices: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARAVT_", "JAX_COORDINATOR"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


def _tail(path: str, lines: int = 30) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def _single_and_multi(root: str) -> None:
    """One process on 4 devices and two processes on 2 each, the same run (`paravt-jax run`)."""
    from paravt_jax.data.builtin import ensure_builtin

    builtin = os.path.join(root, "builtin")
    ensure_builtin(builtin, **DATA)  # once, before any worker could race to create it
    coordinator = f"localhost:{_free_port()}"
    layout = {"single": (os.path.join(root, "single"), 4, [{}]),
              "multi": (os.path.join(root, "multi"), 2, [
                  {"PARAVT_COORDINATOR": coordinator, "PARAVT_NUM_PROCESSES": "2", "PARAVT_PROCESS_ID": str(i)}
                  for i in range(2)])}
    _run_workers(layout, "run", [f"--config.data.builtin_root={builtin}"])


@pytest.fixture(scope="module")
def runs():
    """The runs, made once per session whichever pytest-xdist workers take this module's tests."""
    from paravt_jax.data.builtin import ensure_builtin

    root = once_per_session("multihost", _single_and_multi)
    return {"single": os.path.join(root, "single"), "multi": os.path.join(root, "multi"),
            "model_dir": ensure_builtin(os.path.join(root, "builtin"), **DATA).model_dir}


def _run_workers(layout: dict, command: str, extra_flags: list[str]) -> None:
    """Starts every worker of `layout` ({name: (base dir, devices, [env per process])}) on
    `paravt-jax command` with OVERRIDES + extra_flags and waits for all of them to exit 0."""
    procs, logs = [], []
    start = time.perf_counter()
    for base, devices, envs in layout.values():
        os.makedirs(base)
        for i, extra in enumerate(envs):
            logs.append(os.path.join(base, f"log_{i}.txt"))
            argv = [sys.executable, WORKER, os.path.join(base, "out"), command, f"--workdir={base}/work",
                    *OVERRIDES, *extra_flags]
            procs.append(subprocess.Popen(argv, cwd=ROOT, env=_env(devices, **extra),
                                          stdout=open(logs[-1], "w"), stderr=subprocess.STDOUT))
    try:
        for proc, log in zip(procs, logs):
            proc.wait(timeout=max(1.0, TIMEOUT_S - (time.perf_counter() - start)))
            if proc.returncode:
                pytest.fail(f"worker exited with {proc.returncode}; {log}:\n{_tail(log)}")
    except subprocess.TimeoutExpired:
        pytest.fail(f"workers still running after {TIMEOUT_S} s:\n" + "\n".join(_tail(log, 10) for log in logs))
    finally:
        for proc in procs:  # a worker whose peer died would wait for it: stop it
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"\n[multihost] {len(procs)} worker processes finished in {time.perf_counter() - start:.0f} s")


def _json(path: str):
    with open(path) as f:
        return json.load(f)


def _metrics(run: str) -> list[dict]:
    with open(os.path.join(run, "work", "rl", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _params(path: str) -> dict:
    from safetensors.numpy import load_file

    return load_file(path)


# ----------------------------------------------------------------------------- end to end
def test_two_processes_sample_the_rollouts_of_one(runs):
    """Process p samples the p-th half of each step's prompts, with random streams that follow
    the global row index: together they produce exactly the single-process rollouts."""
    single = _json(os.path.join(runs["single"], "out", "rollouts_0.json"))
    parts = [_json(os.path.join(runs["multi"], "out", f"rollouts_{i}.json")) for i in range(2)]
    assert len(single) == STEPS and all(len(p) == STEPS for p in parts)
    for step in range(STEPS):
        one, two = single[step], parts[0][step] + parts[1][step]
        assert len(parts[0][step]) == len(parts[1][step]) == len(one) // 2 == 2
        assert [(r["episode"], r["sample"], r["tokens"]) for r in two] == \
               [(r["episode"], r["sample"], r["tokens"]) for r in one]
        for a, b in zip(one, two):
            np.testing.assert_allclose(b["logprobs"], a["logprobs"], atol=1e-5)


def test_two_processes_train_the_parameters_of_one(runs):
    one, two = _metrics(runs["single"]), _metrics(runs["multi"])
    assert [m["step"] for m in two] == list(range(STEPS))  # one line per step: process 0 alone logs
    for a, b in zip(one, two):
        for key in ("rl/rollouts", "rl/loss_tokens", "rl/reward", "rl/response_length"):
            assert a[key] == b[key], key
        np.testing.assert_allclose([b["rl/loss"], b["rl/grad_norm"]], [a["rl/loss"], a["rl/grad_norm"]],
                                   rtol=1e-4, atol=1e-6)
    # Without a learning signal both runs would only apply weight decay and agree trivially.
    assert max(m["rl/grad_norm"] for m in one) > 0.1, "no step had a reward spread: pick other settings"
    initial = _params(os.path.join(runs["model_dir"], "model.safetensors"))
    final_one = _params(os.path.join(runs["single"], "work", "final", "model.safetensors"))
    final_two = _params(os.path.join(runs["multi"], "work", "final", "model.safetensors"))
    assert sorted(final_one) == sorted(final_two) == sorted(initial)
    moved = difference = 0.0
    for name in initial:
        # Adam divides by sqrt(v): where a gradient is ~0, summation-order rounding between the two
        # device layouts moves single elements by a few 1e-6; the sum below bounds the whole update.
        np.testing.assert_allclose(final_two[name], final_one[name], rtol=1e-5, atol=1e-5, err_msg=name)
        update_one, update_two = final_one[name] - initial[name], final_two[name] - initial[name]
        moved += np.abs(update_one).sum()
        difference += np.abs(update_two - update_one).sum()
    assert difference < 1e-3 * moved, (difference, moved)  # the updates, not just the weights, agree


def test_only_process_zero_writes_files(runs):
    """Metrics, the final model, the summary and the curves come from process 0; process 1
    writes nothing but its own part of the (multi-host) checkpoint."""
    work = os.path.join(runs["multi"], "work")
    checkpoints = os.path.join(work, "rl", "checkpoints") + os.sep
    writes_one = _json(os.path.join(runs["multi"], "out", "writes_1.json"))
    stray = [(event, path) for event, path in writes_one
             if path.startswith(work) and not path.startswith(checkpoints)
             and not (event == "os.mkdir" and path == work)]
    assert stray == [], stray
    # (the audit hook sees Python-level writes; safetensors and orbax write from native code)
    written_zero = {path for event, path in _json(os.path.join(runs["multi"], "out", "writes_0.json"))
                    if event == "open"}
    for name in ("rl/metrics.jsonl", "summary.json", "curves.png"):  # summary.json: a temporary file renamed
        assert any(path.startswith(os.path.join(work, name)) for path in written_zero), name
    assert any(path.startswith(os.path.join(work, "final") + os.sep) for path in written_zero)
    for name in ("config.json", "model.safetensors"):
        assert os.path.isfile(os.path.join(work, "final", name)), name

    def files(run_work):
        out = set()
        for directory, _, names in os.walk(run_work):
            rel = os.path.relpath(directory, run_work)
            if not rel.startswith(os.path.join("rl", "checkpoints")):
                out |= {os.path.join(rel, n) if not n.startswith("events.out") else os.path.join(rel, "events")
                        for n in names}
        return out

    assert files(work) == files(os.path.join(runs["single"], "work"))
    events = os.listdir(os.path.join(work, "rl", "tensorboard"))
    assert len(events) == 1, events


def test_only_process_zero_logs_progress(runs):
    """Progress is logged once (paravt_jax/infra/logs.py): process 0's log has the per-step lines and the
    run's notices; process 1's has no INFO line, and whatever it warns names it."""
    def log_lines(index):
        with open(os.path.join(runs["multi"], f"log_{index}.txt"), errors="replace") as f:
            return f.read().splitlines()

    line = re.compile(r"^([DIWEF])\d{4} \d\d:\d\d:\d\d (.*)")
    zero = [m.groups() for m in map(line.match, log_lines(0)) if m]
    one = [m.groups() for m in map(line.match, log_lines(1)) if m]
    messages = [text for level, text in zero if level == "I"]
    for step in range(STEPS):
        assert sum(text.startswith(f"[rl/ {step}/{STEPS}] ") for text in messages) == 1, messages
    assert any(text.startswith("[run] done in ") for text in messages), messages
    assert [text for level, text in one if level == "I"] == []
    assert all(text.startswith("[process 1] ") for _, text in one), one


def test_checkpoint_written_by_two_processes_restores(runs):
    """Both processes took part in the save (orbax): the checkpoint is complete, and restores
    (here in one process) to the single-process run's state."""
    from paravt_jax.infra.checkpointing import Checkpointer
    from paravt_jax.models.qwen3_vl import load_pretrained
    from paravt_jax.sft.objective import HEAD, sft_loss
    from paravt_jax.train.step import OptimizerConfig, TrainStep

    target = TrainStep(load_pretrained(runs["model_dir"]), OptimizerConfig(), sft_loss, HEAD).init_state()
    restored = {}
    for name in ("single", "multi"):
        checkpoints = Checkpointer(os.path.join(runs[name], "work", "rl", "checkpoints"), async_save=False)
        assert checkpoints.latest_step() == STEPS
        restored[name] = checkpoints.restore_latest(target)
        checkpoints.close()
    (state_one, meta_one), (state_two, meta_two) = restored["single"], restored["multi"]
    assert meta_two == meta_one == {"next_step": STEPS, "cursor": 2 * STEPS, "seed": 0}
    assert int(state_two.step) == int(state_one.step) == STEPS
    for a, b in zip(jax.tree.leaves(state_one.params), jax.tree.leaves(state_two.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)  # see the final-model comparison


# ----------------------------------------------------------------------------- pieces
@pytest.fixture
def no_tpu(monkeypatch):
    monkeypatch.setattr(dist, "_on_tpu_vm", lambda environ: False)


def test_resolve_reads_the_environment_then_the_config(no_tpu):
    import ml_collections

    env = {"PARAVT_COORDINATOR": "10.0.0.2:1234", "PARAVT_NUM_PROCESSES": "4", "PARAVT_PROCESS_ID": "3"}
    assert dist.resolve(None, {}) == dist.Launch("single")
    assert dist.resolve(None, env) == dist.Launch("explicit", "10.0.0.2:1234", 4, 3)
    config = ml_collections.ConfigDict({"distributed": {"coordinator": "head:99", "num_processes": 2,
                                                        "process_id": 0}})
    assert dist.resolve(config, {}) == dist.Launch("explicit", "head:99", 2, 0)
    # per field, the variable wins: a shared config and a per-process id from the launcher
    assert dist.resolve(config, {"PARAVT_PROCESS_ID": "1"}) == dist.Launch("explicit", "head:99", 2, 1)
    assert dist.resolve(None, {"PARAVT_NUM_PROCESSES": "1"}) == dist.Launch("single")
    assert dist.resolve(ml_collections.ConfigDict({"seed": 0}), {}) == dist.Launch("single")


@pytest.mark.parametrize("env,message", [
    ({"PARAVT_COORDINATOR": "h:1", "PARAVT_NUM_PROCESSES": "2"}, "PARAVT_PROCESS_ID"),
    ({"PARAVT_COORDINATOR": "nohost", "PARAVT_NUM_PROCESSES": "2", "PARAVT_PROCESS_ID": "0"},
     "PARAVT_COORDINATOR='nohost'"),
    ({"PARAVT_COORDINATOR": "h:1", "PARAVT_NUM_PROCESSES": "2", "PARAVT_PROCESS_ID": "2"}, "PARAVT_PROCESS_ID=2"),
    ({"PARAVT_COORDINATOR": "h:1", "PARAVT_NUM_PROCESSES": "two", "PARAVT_PROCESS_ID": "0"},
     "PARAVT_NUM_PROCESSES='two'"),
])
def test_resolve_names_what_is_missing_or_wrong(no_tpu, env, message):
    with pytest.raises(ValueError, match=message):
        dist.resolve(None, env)


def test_tpu_pod_environment_means_auto_detection():
    assert dist.resolve(None, {"TPU_WORKER_HOSTNAMES": "w0,w1"}).mode == "tpu"
    assert dist.resolve(None, {"MEGASCALE_COORDINATOR_ADDRESS": "w0"}).mode == "tpu"


def test_single_process_helpers_are_identities(no_tpu, monkeypatch):
    for name in ("PARAVT_COORDINATOR", "PARAVT_NUM_PROCESSES", "PARAVT_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    launch = dist.initialize()
    assert launch.num_processes == 1 and dist.initialize() is launch  # idempotent
    assert dist.process_slice(6, "prompts") == slice(0, 6)
    assert dist.allgather_objects({"a": 1}) == [{"a": 1}]
    assert dist.is_primary()


def test_row_ids_make_samples_independent_of_the_batch_split():
    """What lets each process sample only its own prompts: row b's random stream is
    fold_in(seed, row_ids[b]), so rows 2-3 of a two-prompt call come out the same when the
    second prompt is sampled alone with row_ids [2, 3]."""
    from paravt_jax.models.qwen3_vl import init_model, preset
    from paravt_jax.sampling import Sampler, SamplingParams
    from paravt_jax.text.inputs import encode_ids

    sampler = Sampler(init_model(preset("tiny"), seed=3))
    first, second = encode_ids([5, 17, 29, 41], 0, trainable=False), encode_ids([7, 11, 13], 0, trainable=False)
    kwargs = dict(sampling=SamplingParams(max_new_tokens=6, temperature=1.0), seed=11)
    whole, _ = sampler.generate([first, second], num_samples=2, **kwargs)
    alone, _ = sampler.generate([second], num_samples=2, row_ids=[2, 3], **kwargs)
    assert alone.tokens == whole.tokens[2:]
    np.testing.assert_allclose(np.concatenate(alone.logprobs), np.concatenate(whole.logprobs[2:]), atol=1e-5)
    unaligned, _ = sampler.generate([second], num_samples=2, **kwargs)  # streams 0-1: other samples
    assert unaligned.tokens != whole.tokens[2:]
