"""The RL step side by side: the previous behaviour (each call's own buckets, one episode per
row) against fixed shapes (rl.shapes, and the preset's packed rows), from the same model and
seed, each arm in its own process (no compiled program is shared between the two).

Prints per arm the median step seconds (wall, and the process's CPU seconds, which other jobs
on a shared machine disturb less), the XLA compilations of every step, and the median
time split (rollout, rewards, an asynchronous trainer's wait for episodes, batch building,
reference and proximal log-probs, gradients, optimizer update), then whether the two arms
logged the same metrics step by step (rewards exactly, losses to a tolerance: padding and
packing change the float reduction order).

    python bench/rl_step.py [--phase rl|sft] [--config configs/paragrpo.py:toy]
        [--checkpoint runs/toy/final] [--steps 6] [--before=OVERRIDES] [--after=OVERRIDES]
        [--extra=--config.rl.eval_every=0] [--parallel] [--workdir DIR] [--title TEXT]

Synchronous against asynchronous rollouts (docs/scale-out.md), on 8 fake CPU devices:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/rl_step.py --before= \
        --after="--config.mesh.rollout_devices=4 --config.rl.max_staleness=1" --title="sync vs async"
(the arms then sample different policies from step 1 on: the metrics table says so).

--before defaults to the phase's previous behaviour: rl `--config.rl.shapes.policy=per_call
--config.rl.max_tokens_per_micro_batch=0 --config.rl.step.prox_logprobs=recompute
--config.model.attention_block=512`, sft `--config.sft.train_width=0
--config.sft.train_frames=0`.
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
# per phase: the command, the step-count field, the time split, the metrics both arms must log
# alike (exactly, and to a tolerance: padding and packing change the float reduction order)
PHASES = {
    "rl": dict(command="train", steps="rl.steps",
               split=("rollout_s", "reward_s", "data_wait_s", "batch_s", "ref_logprobs_s", "prox_logprobs_s",
                      "grads_s", "update_s"),
               exact=("reward", "acc_reward", "format_compliance", "kappa", "rollouts", "loss_tokens"),
               close=("loss", "grad_norm"),
               before="--config.rl.shapes.policy=per_call --config.rl.max_tokens_per_micro_batch=0 "
                      "--config.rl.step.prox_logprobs=recompute --config.model.attention_block=512"),
    "sft": dict(command="sft", steps="sft.steps", split=("grads_s", "update_s"), exact=("loss_tokens",),
                close=("loss", "grad_norm"), before="--config.sft.train_width=0 --config.sft.train_frames=0"),
}


def start_arm(args, overrides: list[str], workdir: str) -> tuple[subprocess.Popen, list[str]]:
    """Starts the arm's `paravt-jax train` (or `sft`) in its own process."""
    phase = PHASES[args.phase]
    command = [sys.executable, "-m", "paravt_jax.cli", phase["command"], f"--config={args.config}",
               f"--workdir={workdir}", f"--config.{phase['steps']}={args.steps}", *shlex.split(args.extra),
               *overrides]
    if args.checkpoint:
        command.append(f"--config.model.checkpoint={args.checkpoint}")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(command, env=env, cwd=args.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True), command


def finish_arm(name: str, process: subprocess.Popen, command: list[str], workdir: str, start: float) -> list[dict]:
    """Waits for the arm; returns its metrics.jsonl lines."""
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"[bench] arm {name} failed ({' '.join(command)}):\n{stdout[-3000:]}\n{stderr[-6000:]}")
    print(f"[bench] arm {name}: done after {time.perf_counter() - start:.0f} s", flush=True)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def metric(lines: list[dict], key: str, phase: str) -> list[float]:
    return [float(line.get(f"{phase}/{key}", 0.0)) for line in lines]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def arm_row(name: str, lines: list[dict], warmup: int, phase: str) -> list:
    steady = lines[warmup:] or lines
    compiles = [int(c) for c in metric(lines, "compiles", phase)]
    return [name, *(f"{median(metric(steady, key, phase)):.2f}" for key in ("step_s", "step_cpu_s")),
            " ".join(map(str, compiles)),
            f"{sum(metric(lines, 'compile_s', phase)):.1f}",
            *(f"{median(metric(steady, key, phase)):.2f}" for key in PHASES[phase]["split"])]


