"""Where the planner's programs compile: the targets (cpu-fake, tpu, gpu, local, auto), their
resolution for a mesh preset, the devices each compiles for and the environment of a child
process that compiles for them (planner/programs.py compiles; the module docstring there says
what each target is)."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Mapping

import jax

from paravt_jax.planner import gpu_target

TARGETS = ("auto", "cpu-fake", "tpu", "gpu", "local")
GPUS_PER_HOST = 8  # an axis list planned for GPUs: hosts of 8 (meshes.GPUS_PER_HOST)
# Chips per side of a TPU torus: v4 / v5p slices are 3-D (gcloud's topologies), v5e / v6e 2-D.
_TPU_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8),
           256: (4, 8, 8), 512: (8, 8, 8)}
_TPU_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}


class TargetError(ValueError):
    """A target that cannot be used (no libtpu, a GPU preset under tpu, too few local devices)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the planner's programs are compiled. name: cpu-fake | tpu | gpu | local (resolved);
    topology: the TPU topology (tpu), the CUDA plugin's "slices x hosts x devices" (gpu);
    slices: TPU slices; platform: the platform whose kernels and sampler policy are planned
    (tpu, gpu); accelerator: the GPU model compiled for (gpu: a gpu_target.GPUS key)."""
    name: str
    platform: str
    topology: str = ""
    slices: int = 1
    accelerator: str = ""

    @property
    def compiler(self) -> str:
        return {"tpu": "tpu", "gpu": "gpu", "cpu-fake": "xla:cpu"}.get(self.name, compiler_of(self.platform))


# The target that compiles a target's unrolled trainer cost programs, where not the target itself
COST_TARGETS = {"gpu": Target("cpu-fake", "gpu")}


def compiler_of(platform: str) -> str:
    """The compiler's name in plans: "tpu" (libtpu), "gpu" (XLA:GPU), else "xla:<platform>"."""
    return platform if platform in ("tpu", "gpu") else f"xla:{platform}"


def libtpu_available() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def tpu_topology(accelerator: str, chips_per_slice: int) -> str:
    """The topology name libtpu takes for one slice (`v5p` with 8 chips -> `v5p:2x2x2`)."""
    table = _TPU_3D if accelerator in ("v4", "v5p") else _TPU_2D
    if accelerator not in ("v4", "v5p", "v5e", "v6e"):
        raise TargetError(f"no TPU topology for accelerator {accelerator!r}")
    if chips_per_slice not in table:
        raise TargetError(f"no {accelerator} topology of {chips_per_slice} chips; known: {sorted(table)}")
    return f"{accelerator}:" + "x".join(str(n) for n in table[chips_per_slice])


def resolve_target(target: str, preset: Mapping | None, accelerator: str = "") -> Target:
    """The Target of `--target` for a mesh preset (paravt_jax/infra/meshes.py entry; None for an explicit
    axis list, which plans for gpu's kernels; under --target=gpu on `accelerator`, default h100)."""
    if target not in TARGETS:
        raise TargetError(f"--target={target!r}: expected one of {', '.join(TARGETS)}")
    platform = preset["platform"] if preset else "gpu"
    if target == "auto":
        target = ("tpu" if platform == "tpu" and libtpu_available() else
                  "gpu" if platform == "gpu" and preset is not None and gpu_target.missing() is None else "cpu-fake")
    if target == "gpu":
        return resolve_gpu(preset, accelerator)
    if target == "tpu":
        return resolve_tpu(preset)
    if target == "local":
        return Target("local", jax.devices()[0].platform)
    return Target("cpu-fake", platform)


def resolve_tpu(preset: Mapping | None) -> Target:
    """The tpu Target of a TPU mesh preset: its topology per slice and its slices."""
    if preset is None or preset["platform"] != "tpu":
        raise TargetError("--target=tpu needs a TPU mesh preset (--mesh=v5p-16, ...), not "
                          + (f"the {preset['platform']} preset" if preset else "an axis list"))
    if not libtpu_available():
        raise TargetError("--target=tpu needs libtpu: pip install 'paravt_jax[tpu]' (jax[tpu])")
    chips = preset["devices"] // preset["slices"]
    return Target("tpu", "tpu", tpu_topology(preset["accelerator"], chips), preset["slices"])


def resolve_gpu(preset: Mapping | None, accelerator: str = "") -> Target:
    """The gpu Target of a GPU mesh preset (its GPU model and hosts) or, for an axis list, of
    one host of `accelerator` GPUs (h100 by default) per 8 devices."""
    if preset is not None and preset["platform"] != "gpu":
        raise TargetError(f"--target=gpu needs a GPU mesh preset (--mesh=gpu8, ...), not the {preset['platform']} "
                          "preset")
    accelerator = preset["accelerator"] if preset else (accelerator or "h100")
    if accelerator not in gpu_target.GPUS:
        raise TargetError(f"--target=gpu: no target config for GPU {accelerator!r}; known: "
                          f"{', '.join(gpu_target.GPUS)}")
    why = gpu_target.missing()
    if why:
        raise TargetError(f"--target=gpu needs XLA:GPU here: {why}")
    topology = gpu_target.gpu_topology(preset["hosts"], preset["devices"], preset["slices"]) if preset else ""
    return Target("gpu", "gpu", topology, accelerator=accelerator)


