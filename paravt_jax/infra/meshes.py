"""Mesh presets: how a named TPU slice or GPU cluster splits into the (data, fsdp, tensor) axes.

Each preset is plain data. `ici` gives the axis sizes inside one fast-interconnect domain (a
TPU slice over ICI, or one GPU host over NVLink); `dcn` gives how many such domains sit along
each axis across the slower data-centre network. The total size of an axis is ici * dcn.

    from paravt_jax.infra import meshes                 # or: python -m paravt_jax.infra.meshes v5p-32
    meshes.get_mesh("2xv5p-128")   # {"ici": {"data": 1, "fsdp": 64, "tensor": 1},
                                   #  "dcn": {"data": 2, "fsdp": 1, "tensor": 1}, "devices": 128, ...}
    meshes.mesh_shape("2xv5p-128") # {"data": 2, "fsdp": 64, "tensor": 1}
    meshes.apply_mesh_preset(config, "v5p-32")   # fills config.mesh with the totals

Defaults suit 2B-32B training: parameters and optimizer state shard over `fsdp` inside a
slice or host (its all-gathers need the fast links); only the gradient all-reduce of `data`
crosses the DCN. The `*_tp2` / `*_tp4` GPU presets add tensor parallelism over NVLink for
32B models whose per-layer activations no longer fit with FSDP alone.

Fields of a preset:
    platform          "tpu" | "gpu"
    accelerator       chip name: "v4", "v5e", "v5p", "h100", "h200"
    accelerator_type  TPU: the `gcloud ... --accelerator-type` of ONE slice; GPU: "" (none)
    slices            fast-interconnect domains: TPU slices, or GPU hosts (NVLink domains)
    hosts             machines (one JAX process each)
    devices           JAX devices in total (TPU chips, GPUs)
    device_memory_gb  HBM per device, for memory planning
    ici, dcn          {"data", "fsdp", "tensor"} sizes, inside / across slices
    description       one line for humans

`python -m paravt_jax.infra.meshes NAME` prints a preset as JSON, `--overrides NAME` the command-line
overrides (`--config.mesh.data=...`) that the launch scripts append for MESH_PRESET=<name>,
`--list` every name. The module needs only the standard library, so the launch scripts run it
on a machine without JAX.
"""
from __future__ import annotations

import copy
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

MESH_AXES = ("data", "fsdp", "tensor")  # the order of paravt_jax.infra.sharding.MESH_AXES

# HBM per device in GB (v5p: 95 GiB usable; H200: 141 GB).
DEVICE_MEMORY_GB = {"v4": 32, "v5e": 16, "v5p": 95, "h100": 80, "h200": 141}
# Devices attached to one host of a multi-host slice. v5e single-host slices of 8 chips are
# the exception (one host with all 8), handled in `_tpu`.
TPU_CHIPS_PER_HOST = {"v4": 4, "v5e": 4, "v5p": 4}
GPUS_PER_HOST = 8


def _axes(data: int = 1, fsdp: int = 1, tensor: int = 1) -> dict[str, int]:
    return {"data": data, "fsdp": fsdp, "tensor": tensor}


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("s" if number != 1 else "")


