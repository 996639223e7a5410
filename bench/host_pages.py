"""What backing glibc's allocator with transparent huge pages buys on a CPU: N steps of the toy
SFT (the main job's first phase) or of its PARA-GRPO (`--phase rl`, from `--checkpoint`) in
processes with glibc's default allocator (the peer) and with
`GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (what launch/local.sh and launch/test.sh set), the arms
alternated `--repeats` times so that a slow minute of the machine falls on both.

    python bench/host_pages.py --steps 60 --repeats 2   # the toy preset
    python bench/host_pages.py --phase rl --checkpoint runs/toy/final --steps 16 --repeats 2
    python bench/host_pages.py --steps 2 --repeats 1 --config configs/paragrpo.py:tiny   # the suite's size

XLA:CPU allocates a step's buffers afresh (large ones by mmap, returned at free), so every step
faults its working set in again, 4 KiB at a time; with the tunable glibc asks the kernel for
2 MiB pages (madvise MADV_HUGEPAGE), honoured where transparent huge pages are "madvise" or
"always" (/sys/kernel/mm/transparent_hugepage/enabled, printed in the title). Prints per arm and
repeat: the median step time after the first two steps (compiles), the process's wall and
system seconds, its minor page faults, and whether its non-timing metrics equal those of the
first default-allocator run (where a page lives cannot change a number: they must).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_table  # noqa: E402
from cpu_threads import read_run  # noqa: E402

HUGE_PAGES = "glibc.malloc.hugetlb=1"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def tunables(huge: bool) -> str:
    """GLIBC_TUNABLES for an arm: the caller's, without the huge-page tunable, and with it when asked."""
    kept = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":")
            if t and not t.startswith("glibc.malloc.hugetlb")]
    return ":".join(kept + [HUGE_PAGES] if huge else kept)


def transparent_huge_pages() -> str:
    """The kernel's setting (the bracketed word), or why it is unknown."""
    try:
        with open(THP_SETTING) as f:
            text = f.read()
    except OSError:
        return "unknown (no " + THP_SETTING + ")"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else text.strip()


# per phase: the command that runs it alone and its step count
PHASES = {"sft": ("sft", "sft.steps"), "rl": ("train", "rl.steps")}


def run_arm(huge: bool, args, workdir: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", GLIBC_TUNABLES=tunables(huge))
    command_name, steps = PHASES[args.phase]
    command = [sys.executable, "-m", "paravt_jax.cli", command_name, f"--config={args.config}",
               f"--config.{steps}={args.steps}", f"--workdir={workdir}", *args.extra.split()]
    if args.checkpoint:
        command.append(f"--config.model.checkpoint={args.checkpoint}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"host_pages: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return {"wall": wall, "faults": after.ru_minflt - before.ru_minflt, "system": after.ru_stime - before.ru_stime,
            **read_run(workdir, args.phase)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.path.join(ROOT, "configs/paragrpo.py:toy"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each arm, alternated")
    parser.add_argument("--extra", default="", help="more --config.* overrides, space-separated")
    parser.add_argument("--phase", choices=sorted(PHASES), default="sft",
                        help="sft (`paravt-jax sft`) or rl (`paravt-jax train`: PARA-GRPO alone)")
    parser.add_argument("--checkpoint", default="", help="HF checkpoint the arms start from (default: the preset's)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error(f"--steps {args.steps} and --repeats {args.repeats} must be at least 1")
    arms = [(repeat, huge) for repeat in range(args.repeats) for huge in (False, True)]
    results = []
    with tempfile.TemporaryDirectory(prefix="paravt-host-pages-") as tmp:
        for number, (_, huge) in enumerate(arms):
            results.append(run_arm(huge, args, os.path.join(tmp, str(number))))
    reference = results[0]["numbers"]
    rows = []
    for (repeat, huge), r in zip(arms, results):
        first = next((i for i, (a, b) in enumerate(zip(r["numbers"], reference)) if a != b), None)
        same = "yes" if r["numbers"] == reference else f"no (from step {first})"
        rows.append([repeat + 1, HUGE_PAGES if huge else "glibc default (peer)", f"{r['step']:.3f}", f"{r['wall']:.1f}",
                     f"{r['system']:.1f}", f"{r['faults'] / 1e6:.2f}", same])
    for huge in (False, True):
        steps = [r["step"] for (_, h), r in zip(arms, results) if h == huge]
        rows.append(["median", HUGE_PAGES if huge else "glibc default (peer)", f"{statistics.median(steps):.3f}",
                     "", "", "", ""])
    print_table(f"Host allocator pages: {args.steps} {args.phase.upper()} steps of {os.path.basename(args.config)}, "
                f"{len(os.sched_getaffinity(0))} usable cores, transparent huge pages {transparent_huge_pages()}",
                ["run", "allocator", "median step s", "process wall s", "system s", "minor faults (M)",
                 "metrics = first peer run"], rows)


if __name__ == "__main__":
    main()