# absolute floors: an on-policy PPO loss is ~1e-8 and a step whose groups all scored alike has
# a gradient norm of ~1e-3, both float noise
ATOL = {"loss": 1e-5, "grad_norm": 1e-2}


def compare(before: list[dict], after: list[dict], phase: str, rtol: float) -> list[list]:
    """One row per metric: the steps on which the arms differ (exact metrics) or differ by more
    than `rtol` relative and the metric's ATOL absolute (losses, gradient norms)."""
    rows = []
    for key in (*PHASES[phase]["exact"], *PHASES[phase]["close"]):
        a, b = metric(before, key, phase), metric(after, key, phase)
        if key in PHASES[phase]["exact"]:
            bad = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        else:
            bad = [i for i, (x, y) in enumerate(zip(a, b))
                   if abs(x - y) > max(rtol * max(abs(x), abs(y)), ATOL.get(key, 1e-5))]
        rows.append([key, "same" if not bad and len(a) == len(b) else f"differs at steps {bad}"])
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=sorted(PHASES), default="rl")
    parser.add_argument("--config", default="configs/paragrpo.py:toy")
    parser.add_argument("--checkpoint", default="", help="HF checkpoint to start from (default: the preset's)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--before", default=None, help="overrides that select the previous behaviour "
                                                       "(default: the phase's)")
    parser.add_argument("--after", default="", help="overrides of the new arm")
    parser.add_argument("--title", default="previous shapes vs fixed shapes", help="what the arms compare")
    parser.add_argument("--extra", default="--config.rl.eval_every=0", help="overrides of both arms")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the medians")
    # losses and gradient norms of an on-policy PPO step sum terms near the clip boundary, where
    # the float order of another padding moves a token's ratio: 1e-3 on the toy, 2e-3 on tiny
    # over 8 fake devices
    parser.add_argument("--rtol", type=float, default=1e-2)
    parser.add_argument("--parallel", action="store_true",
                        help="run both arms at once (a busy machine slows both alike)")
    parser.add_argument("--workdir", default="", help="where the arms' runs go (default: a temporary dir)")
    parser.add_argument("--cwd", default=os.getcwd(), help="the runs' working directory (built-in assets)")
    args = parser.parse_args(argv)
    phase = args.phase
    before = PHASES[phase]["before"] if args.before is None else args.before
    base = args.workdir or tempfile.mkdtemp(prefix=f"{phase}_step_bench_")
    arms, running = {}, []
    for name, overrides in (("before", shlex.split(before)), ("after", shlex.split(args.after))):
        workdir = os.path.join(base, name)
        if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
            raise SystemExit(f"[bench] {workdir} already holds a run; pass another --workdir")
        start = time.perf_counter()
        process, command = start_arm(args, overrides, workdir)
        running.append((name, process, command, workdir, start))
        if not args.parallel:
            arms[name] = finish_arm(*running.pop())
    for arm in running:
        arms[arm[0]] = finish_arm(*arm)
    print(f"\n{machine()}; {args.config}, {args.steps} {phase} steps, medians over steps >= {args.warmup}"
          f"{', arms run at once' if args.parallel else ''}")
    print_table(f"{phase.upper()} step: {args.title}",
                ["arm", "step s", "step CPU s", "compiles per step", "compile s", *PHASES[phase]["split"]],
                [arm_row(name, lines, args.warmup, phase) for name, lines in arms.items()])
    for key, what in (("step_s", "step"), ("step_cpu_s", "step's CPU time")):
        times = {name: median(metric(lines[args.warmup:], key, phase)) for name, lines in arms.items()}
        print(f"speed-up of the median {what}: {times['before'] / max(times['after'], 1e-9):.2f}x")
    print_table("Same metrics, step by step", ["metric", "before vs after"],
                compare(arms["before"], arms["after"], phase, args.rtol))
    return 0


if __name__ == "__main__":
    sys.exit(main())
