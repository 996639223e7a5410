"""The toy's SFT on one core and on two (the slow tier: ~60 s; the default tier checks the same
fixed XLA:CPU thread count on the tiny model in tests/integration/test_bench.py's
bench/cpu_threads.py run and in tests/integration/test_reproducibility.py); the tiny main job
twice, the second beside a busy process (~100 s)."""
import json
import subprocess
import sys

from integration.test_reproducibility import (
    ROOT,
    check_tiny_main_job_twice_the_second_beside_a_busy_process,
    needs_two_cores,
    plain_env,
    sft_metrics,
)
from paravt_jax.infra import reproducibility


def test_toy_sft_steps_identical_on_one_core_and_on_two(tmp_path, builtin_root):
    """Five toy SFT steps (the main job's first phase) in two processes at once, one pinned to a
    core and one on two: identical losses and gradient norms (before the fix they parted at
    step 2). Without taskset's core set they would share the machine the same way."""
    needs_two_cores()
    processes = {}
    for name, cores in (("one", "0"), ("two", "0,1")):
        command = ["taskset", "-c", cores, sys.executable, "-m", "paravt_jax.cli", "sft",
                   f"--config={ROOT}/configs/paragrpo.py:toy", "--config.sft.steps=5",
                   f"--config.data.builtin_root={builtin_root}", f"--workdir={tmp_path / name}"]
        log = open(tmp_path / f"{name}.log", "w")
        processes[name] = (subprocess.Popen(command, env=plain_env(), stdout=log, stderr=subprocess.STDOUT), log)
    for name, (process, log) in processes.items():
        assert process.wait(timeout=900) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
        log.close()
    one, two = sft_metrics(tmp_path / "one"), sft_metrics(tmp_path / "two")
    assert len(one) == len(two) == 5 and "sft/grad_norm" in one[0]
    assert "sft/vision_cache_mib" in one[0]  # the toy's frozen tower: features cached (sft/vision_cache.py)
    for step, (a, b) in enumerate(zip(one, two)):
        assert a == b, f"step {step}: {a} != {b}"
    manifests = [json.load(open(tmp_path / name / "run_config.json"))["manifest"] for name in ("one", "two")]
    assert [m["cpu"]["usable"] for m in manifests] == [1, 2]
    assert manifests[0]["cpu"]["xla_threads"] == manifests[1]["cpu"]["xla_threads"] == "2"
    assert [d.split(":")[0] for d in reproducibility.differences(*manifests)] == ["cpu.usable"]


def test_tiny_main_job_twice_the_second_beside_a_busy_process(tmp_path, builtin_root):
    check_tiny_main_job_twice_the_second_beside_a_busy_process(tmp_path, builtin_root)