def _tpu(accelerator: str, chips: int, slices: int = 1, tensor: int = 1) -> dict[str, Any]:
    """A TPU preset: FSDP over the chips of a slice, data parallel across slices."""
    # gcloud names v4/v5p by TensorCores (2 per chip) and v5e by chips.
    if accelerator == "v5e":
        accelerator_type = f"v5litepod-{chips}"
        chips_per_host = chips if chips <= 8 else TPU_CHIPS_PER_HOST["v5e"]
    else:
        accelerator_type = f"{accelerator}-{2 * chips}"
        chips_per_host = min(chips, TPU_CHIPS_PER_HOST[accelerator])
    hosts_per_slice = chips // chips_per_host
    what = f"{slices} x {accelerator_type} (multi-slice)" if slices > 1 else accelerator_type
    return {
        "platform": "tpu", "accelerator": accelerator, "accelerator_type": accelerator_type,
        "slices": slices, "hosts": slices * hosts_per_slice, "devices": slices * chips,
        "device_memory_gb": DEVICE_MEMORY_GB[accelerator],
        "ici": _axes(fsdp=chips // tensor, tensor=tensor), "dcn": _axes(data=slices),
        "description": f"{what}: {slices * chips} chips, {_count(slices * hosts_per_slice, 'host')}; "
                       f"fsdp within a slice" + (", data across slices" if slices > 1 else ""),
    }


def _gpu(accelerator: str, gpus: int, hosts: int = 1, tensor: int = 1) -> dict[str, Any]:
    """A GPU preset: FSDP (x tensor) over the NVLink GPUs of a host, data across hosts."""
    per_host = gpus // hosts
    return {
        "platform": "gpu", "accelerator": accelerator, "accelerator_type": "",
        "slices": hosts, "hosts": hosts, "devices": gpus,
        "device_memory_gb": DEVICE_MEMORY_GB[accelerator],
        "ici": _axes(fsdp=per_host // tensor, tensor=tensor), "dcn": _axes(data=hosts),
        "description": f"{_count(hosts, 'host')} x {per_host} {accelerator.upper()}; fsdp"
                       + (f" x tensor {tensor}" if tensor > 1 else "") + " within a host"
                       + (", data across hosts" if hosts > 1 else ""),
    }


def _gpu_presets(accelerator: str, suffix: str) -> dict[str, dict[str, Any]]:
    table = {f"gpu{n}{suffix}": _gpu(accelerator, n) for n in (1, 2, 4, 8)}
    table[f"gpu16{suffix}"] = _gpu(accelerator, 16, hosts=2)
    for tensor in (2, 4):  # tensor parallel over NVLink for 32B
        table[f"gpu8_tp{tensor}{suffix}"] = _gpu(accelerator, 8, tensor=tensor)
        table[f"gpu16_tp{tensor}{suffix}"] = _gpu(accelerator, 16, hosts=2, tensor=tensor)
    return table


MESHES: dict[str, dict[str, Any]] = {
    # TPU v4 (32 GB/chip), named like gcloud: TensorCores = 2 x chips.
    "v4-8": _tpu("v4", 4),
    "v4-32": _tpu("v4", 16),
    "v4-64": _tpu("v4", 32),
    "v4-128": _tpu("v4", 64),
    # TPU v5e (16 GB/chip), named by chips; gcloud calls them v5litepod-N.
    "v5e-8": _tpu("v5e", 8),
    "v5e-16": _tpu("v5e", 16),
    "v5e-64": _tpu("v5e", 64),
    "v5e-256": _tpu("v5e", 256),
    "2xv5e-256": _tpu("v5e", 256, slices=2),
    # TPU v5p (95 GB/chip), named like gcloud: TensorCores = 2 x chips.
    "v5p-8": _tpu("v5p", 4),
    "v5p-16": _tpu("v5p", 8),
    "v5p-32": _tpu("v5p", 16),
    "v5p-64": _tpu("v5p", 32),
    "v5p-128": _tpu("v5p", 64),
    "v5p-256": _tpu("v5p", 128),
    "2xv5p-128": _tpu("v5p", 64, slices=2),  # 256 TensorCores as two slices over DCN
    # GPUs: plain names are H100 (80 GB); the same layouts on H200 (141 GB) end in -h200.
    **_gpu_presets("h100", ""),
    **_gpu_presets("h200", "-h200"),
}


def validate_mesh(name: str, preset: Mapping[str, Any]) -> None:
    """Raises ValueError naming the preset and field when the layout is inconsistent."""
    for field in ("platform", "accelerator", "slices", "hosts", "devices", "device_memory_gb",
                  "ici", "dcn"):
        if field not in preset:
            raise ValueError(f"mesh preset {name!r}: missing field {field!r}")
    for part in ("ici", "dcn"):
        sizes = preset[part]
        if set(sizes) != set(MESH_AXES):
            raise ValueError(f"mesh preset {name!r}: {part} axes {sorted(sizes)} must be "
                             f"exactly {list(MESH_AXES)}")
        for axis, size in sizes.items():
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"mesh preset {name!r}: {part}.{axis}={size!r} must be a "
                                 f"positive int")
    ici = math.prod(preset["ici"].values())
    dcn = math.prod(preset["dcn"].values())
    if ici * dcn != preset["devices"]:
        raise ValueError(f"mesh preset {name!r}: ici {preset['ici']} x dcn {preset['dcn']} = "
                         f"{ici * dcn} devices, but devices={preset['devices']}")
    # Every DCN position is one whole slice (or host): create_hybrid_device_mesh needs it.
    if dcn != preset["slices"]:
        raise ValueError(f"mesh preset {name!r}: dcn {preset['dcn']} spans {dcn} slices, "
                         f"but slices={preset['slices']}")
    if preset["hosts"] % preset["slices"] or preset["devices"] % preset["hosts"]:
        raise ValueError(f"mesh preset {name!r}: {preset['devices']} devices on "
                         f"{preset['hosts']} hosts in {preset['slices']} slices do not divide")


def get_mesh(name: str) -> dict[str, Any]:
    """A copy of the preset called `name` (so callers may edit it freely)."""
    if name not in MESHES:
        raise KeyError(f"unknown mesh preset {name!r}; known presets: {', '.join(MESHES)}")
    return copy.deepcopy(MESHES[name])


def mesh_shape(preset: str | Mapping[str, Any]) -> dict[str, int]:
    """Total size of each mesh axis (ici x dcn), in MESH_AXES order; `preset` is a name or a
    preset dict. This is what `paravt_jax.infra.sharding.make_mesh` takes."""
    if isinstance(preset, str):
        name, preset = preset, get_mesh(preset)
    else:
        name = "<given>"
    validate_mesh(name, preset)
    return {axis: preset["ici"][axis] * preset["dcn"][axis] for axis in MESH_AXES}


def apply_mesh_preset(config, name: str):
    """Sets config.mesh.{data,fsdp,tensor} to the totals of preset `name`; returns config.

    Only those three fields are written: the others of config.mesh (rollout_devices,
    rollout_axes) describe the rollout side of a split run (assembly.build_rollout_mesh).
    """
    for axis, size in mesh_shape(name).items():
        config.mesh[axis] = size
    return config


def command_line_overrides(name: str) -> list[str]:
    """`--config.mesh.<axis>=<size>` for each axis of preset `name` (what the launchers add)."""
    return [f"--config.mesh.{axis}={size}" for axis, size in mesh_shape(name).items()]


for _name, _preset in MESHES.items():  # a broken table entry fails at import, not on a pod
    validate_mesh(_name, _preset)


def main(argv: list[str]) -> int:
    usage = "usage: python -m paravt_jax.infra.meshes [--overrides] NAME   |   python -m paravt_jax.infra.meshes --list"
    args = argv[1:]
    if args == ["--list"]:
        for name, preset in MESHES.items():
            print(f"{name:<16} {preset['description']}")
        return 0
    overrides = "--overrides" in args
    names = [a for a in args if a != "--overrides"]
    if len(names) != 1 or names[0].startswith("-"):
        print(usage, file=sys.stderr)
        return 2
    try:
        preset = get_mesh(names[0])
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        return 2
    if overrides:
        print("\n".join(command_line_overrides(names[0])))
    else:
        print(json.dumps(dict(preset, shape=mesh_shape(preset)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
