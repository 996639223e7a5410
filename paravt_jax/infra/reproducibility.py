"""Same commit, config, seed and packages, same numbers: XLA:CPU's thread count fixed, and the
manifest every run records so that two runs' environments can be told apart.

**The CPU thread count.** XLA:CPU splits reductions and matrix products over the threads of its
intra-op pool (YNNPACK's reduce and dot kernels and Eigen's contractions partition the work by
the pool's size), and the pool is as large as the CPUs the process may use. A float32 sum over
1M values therefore differs in its last bits between a 1-core and a 2-core process, and 600
steps of the toy SFT grow that into different models (held-out accuracy 0.625 vs 0.938, same
commit, config, seed, data and packages). The pool's size is read from `PJRT_NPROC` when the
CPU client starts; `fix_cpu_threads` (called when the package is imported) sets it to
CPU_THREADS unless the environment already names a count. Two threads are what the reference
2-core machine always ran with, so its numbers stay as they were; on 1 core the two threads
share it (measured in docs/benchmarks.md#reproducibility), on a larger machine set
`PJRT_NPROC=<cores>` for speed, knowing that numbers then match only runs with the same value
(the manifest records it, and `paravt-jax report` names the difference). Accelerator programs do
not run on that pool: GPU and TPU runs are unaffected.

**The vector extension.** XLA:CPU's kernels are picked for the host: oneDNN's matrix products
(those with a transposed left operand, as every weight gradient has) dispatch on the CPU's
widest extension at run time, and an AVX-512 host sums them in another order than an AVX2 host;
the reciprocal square root (every RMSNorm) is XLA's "platform-dependent math", a hardware
estimate (`vrsqrt14ps` on AVX-512, `vrsqrtps` on AVX2, whose bits differ between vendors) refined
by a Newton step. On 2026-12-07 an AVX2 host and an AVX-512 host ran the same main job into
cold starts 0.04-0.05 apart. `fix_cpu_isa` (called when the package is imported) therefore pins
one extension, CPU_ISA, on every x86-64 host: ONEDNN_MAX_CPU_ISA=AVX2 and XLA's
`--xla_cpu_max_isa=AVX2` (LLVM's own code), and `--xla_cpu_enable_platform_dependent_math=false`
on every host (the square root and a division: IEEE-exact everywhere). Measured: every probe
program and the toy's SFT steps give an AVX-512 host's bits on an emulated AVX2 CPU (qemu,
`bench/cpu_isa.py`). `PARAVT_CPU_ISA=native` leaves the host's own choice, for speed, knowing
that numbers then match only hosts with the same `cpu.isa`; a setting already in the
environment is kept. A host older than AVX2 with FMA computes other bits (recorded: `cpu.isa`).

**The manifest** (`manifest()`): commit and dirty flag, the lock file's hash and whether the
installed packages match it, the numeric packages' versions, Python, platform, the JAX device
kind and count, the CPU model and vector extension, the usable CPU count and XLA:CPU's thread
count, glibc's allocator settings (GLIBC_TUNABLES: speed only), XLA_FLAGS, the data's content
hash and the seed. `differences()` lists the fields in which two manifests differ, those that
may change a number first. Not fixed, only recorded: another CPU
architecture (ARM's kernels are their own; `platform`), an x86 host without AVX2 (`cpu.isa`), the
pin turned off (`cpu.kernels`: the extension the kernels use), another package set (`lock`,
`packages`), another PJRT_NPROC (`cpu.xla_threads`).
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

CPU_THREADS_ENV = "PJRT_NPROC"  # XLA's PJRT CPU client sizes its intra-op pool by it
CPU_THREADS = 2
# the checkout: this file is paravt_jax/infra/reproducibility.py
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCK_FILE = "requirements.lock"  # exact versions of every package, written by launch/lock.sh
# The packages whose versions can change a number (compilers, kernels, decoders, tokenizers).
NUMERIC_PACKAGES = ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax", "optax",
                    "orbax-checkpoint", "numpy", "ml_dtypes", "scipy", "transformers", "tokenizers", "safetensors",
                    "decord", "av", "pillow", "pyarrow", "grain", "tensorflow-datasets", "torch")
# Fields whose difference may change a metric; the rest (paths, hostnames) only describe.
NUMERIC_FIELDS = ("commit", "dirty", "lock.sha256", "lock.matches", "packages.", "device.", "cpu.xla_threads",
                  "cpu.kernels", "xla_flags", "data.", "seed", "python")
# x86 vector extensions, widest first (the manifest's `cpu.isa`)
ISA_FLAGS = ("avx512f", "avx2", "avx", "sse4_2")
# The extension every x86-64 host computes with (fix_cpu_isa); PARAVT_CPU_ISA=native: the host's own
CPU_ISA = "AVX2"
CPU_ISA_ENV = "PARAVT_CPU_ISA"
ONEDNN_ISA_ENV = "ONEDNN_MAX_CPU_ISA"  # read by oneDNN when it first dispatches a kernel
MAX_ISA_FLAG = "--xla_cpu_max_isa"
EXACT_MATH_FLAG = "--xla_cpu_enable_platform_dependent_math"
# XLA aborts a process on a flag it does not know: the pin's flags are set only for jaxlib
# releases known to have them (0.10.2 checked here; the exact-math flag is DebugOptions field 425)
PIN_JAXLIB = (0, 10)


def fix_cpu_threads(environ: dict | None = None) -> str:
    """Sets PJRT_NPROC to CPU_THREADS unless the environment names a count; returns the count.
    Effective only before JAX starts its CPU client (the first use of a device)."""
    environ = os.environ if environ is None else environ
    value = environ.setdefault(CPU_THREADS_ENV, str(CPU_THREADS))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{CPU_THREADS_ENV}={value!r}: expected a positive thread count")
    return value


def pin_supported(jaxlib: str | None) -> bool:
    """Whether a jaxlib release knows the pin's XLA flags (PIN_JAXLIB or newer)."""
    try:
        return jaxlib is not None and tuple(int(p) for p in jaxlib.split(".")[:2]) >= PIN_JAXLIB
    except ValueError:
        return False


