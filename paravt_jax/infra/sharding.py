"""Meshes and the ONE table that maps logical axis names to mesh axes.

Every parameter carries logical names in its `axes` metadata (e.g. ("layers", "embed",
"mlp")). `logical_to_spec` turns them into a PartitionSpec with the rules below; changing the
parallelism is a change of mesh shape or rules in the config, never of model code. A dimension
that the mesh axes do not divide is replicated instead.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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


def parse_mesh(text: str) -> dict[str, int]:
    """`data=1,fsdp=8,tensor=1` -> sizes for `mesh_sizes` (missing axes 1; one may be -1)."""
    sizes: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"mesh {text!r}: expected AXIS=SIZE pairs like data=1,fsdp=8,tensor=1")
        if name in sizes:
            raise ValueError(f"mesh {text!r}: axis {name!r} given twice")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise ValueError(f"mesh {text!r}: size of {name!r} is {value!r}, not an integer") from None
    return mesh_sizes(sizes)


def mesh_sizes(sizes: Mapping[str, int], devices: int | None = None) -> dict[str, int]:
    """Checked (data, fsdp, tensor) sizes: missing axes are 1; one axis may be -1, the devices
    left over (filled when `devices` is given). With `devices`, the product must equal it.
    Raises ValueError naming the axis or the count."""
    unknown = sorted(set(sizes) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"mesh {dict(sizes)}: unknown axis {unknown[0]!r}; axes are {', '.join(MESH_AXES)}")
    out = {}
    for axis in MESH_AXES:
        size = sizes.get(axis, 1)
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or (size < 1 and size != -1):
            raise ValueError(f"mesh {dict(sizes)}: size of {axis!r} must be an integer >= 1 (or -1), got {size!r}")
        out[axis] = int(size)
    free = [axis for axis, size in out.items() if size == -1]
    if len(free) > 1:
        raise ValueError(f"mesh {out}: at most one axis may be -1")
    if free and devices is not None:
        known = math.prod(s for s in out.values() if s != -1)
        if devices % known:
            raise ValueError(f"mesh {out} does not divide {devices} devices")
        out[free[0]] = devices // known
    if devices is not None and math.prod(out.values()) != devices:
        raise ValueError(f"mesh {out} has {math.prod(out.values())} devices, {devices} available")
    return out


def make_mesh(sizes: Mapping[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all); see `mesh_sizes`."""
    devices = list(devices if devices is not None else jax.devices())
    shape = mesh_sizes(sizes if sizes is not None else {"fsdp": -1}, len(devices))
    return Mesh(np.asarray(devices).reshape([shape[a] for a in MESH_AXES]), MESH_AXES)


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
    (see `hybrid_device_array`; presets in paravt_jax/infra/meshes.py)."""
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


def param_shardings(params, mesh, rules=DEFAULT_RULES):
    """The NamedSharding of every parameter: a tree shaped like `params` (an nnx.State of
    Variables, concrete or abstract)."""
    return jax.tree.map(lambda v: named_sharding(mesh, param_axes(v), v.get_value().shape, rules),
                        params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _key_name(key) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def optimizer_shardings(opt_state, params, mesh, rules=DEFAULT_RULES):
    """A NamedSharding for every leaf of `opt_state` (a tree shaped like it). A leaf that
    mirrors a parameter (its path ends with the parameter's path and it has the parameter's
    shape: Adam's mu and nu) takes that parameter's sharding: the moments are as large as the
    model, replicated they would not fit. Other leaves (step counts) are replicated."""
    by_path = {}
    for path, variable in nnx.to_flat_state(params):
        value = variable.get_value()
        by_path[tuple(str(p) for p in path)] = (tuple(value.shape),
                                                named_sharding(mesh, param_axes(variable), value.shape, rules))
    replicated = NamedSharding(mesh, PartitionSpec())

    def one(keys, leaf):
        path = tuple(name for name in map(_key_name, keys) if name != "value")
        for start in range(len(path)):
            if path[start:] in by_path:
                shape, sharding = by_path[path[start:]]
                return sharding if shape == tuple(leaf.shape) else replicated
        return replicated

    return jax.tree_util.tree_map_with_path(one, opt_state)


def row_constraint(mesh: Mesh | None, batch_axis: int = 0, rules=DEFAULT_RULES):
    """A function x -> x pinned with its `batch_axis` split over the mesh's batch axes
    (data, fsdp) where they divide it, every other axis whole; the identity without a mesh.

    The train step applies it to the decoder's layer carry: without it XLA lays activations out
    like the parameters they meet (the embedding dimension over fsdp), so every device would
    hold every row's MLP intermediates instead of its own rows'."""
    if mesh is None:
        return lambda x: x

    def constrain(x: jax.Array) -> jax.Array:
        axes = [None] * x.ndim
        axes[batch_axis] = "batch"
        return jax.lax.with_sharding_constraint(x, named_sharding(mesh, axes, x.shape, rules))

    return constrain


def batch_devices(mesh: Mesh | None, rules=DEFAULT_RULES) -> int:
    """How many ways the logical batch axis splits on `mesh` (data x fsdp by default): a batch
    whose size this does not divide is replicated on every device (`logical_to_spec`)."""
    if mesh is None:
        return 1
    target = dict(rules).get("batch")
    targets = (target,) if isinstance(target, str) else tuple(target or ())
    return math.prod(mesh.shape[t] for t in targets)


def batch_sharding(mesh: Mesh, ndim: int, batch_axis: int = 0, rules=DEFAULT_RULES,
                   batch_size: int | None = None) -> NamedSharding:
    axes = [None] * ndim
    axes[batch_axis] = "batch"
    shape = None
    if batch_size is not None:
        shape = [1] * ndim
        shape[batch_axis] = batch_size
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh if shape else None, rules))