def gpu_topology_of(devices: int) -> str:
    """The topology of an axis list's `devices` GPUs: hosts of GPUS_PER_HOST (one host below
    that or when they do not divide), each an NVLink domain of its own."""
    hosts = devices // GPUS_PER_HOST if devices % GPUS_PER_HOST == 0 else 1
    return gpu_target.gpu_topology(max(hosts, 1), devices)


def tpu_devices(topology: str, slices: int = 1) -> list:
    """The devices of a TPU topology, made by libtpu in this CPU process (nothing runs on them)."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata server to ask: we are not on a TPU VM
    # another process may hold libtpu's lock file; compiling needs no exclusive TPU access
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    options = {"num_slices": slices} if slices > 1 else {}
    return list(topologies.get_topology_desc(topology_name=topology, platform="tpu", **options).devices)


# XLA:CPU flags of every cpu-fake compile. Its concurrency-optimized scheduler (the default)
# starts independent work as early as it can for the CPU's threads: in an fsdp program every
# layer's weight all-gather up front, all live at once (the 32B's sub-agent prefill on 16 fake
# devices: 76 GiB of temporaries, 0.71 GiB under the memory-minimizing scheduler). No
# accelerator compiler schedules that way (theirs bound the memory of overlapped collectives).
# Only for compiling: a multi-device program run under it deadlocked XLA:CPU's collectives once
# (bench/vision_shards.py), so processes that run programs keep the default.
CPU_FAKE_XLA_FLAGS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)


def cpu_fake_flags_set(xla_flags: str) -> bool:
    """Whether XLA_FLAGS hold CPU_FAKE_XLA_FLAGS (fixed when a process starts XLA)."""
    return all(flag in xla_flags.split() for flag in CPU_FAKE_XLA_FLAGS)


def child_xla_flags(xla_flags: str, devices: int) -> str:
    """The child's XLA_FLAGS: this process' own, with CPU_FAKE_XLA_FLAGS and `devices` fake
    devices in place of any values of theirs."""
    own = {f.split("=")[0] for f in CPU_FAKE_XLA_FLAGS} | {"--xla_force_host_platform_device_count"}
    flags = [f for f in xla_flags.split() if f.split("=")[0] not in own]
    return " ".join(flags + [*CPU_FAKE_XLA_FLAGS, f"--xla_force_host_platform_device_count={devices}"])


def accelerator_devices(target: Target, devices: int) -> list:
    """The compile-only devices of a tpu or gpu target (libtpu's topology, the CUDA plugin's)."""
    if target.name == "tpu":
        found = tpu_devices(target.topology, target.slices)
        if len(found) != devices:
            raise TargetError(f"topology {target.topology} x {target.slices} has {len(found)} devices, "
                              f"the mesh {devices}")
        return found
    topology = target.topology or gpu_topology_of(devices)
    found = gpu_target.gpu_devices(target.accelerator, topology)
    if len(found) != devices:
        raise TargetError(f"GPU topology {topology} has {len(found)} devices, the mesh {devices}")
    return found


def target_devices(target: Target, devices: int) -> list | None:
    """The devices to compile for; None: fake CPU devices in a child process (too few here, or
    this process' XLA lacks CPU_FAKE_XLA_FLAGS)."""
    if target.name in ("tpu", "gpu"):
        return accelerator_devices(target, devices)
    local = jax.devices()
    if target.name == "local":
        if len(local) < devices:
            raise TargetError(f"--target=local: the mesh has {devices} devices, this process "
                              f"{len(local)} ({local[0].platform})")
        return local[:devices]
    if local[0].platform == "cpu" and len(local) >= devices and cpu_fake_flags_set(os.environ.get("XLA_FLAGS", "")):
        return local[:devices]
    return None


def target_env(target: Target, devices: int) -> dict[str, str]:
    """The environment of a child process compiling for `target`: this process' own, with
    fake CPU devices and CPU_FAKE_XLA_FLAGS for cpu-fake (XLA fixes both when a process starts);
    for tpu the child makes the topology's devices as `tpu_devices` does here."""
    env = dict(os.environ)
    if target.name == "cpu-fake":
        env["XLA_FLAGS"] = child_xla_flags(env.get("XLA_FLAGS", ""), devices)
        env["JAX_PLATFORMS"] = "cpu"
    elif target.name == "tpu":
        env.setdefault("TPU_SKIP_MDS_QUERY", "1")
        env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    elif target.name == "gpu":
        # the CUDA plugin makes its compile-only devices without a CUDA runtime only so
        env["JAX_PLATFORMS"] = "cpu"
    else:
        raise TargetError(f"--target={target.name} compiles in this process (its own devices), not in a child")
    return env

