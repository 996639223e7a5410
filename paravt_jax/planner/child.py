"""The planner's child processes: one planner function run in a fresh Python process.

`paravt-jax plan` compiles each program in a child of its own (planner/programs.py `Jobs`), so
host memory does not pile up over a plan's programs in one process: a 32B plan's compiles
reached 18.5 GB in one process on a 24 GB machine; a child's peak is its own program's, and it
returns its memory as it exits. A child is also how the compile gets an environment that XLA
fixes when a process starts (fake CPU devices: XLA_FLAGS; targets.py `target_env`).

The function is named by module and name and must be one of CHILD_FUNCTIONS; it and its
arguments (the very config objects, overrides applied) go to the child over its stdin as a
pickle, and the result comes back through a temporary file with the child's peak resident
memory. A child that fails raises PlanError with its label, its exit status and the end of its
error output (the traceback).
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time

from paravt_jax.planner.workload import PlanError

CHILD_TIMEOUT_S = 3600
# the functions a child may run: "module:name"
CHILD_FUNCTIONS = ("paravt_jax.planner.programs:compile_programs",
                   "paravt_jax.planner.programs:compile_sft_programs",
                   "paravt_jax.planner.programs:program_job")
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TAIL_LINES = 25


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """One child process: what it compiled (label), its wall seconds (start, imports and the
    compile) and its peak resident memory in bytes."""
    label: str
    seconds: float
    peak_bytes: int


def peak_rss_bytes() -> int:
    """This process' peak resident memory: VmHWM of /proc/self/status (the peak of this process
    image; ru_maxrss would carry over the parent's peak through fork and exec), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def child_name(function) -> str:
    name = f"{function.__module__}:{function.__name__}"
    if name not in CHILD_FUNCTIONS:
        raise ValueError(f"run_in_child: {name} is not one of {CHILD_FUNCTIONS}")
    return name


def run_in_child(function, args: tuple, env: dict[str, str], label: str):
    """(function(*args) run in a child Python process with the environment `env`, ChildRun).
    label names what it compiles in errors."""
    name = child_name(function)
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        answer = os.path.join(tmp, "result.pickle")
        try:
            done = subprocess.run([sys.executable, "-m", "paravt_jax.planner.child", answer],
                                  input=pickle.dumps((name, args)), capture_output=True, env=env,
                                  timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PlanError(f"compiling {label} in a child process ran past {CHILD_TIMEOUT_S} s; "
                            "use --activations=estimate") from None
        if done.returncode != 0 or not os.path.exists(answer):
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-_TAIL_LINES:]
            status = (f"signal {-done.returncode}" + (" (killed: out of memory?)" if done.returncode == -9 else "")
                      if done.returncode < 0 else f"exit status {done.returncode}")
            raise PlanError(f"compiling {label} in a child process failed with {status}:\n" + "\n".join(tail))
        with open(answer, "rb") as f:
            result, peak = pickle.load(f)
    return result, ChildRun(label, time.perf_counter() - start, peak)


def _child(answer: str) -> None:
    """The child side of `run_in_child`: ("module:name", args) pickled on stdin; (result, peak
    resident bytes) pickled to `answer`."""
    name, args = pickle.loads(sys.stdin.buffer.read())
    if name not in CHILD_FUNCTIONS:
        raise SystemExit(f"child process: {name!r} is not one of {CHILD_FUNCTIONS}")
    module, function = name.split(":")
    result = getattr(importlib.import_module(module), function)(*args)
    with open(answer, "wb") as f:
        pickle.dump((result, peak_rss_bytes()), f)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("paravt_jax.planner.child runs as `ANSWER` only, started by `paravt-jax plan`")
    _child(sys.argv[1])
