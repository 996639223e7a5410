"""Meshes and the ONE table that maps logical axis names to mesh axes.

Every parameter carries logical names in its `axes` metadata (e.g. ("layers", "embed",
"mlp")). `logical_to_spec` turns them into a PartitionSpec with the rules below; changing the
parallelism is a change of mesh shape or rules in the config, never of model code. A dimension
that the mesh axes do not divide is replicated instead.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axis (or tuple of axes, or None = replicated)
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    ("patch", None),
    ("vision_embed", "fsdp"),
    ("vision_heads", "tensor"),
    ("vision_mlp", "tensor"),
    ("vision_merged", "fsdp"),
    ("length", None),
    ("cache_length", None),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = 1
    fsdp: int = -1  # -1: whatever devices are left
    tensor: int = 1


def make_mesh(config: MeshConfig | Mapping[str, int] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh; one entry may be -1 to absorb the remaining devices."""
    if config is None:
        config = MeshConfig()
    if isinstance(config, Mapping):
        config = MeshConfig(**dict(config))
    devices = list(devices if devices is not None else jax.devices())
    sizes = [config.data, config.fsdp, config.tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))}: at most one axis may be -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} does not divide "
                             f"{len(devices)} devices")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
                         f"{len(devices)} available")
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def hybrid_device_array(ici: Mapping[str, int], dcn: Mapping[str, int] | None = None,
                        devices: Sequence | None = None) -> np.ndarray:
    """Devices arranged [data, fsdp, tensor] so that each DCN position holds one whole slice.

    ici: axis sizes inside one slice (TPU ICI) or host (GPU NVLink); dcn: how many slices or
    hosts along each axis (missing axes are 1). Returns an object array of shape ici * dcn.
    A single slice uses the topology-aware `create_device_mesh`; several use
    `create_hybrid_device_mesh`, grouping devices by `slice_index` (TPU multi-slice) or, when
    that does not give dcn-many groups, by `process_index` (one GPU host per process).
    """
    from jax.experimental import mesh_utils

    ici_shape, dcn_shape = [], []
    for part, sizes, shape in (("ici", ici, ici_shape), ("dcn", dcn or {}, dcn_shape)):
        unknown = set(sizes) - set(MESH_AXES)
        if unknown:
            raise ValueError(f"{part} mesh {dict(sizes)}: unknown axes {sorted(unknown)}; "
                             f"use {MESH_AXES}")
        for axis in MESH_AXES:
            size = sizes.get(axis, 1)
            if not isinstance(size, (int, np.integer)) or size < 1:
                raise ValueError(f"{part} mesh {dict(sizes)}: {axis}={size!r} must be a "
                                 f"positive int (no -1 here)")
            shape.append(int(size))
    devices = list(devices if devices is not None else jax.devices())
    if math.prod(ici_shape) * math.prod(dcn_shape) != len(devices):
        raise ValueError(f"mesh ici {dict(zip(MESH_AXES, ici_shape))} x dcn "
                         f"{dict(zip(MESH_AXES, dcn_shape))} needs "
                         f"{math.prod(ici_shape) * math.prod(dcn_shape)} devices, "
                         f"{len(devices)} available")
    slices = math.prod(dcn_shape)
    if slices == 1:
        return mesh_utils.create_device_mesh(ici_shape, devices)
    granules = {attr: len({getattr(d, attr, None) for d in devices})
                for attr in ("slice_index", "process_index")}
    if granules["slice_index"] == slices and hasattr(devices[0], "slice_index"):
        by_process = False
    elif granules["process_index"] == slices:
        by_process = True
    else:
        raise ValueError(f"dcn mesh {dict(zip(MESH_AXES, dcn_shape))} needs {slices} slices or "
                         f"hosts, but the devices come from {granules['slice_index']} slices and "
                         f"{granules['process_index']} processes")
    return mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape, devices,
                                                process_is_granule=by_process)


def make_hybrid_mesh(ici: Mapping[str, int], dcn: Mapping[str, int] | None = None,
                     devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) Mesh of size ici * dcn whose DCN axes cross slices/hosts only
    (see `hybrid_device_array`; presets in configs/meshes.py)."""
    return Mesh(hybrid_device_array(ici, dcn, devices), MESH_AXES)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int] | None = None,
                    mesh: Mesh | None = None, rules=DEFAULT_RULES) -> PartitionSpec:
    """Maps logical names to a PartitionSpec; undivisible dims and reused mesh axes replicate."""
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for dim, name in enumerate(axes):
        target = table.get(name) if name is not None else None
        if name is not None and name not in table:
            raise KeyError(f"logical axis {name!r} has no rule; add it to the rules table")
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        targets = tuple(t for t in targets if t not in used and
                        (mesh is None or mesh.shape[t] > 1))
        if targets and shape is not None and mesh is not None:
            if shape[dim] % math.prod(mesh.shape[t] for t in targets):
                targets = ()
        used.update(targets)
        spec.append(None if not targets else targets[0] if len(targets) == 1 else targets)
    return PartitionSpec(*spec)


def named_sharding(mesh: Mesh, axes: Sequence[str | None], shape: Sequence[int],
                   rules=DEFAULT_RULES) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


def param_axes(variable) -> tuple[str | None, ...]:
    axes = variable.get_metadata().get("axes")
    if axes is None:
        return (None,) * len(variable.get_value().shape)
    return tuple(axes)


def state_shardings(module: nnx.Module, mesh: Mesh, rules=DEFAULT_RULES):
    """An nnx.State of NamedShardings matching `nnx.state(module)`."""
    state = nnx.state(module)

    def one(variable):
        value = variable.get_value()
        return named_sharding(mesh, param_axes(variable), value.shape, rules)

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, ndim: int, batch_axis: int = 0, rules=DEFAULT_RULES,
                   batch_size: int | None = None) -> NamedSharding:
    axes = [None] * ndim
    axes[batch_axis] = "batch"
    shape = None
    if batch_size is not None:
        shape = [1] * ndim
        shape[batch_axis] = batch_size
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh if shape else None, rules))
