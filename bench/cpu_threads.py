"""What fixing XLA:CPU's thread count costs, and what it buys: N steps of the toy SFT (the main
job's first phase) in processes pinned to 1 core and to every core, each with XLA:CPU's pool
as the machine would size it (one thread per usable core: the peer, what runs did before) and
with the project's fixed count (paravt_jax.infra.reproducibility.CPU_THREADS, PJRT_NPROC).

    python bench/cpu_threads.py --steps 20            # the toy preset, 20 SFT steps per arm
    python bench/cpu_threads.py --steps 2 --config configs/paragrpo.py:tiny --arms fixed   # the suite's size

Prints per arm: cores, XLA:CPU threads, the median step time after the first two steps
(compiles), the process's wall time, and whether its non-timing metrics equal those of the
fixed count on every core (the reference arm): the machine-sized pool on 1 core differs, the
fixed count on 1 core does not.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_table  # noqa: E402
from paravt_jax.infra import reproducibility  # noqa: E402

TIMING_SUFFIXES = ("_s", "compiles", "compiles_total", "compile_s")


def numbers(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "time" and not k.endswith(TIMING_SUFFIXES)}


def read_run(workdir: str, phase: str = "sft") -> dict:
    """A training workdir's median step seconds of `phase` (sft, rl; after the first two steps,
    their compiles) and each step's non-timing metrics."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    key = f"{phase}/step_s"
    steps = [r[key] for r in records[2:]] or [r[key] for r in records]
    return {"step": statistics.median(steps), "numbers": [numbers(r) for r in records]}


def run_sft(prefix: list[str], env: dict, args, steps: int, workdir: str) -> dict:
    """`steps` SFT steps of args.config (+ args.extra) in a fresh process started under `prefix`
    (taskset, an emulator) with `env`: its wall seconds and `read_run`."""
    command = [*prefix, sys.executable, "-m", "paravt_jax.cli", "sft", f"--config={args.config}",
               f"--config.sft.steps={steps}", f"--workdir={workdir}", *args.extra.split()]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{os.path.basename(sys.argv[0])}: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return {"wall": wall, **read_run(workdir)}


def run_arm(cores: str, threads: int, args, workdir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != reproducibility.CPU_THREADS_ENV}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", PJRT_NPROC=str(threads))
    return run_sft(["taskset", "-c", cores], env, args, args.steps, workdir)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.path.join(ROOT, "configs/paragrpo.py:toy"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--extra", default="", help="more --config.* overrides, space-separated")
    parser.add_argument("--arms", choices=("all", "fixed"), default="all",
                        help="fixed: only the fixed count's two arms (their bit-for-bit check, the suite's run)")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    every = ",".join(map(str, cores))
    fixed = reproducibility.CPU_THREADS
    arms = [("every core", every, len(cores), "machine-sized (before)"), ("every core", every, fixed, "fixed"),
            ("1 core", str(cores[0]), 1, "machine-sized (before)"), ("1 core", str(cores[0]), fixed, "fixed")]
    if args.arms == "fixed":
        arms = [arm for arm in arms if arm[3] == "fixed"]
    results = {}
    with tempfile.TemporaryDirectory(prefix="paravt-cpu-threads-") as tmp:
        for number, (_, core_set, threads, _) in enumerate(arms):
            results[number] = run_arm(core_set, threads, args, os.path.join(tmp, str(number)))
    reference = results[arms.index(("every core", every, fixed, "fixed"))]["numbers"]
    rows = []
    for number, (where, _, threads, kind) in enumerate(arms):
        r = results[number]
        same = r["numbers"] == reference
        first = next((i for i, (a, b) in enumerate(zip(r["numbers"], reference)) if a != b), None)
        rows.append([where, f"{threads} ({kind})", f"{r['step']:.3f}", f"{r['wall']:.1f}",
                     "yes" if same else f"no (from step {first})"])
    print_table(f"XLA:CPU thread count: {args.steps} SFT steps of {os.path.basename(args.config)} on "
                f"{reproducibility.cpu_model()}, {len(cores)} usable cores",
                ["cores", "XLA:CPU threads", "median step s", "process wall s", "metrics = fixed count on every core"],
                rows)


if __name__ == "__main__":
    main()
