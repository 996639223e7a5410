"""The RL step side by side: the previous behaviour (each call's own buckets, one episode per
row) against fixed shapes (rl.shapes, and the preset's packed rows), from the same model and
seed, each arm in its own process (no compiled program is shared between the two).

Prints per arm the median step seconds, the XLA compilations of every step, and the median
time split (rollout, rewards, batch building, reference and proximal log-probs, gradients,
optimizer update), then whether the two arms logged the same metrics step by step (rewards
exactly, losses to a tolerance: padding and packing change the float reduction order).

    python bench/rl_step.py [--config configs/paragrpo.py:toy] [--checkpoint runs/toy/final]
        [--steps 6] [--before="--config.rl.shapes.policy=per_call --config.rl.max_tokens_per_micro_batch=0"]
        [--after=] [--workdir DIR]
        [--extra=--config.rl.eval_every=0]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLIT = ("rollout_s", "reward_s", "batch_s", "ref_logprobs_s", "prox_logprobs_s", "grads_s", "update_s")
# logged the same in both arms when the shapes change nothing but padding
EXACT = ("reward", "acc_reward", "format_compliance", "kappa", "rollouts", "loss_tokens")
CLOSE = ("loss", "grad_norm")
BEFORE = "--config.rl.shapes.policy=per_call --config.rl.max_tokens_per_micro_batch=0"


def run_arm(name: str, args, overrides: list[str], workdir: str) -> list[dict]:
    """Runs `paravt-jax train` for the arm; returns its metrics.jsonl lines."""
    command = [sys.executable, "-m", "paravt_jax.cli", "train", f"--config={args.config}",
               f"--workdir={workdir}", f"--config.rl.steps={args.steps}", *shlex.split(args.extra), *overrides]
    if args.checkpoint:
        command.append(f"--config.model.checkpoint={args.checkpoint}")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=args.cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"[bench] arm {name} failed ({' '.join(command)}):\n"
                         f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    print(f"[bench] arm {name}: {args.steps} steps in {time.perf_counter() - start:.0f} s", flush=True)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def metric(lines: list[dict], key: str) -> list[float]:
    return [float(line.get(f"rl/{key}", 0.0)) for line in lines]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def arm_row(name: str, lines: list[dict], warmup: int) -> list:
    steady = lines[warmup:] or lines
    compiles = [int(c) for c in metric(lines, "compiles")]
    return [name, f"{median(metric(steady, 'step_s')):.2f}", " ".join(map(str, compiles)),
            f"{sum(metric(lines, 'compile_s')):.1f}",
            *(f"{median(metric(steady, key)):.2f}" for key in SPLIT)]


def compare(before: list[dict], after: list[dict], rtol: float, atol: float = 1e-5) -> list[list]:
    """One row per metric: the steps on which the arms differ (exact metrics) or differ by more
    than `rtol` relative and `atol` absolute (losses: an on-policy PPO loss is ~1e-8, noise)."""
    rows = []
    for key in (*EXACT, *CLOSE):
        a, b = metric(before, key), metric(after, key)
        if key in EXACT:
            bad = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        else:
            bad = [i for i, (x, y) in enumerate(zip(a, b)) if abs(x - y) > max(rtol * max(abs(x), abs(y)), atol)]
        rows.append([key, "same" if not bad and len(a) == len(b) else f"differs at steps {bad}"])
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/paragrpo.py:toy")
    parser.add_argument("--checkpoint", default="", help="HF checkpoint to start from (default: the preset's)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--before", default=BEFORE, help="overrides that select the previous behaviour")
    parser.add_argument("--after", default="", help="overrides of the new arm")
    parser.add_argument("--extra", default="--config.rl.eval_every=0", help="overrides of both arms")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the medians")
    parser.add_argument("--rtol", type=float, default=1e-3)
    parser.add_argument("--workdir", default="", help="where the arms' runs go (default: a temporary dir)")
    parser.add_argument("--cwd", default=os.getcwd(), help="the runs' working directory (built-in assets)")
    args = parser.parse_args(argv)
    base = args.workdir or tempfile.mkdtemp(prefix="rl_step_bench_")
    arms = {}
    for name, overrides in (("before", shlex.split(args.before)), ("after", shlex.split(args.after))):
        workdir = os.path.join(base, name)
        if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
            raise SystemExit(f"[bench] {workdir} already holds a run; pass another --workdir")
        arms[name] = run_arm(name, args, overrides, workdir)
    print(f"\n{machine()}; {args.config}, {args.steps} steps, medians over steps >= {args.warmup}")
    print_table("RL step: previous shapes vs bucketed shapes",
                ["arm", "step s", "compiles per step", "compile s", *SPLIT],
                [arm_row(name, lines, args.warmup) for name, lines in arms.items()])
    before, after = median(metric(arms["before"][args.warmup:], "step_s")), \
        median(metric(arms["after"][args.warmup:], "step_s"))
    print(f"\nspeed-up of the median step: {before / max(after, 1e-9):.2f}x")
    print_table("Same metrics, step by step", ["metric", "before vs after"],
                compare(arms["before"], arms["after"], args.rtol))
    return 0


if __name__ == "__main__":
    sys.exit(main())