def x86_host(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ("x86_64", "amd64")


def fix_cpu_isa(environ: dict | None = None, machine: str | None = None) -> str:
    """Pins XLA:CPU's kernels to one vector extension (see the module's docstring) unless
    PARAVT_CPU_ISA=native: on x86-64, ONEDNN_MAX_CPU_ISA and XLA's max ISA set to CPU_ISA, and on
    every host the platform-dependent math off, each only where the environment does not already
    name it. Returns the pin ("AVX2", "native", or "exact math" off x86); "native" too under a
    jaxlib older than PIN_JAXLIB, which would abort on the flags. Effective only before JAX starts
    its CPU client and oneDNN its first kernel."""
    environ = os.environ if environ is None else environ
    pin = environ.get(CPU_ISA_ENV, CPU_ISA)
    if pin == "native":
        return pin
    if pin != CPU_ISA:
        raise ValueError(f"{CPU_ISA_ENV}={pin!r}: expected {CPU_ISA!r} (the default) or 'native'")
    if not pin_supported(installed_version("jaxlib")):
        return "native"
    flags = environ.get("XLA_FLAGS", "").split()
    named = {flag.split("=", 1)[0] for flag in flags}
    extra = [f"{EXACT_MATH_FLAG}=false"]
    if x86_host(machine):
        extra.append(f"{MAX_ISA_FLAG}={CPU_ISA}")
        environ.setdefault(ONEDNN_ISA_ENV, CPU_ISA)
    flags += [flag for flag in extra if flag.split("=", 1)[0] not in named]
    environ["XLA_FLAGS"] = " ".join(flags)
    return CPU_ISA if x86_host(machine) else "exact math"


def git_state(directory: str = REPOSITORY) -> dict[str, Any]:
    """{"commit", "dirty"} of the checkout holding this package; commit "unknown" outside one
    (an installed wheel). Dirty: tracked files differ from the commit (untracked files such as
    runs/ are not counted)."""
    def git(*args):
        return subprocess.run(["git", "-C", directory, *args], capture_output=True, text=True, timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": "unknown", "dirty": None}
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": "unknown", "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def read_lock(path: str) -> dict[str, str]:
    """name (lower case, '_' as '-') -> version of a lock file's `name==version` lines."""
    pins = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, sep, version = line.partition("==")
            if not sep or not name.strip() or not version.strip():
                raise ValueError(f"{path}:{number}: expected NAME==VERSION, got {line!r}")
            pins[normal_name(name)] = version.strip()
    return pins


def normal_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def version_matches(pinned: str, installed: str) -> bool:
    """A pin without a local label matches any local build of it (2.13.0 matches 2.13.0+cpu)."""
    return installed == pinned or ("+" not in pinned and installed.split("+", 1)[0] == pinned)


def lock_state(directory: str = REPOSITORY) -> dict[str, Any]:
    """The lock file's hash and whether every locked package that is installed has its version
    (packages of extras not installed are not counted)."""
    path = os.path.join(directory, LOCK_FILE)
    if not os.path.isfile(path):
        return {"file": None, "sha256": None, "matches": None}
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    mismatched = []
    for name, version in sorted(read_lock(path).items()):
        have = installed_version(name)
        if have is not None and not version_matches(version, have):
            mismatched.append(f"{name} {have} (locked {version})")
    return {"file": LOCK_FILE, "sha256": digest, "matches": not mismatched, "mismatched": mismatched}


@functools.cache
def cpuinfo(field: str) -> str | None:
    """The first value of `field` in /proc/cpuinfo (None where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_isa() -> str:
    """The widest x86 vector extension the CPU has (ISA_FLAGS), else the machine's name."""
    flags = set((cpuinfo("flags") or "").split())
    return next((isa for isa in ISA_FLAGS if isa in flags), platform.machine())


def kernel_isa(environ: Mapping[str, str] | None = None, machine: str | None = None) -> str:
    """The vector extension XLA:CPU's kernels compute with: CPU_ISA (lower case) where the whole
    pin (fix_cpu_isa: oneDNN, LLVM and the exact math) holds on a host that has it, else the
    host's own (`cpu_isa`)."""
    environ = os.environ if environ is None else environ
    host = cpu_isa()
    flags = environ.get("XLA_FLAGS", "").split()
    pinned = (x86_host(machine) and environ.get(ONEDNN_ISA_ENV) == CPU_ISA
              and {f"{MAX_ISA_FLAG}={CPU_ISA}", f"{EXACT_MATH_FLAG}=false"} <= set(flags))
    return CPU_ISA.lower() if pinned and host in ("avx512f", "avx2") else host


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def device_state() -> dict[str, Any]:
    import jax

    devices = jax.devices()
    return {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices),
            "processes": jax.process_count()}


def manifest(seed: int | None = None, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What produced a run's numbers (see the module's docstring). Starts JAX's backend."""
    return {
        **git_state(),
        "lock": lock_state(),
        "packages": {name: version for name in NUMERIC_PACKAGES if (version := installed_version(name))},
        "python": platform.python_version(),
        "platform": f"{sys.platform} {platform.machine()}",
        "device": device_state(),
        "cpu": {"model": cpu_model(), "isa": cpu_isa(), "usable": usable_cpus(),
                "xla_threads": os.environ.get(CPU_THREADS_ENV, "unset (one per usable CPU)"),
                "kernels": kernel_isa(),
                "malloc": os.environ.get("GLIBC_TUNABLES", "")},
        "xla_flags": " ".join(sorted(os.environ.get("XLA_FLAGS", "").split())),
        "data": dict(data or {}),
        "seed": seed,
    }


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def differing_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The dotted fields two manifests differ in; those that may change a number
    (NUMERIC_FIELDS) first."""
    x, y = flatten(a), flatten(b)
    keys = [k for k in sorted(set(x) | set(y)) if x.get(k, "<absent>") != y.get(k, "<absent>")]
    numeric = [k for k in keys if any(k == f or (f.endswith(".") and k.startswith(f)) for f in NUMERIC_FIELDS)]
    return numeric + [k for k in keys if k not in numeric]


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """`field: a -> b` for every field of `differing_fields`."""
    x, y = flatten(a), flatten(b)
    return [f"{k}: {x.get(k, '<absent>')!r} -> {y.get(k, '<absent>')!r}" for k in differing_fields(a, b)]
