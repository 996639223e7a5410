"""What pinning XLA:CPU's kernels to one vector extension costs, and what it buys: N steps of
the toy SFT (the main job's first phase) with the project's pin (paravt_jax.infra.reproducibility
`fix_cpu_isa`: AVX2 kernels, IEEE-exact square roots) and with the host's own kernels
(PARAVT_CPU_ISA=native, the peer: what runs did before), and, with --emulate, the same on an
emulated CPU of another vector extension (QEMU's user-mode `qemu-x86_64 -cpu MODEL`, e.g. an
AVX2-only EPYC-Rome on an AVX-512 host; Debian's qemu-user; ~100x slower, so fewer steps).

    python bench/cpu_isa.py --steps 20                                # this host, both arms
    python bench/cpu_isa.py --steps 20 --emulate EPYC-Rome --emulated-steps 3
    python bench/cpu_isa.py --steps 2 --config configs/paragrpo.py:tiny   # the suite's size

Prints per arm: the CPU, the kernels' extension, the median step time after the first two steps
(compiles), the process's wall time, and whether its non-timing metrics equal those of the
pinned arm on this host over the steps both ran. Emulated CPUs compute IEEE arithmetic exactly,
so an emulated arm that matches shows the pin's bits do not depend on the host's extension
(the hardware's estimate instructions, which the pin avoids, are the one thing QEMU does not
reproduce bit for bit).
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_table  # noqa: E402
from cpu_threads import run_sft  # noqa: E402
from paravt_jax.infra import reproducibility as R  # noqa: E402

# the environment the pin writes (an arm starts from none of it, so each sets its own)
PIN_ENV = (R.CPU_ISA_ENV, R.ONEDNN_ISA_ENV, "XLA_FLAGS")


def run_arm(pin: str, emulate: str, steps: int, args, workdir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PIN_ENV}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", **{R.CPU_ISA_ENV: pin})
    return run_sft(["qemu-x86_64", "-cpu", emulate] if emulate else [], env, args, steps, workdir)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.path.join(ROOT, "configs/paragrpo.py:toy"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--emulate", default="", help="a QEMU x86 CPU model to run both arms on too (EPYC-Rome)")
    parser.add_argument("--emulated-steps", type=int, default=3)
    parser.add_argument("--extra", default="", help="more --config.* overrides, space-separated")
    args = parser.parse_args(argv)
    if args.emulate and not shutil.which("qemu-x86_64"):
        raise SystemExit("cpu_isa: --emulate needs qemu-x86_64 (Debian: apt-get install qemu-user)")
    if not R.x86_host():
        raise SystemExit(f"cpu_isa: the pin is x86-64's; this host is {platform.machine()}")
    host = f"{R.cpu_model()} ({R.cpu_isa()})"
    arms = [("pinned", host, R.CPU_ISA, ""), ("native", host, "native", "")]
    if args.emulate:
        arms += [("pinned", f"QEMU {args.emulate}", R.CPU_ISA, args.emulate),
                 ("native", f"QEMU {args.emulate}", "native", args.emulate)]
    results = []
    with tempfile.TemporaryDirectory(prefix="paravt-cpu-isa-") as tmp:
        for number, (_, _, pin, emulate) in enumerate(arms):
            steps = args.emulated_steps if emulate else args.steps
            results.append(run_arm(pin, emulate, steps, args, os.path.join(tmp, str(number))))
    reference = results[0]["numbers"]
    rows = []
    for (name, cpu, pin, _), r in zip(arms, results):
        common = min(len(r["numbers"]), len(reference))
        first = next((i for i in range(common) if r["numbers"][i] != reference[i]), None)
        kernels = R.CPU_ISA.lower() if pin != "native" else ("host's (emulated)" if "QEMU" in cpu else R.cpu_isa())
        rows.append([name, cpu, kernels, f"{r['step']:.3f}", f"{r['wall']:.1f}",
                     f"yes ({common} steps)" if first is None else f"no (from step {first})"])
    print_table(f"XLA:CPU vector extension: SFT steps of {os.path.basename(args.config)} ({args.steps} on this "
                f"host, {args.emulated_steps} emulated)",
                ["arm", "CPU", "kernels", "median step s", "process wall s", "metrics = pinned on this host"], rows)


if __name__ == "__main__":
    main()
