"""Multi-host runs: starting the JAX distributed runtime and the few collective helpers the
trainers need.

Who starts what (`initialize`):
  * explicit: the coordinator address (host:port), process count and process id come from the
    environment (`PARAVT_COORDINATOR`, `PARAVT_NUM_PROCESSES`, `PARAVT_PROCESS_ID`, what the
    launch scripts set per process) or, field by field when a variable is unset, from the
    config (`config.distributed.coordinator / num_processes / process_id`). GPU and CPU hosts
    use this; on CPU the cross-process collectives go through gloo.
  * TPU: on a Cloud TPU VM (or GKE TPU pod) with nothing explicit set, JAX's own cluster
    detection finds the coordinator and the process ids: `jax.distributed.initialize()`.
  * otherwise one process, and nothing is started.
`initialize` must run before anything touches JAX devices (the CLI calls it first thing);
calling it again is a no-op.

How a step is split over processes (see `rl/trainer.py`, `sft/trainer.py`): every process
derives the same global prompt list of the step from the step index, takes its contiguous
share (`process_slice`), reads those videos and generates those rollouts on its own devices
(`local_model`), and the scored rollouts of all processes are gathered (`allgather_objects`)
into the global batch, in process order, which is the single-process row order. The train step
then runs as one SPMD program over every device of every process on identical host inputs, so
a multi-process run computes what the single-process run computes.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import os
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

ENV_COORDINATOR = "PARAVT_COORDINATOR"
ENV_NUM_PROCESSES = "PARAVT_NUM_PROCESSES"
ENV_PROCESS_ID = "PARAVT_PROCESS_ID"
# Set by Cloud TPU pod / GKE TPU environments; any of them means "let JAX detect the cluster".
TPU_ENV_MARKERS = ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS")
# Pickled payloads cross processes in pieces of this many bytes (bounds the device buffer).
GATHER_CHUNK_BYTES = 64 << 20
# `to_local` replicates at most this many bytes of parameters on every device at a time.
REPLICATE_GROUP_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class Launch:
    """How this process takes part. mode: single (no runtime), explicit (coordinator, count
    and id given) or tpu (JAX's cluster auto-detection)."""
    mode: str
    coordinator: str = ""
    num_processes: int = 1
    process_id: int = 0


_STARTED: Launch | None = None


# ----------------------------------------------------------------------------- start-up
def _config_fields(config) -> Mapping[str, Any]:
    if config is None:
        return {}
    # an ml_collections config, or a typed one (run_config.RunConfig: its `distributed` mapping)
    section = config.get("distributed", None) if hasattr(config, "get") else getattr(config, "distributed", None)
    if section is None:
        return {}
    return {key: section.get(key, None) for key in ("coordinator", "num_processes", "process_id")}


def _as_int(value, name: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected an integer") from None


def _on_tpu_vm(environ: Mapping[str, str]) -> bool:
    """A Cloud TPU host, judged without loading any JAX backend: the pod environment variables,
    or TPU chips on the PCI bus (/dev/accel* on v2-v4, /dev/vfio/* with libtpu on v5+)."""
    if any(environ.get(name) for name in TPU_ENV_MARKERS):
        return True
    if glob.glob("/dev/accel[0-9]*"):
        return True
    try:
        from jax._src import hardware_utils

        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except Exception:  # private helper: absent or changed in this JAX version
        return False


def resolve(config=None, environ: Mapping[str, str] | None = None) -> Launch:
    """The launch this process is part of, from the environment (first) and the config. Pure:
    starts nothing. Raises ValueError naming the variable or field that is missing or bad."""
    environ = os.environ if environ is None else environ
    fields = _config_fields(config)
    sources = {"coordinator": (ENV_COORDINATOR, "config.distributed.coordinator"),
               "num_processes": (ENV_NUM_PROCESSES, "config.distributed.num_processes"),
               "process_id": (ENV_PROCESS_ID, "config.distributed.process_id")}
    values, names = {}, {}
    for key, (variable, field) in sources.items():
        if environ.get(variable, "") != "":
            values[key], names[key] = environ[variable], variable
        elif fields.get(key) not in (None, ""):
            values[key], names[key] = fields[key], field
    if not values:
        return Launch("tpu") if _on_tpu_vm(environ) else Launch("single")
    count = _as_int(values["num_processes"], names["num_processes"]) if "num_processes" in values else None
    if count is not None and count < 1:
        raise ValueError(f"{names['num_processes']}={count}: expected at least 1 process")
    if count == 1:
        return Launch("single")
    missing = [sources[key][0] + " (or " + sources[key][1] + ")" for key in sources if key not in values]
    if missing:
        given = ", ".join(f"{names[k]}={values[k]!r}" for k in values)
        raise ValueError(f"multi-process launch: {given} set but {', '.join(missing)} missing")
    coordinator = str(values["coordinator"]).strip()
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{names['coordinator']}={coordinator!r}: expected host:port")
    process_id = _as_int(values["process_id"], names["process_id"])
    if not 0 <= process_id < count:
        raise ValueError(f"{names['process_id']}={process_id}: expected 0 <= id < "
                         f"{names['num_processes']}={count}")
    return Launch("explicit", coordinator, count, process_id)


def initialize(config=None) -> Launch:
    """Starts the JAX distributed runtime when this process is one of several (see the module
    docstring); a no-op for a single process and on every call after the first."""
    global _STARTED
    if _STARTED is not None:
        return _STARTED
    import jax
    from jax._src import xla_bridge

    launch = resolve(config)
    if launch.mode == "single" or jax.distributed.is_initialized():
        _STARTED = launch
        return launch
    if xla_bridge.backends_are_initialized():
        if launch.mode == "tpu":  # e.g. an interactive session that already used the chips
            _STARTED = Launch("single")
            return _STARTED
        raise RuntimeError(f"paravt_jax.infra.distributed.initialize({launch}) must run before anything "
                           "touches JAX devices; call it first thing in the program")
    if launch.mode == "tpu":
        jax.distributed.initialize()
    else:
        # CPU processes talk through gloo (without it cross-process CPU collectives fail); the
        # option only concerns the CPU client, so it is harmless on GPU hosts.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(launch.coordinator, launch.num_processes, launch.process_id)
    _STARTED = dataclasses.replace(launch, num_processes=jax.process_count(), process_id=jax.process_index())
    return _STARTED


# ----------------------------------------------------------------------------- who am I
def process_count() -> int:
    import jax

    return jax.process_count()


def process_index() -> int:
    import jax

    return jax.process_index()


def is_primary() -> bool:
    """Process 0: the one that writes metrics, plots, summaries and exported models."""
    return process_index() == 0


def barrier(name: str) -> None:
    """Every process waits here until all arrive (no-op for one process)."""
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def process_slice(total: int, what: str = "items") -> slice:
    """This process's contiguous share of `total` items (process p gets the p-th of
    process_count() equal parts, so the concatenation in process order is the global order)."""
    count, index = process_count(), process_index()
    if total % count:
        raise ValueError(f"{what}={total} does not split evenly over {count} processes")
    size = total // count
    return slice(index * size, (index + 1) * size)


# ----------------------------------------------------------------------------- host data
def _gather_sizes(size: int) -> np.ndarray:
    from jax.experimental import multihost_utils

    # Two int32 halves: without jax_enable_x64 an int64 would be narrowed on the way.
    parts = np.asarray([size >> 30, size & ((1 << 30) - 1)], np.int32)
    gathered = np.asarray(multihost_utils.process_allgather(parts)).astype(np.int64)
    return (gathered[:, 0] << 30) + gathered[:, 1]


def _padded_length(n: int) -> int:
    """Gathered payloads are padded to a power of two (then to whole chunks) so that the
    all-gather compiles for a handful of shapes, not once per payload size."""
    if n > GATHER_CHUNK_BYTES:
        return -(-n // GATHER_CHUNK_BYTES) * GATHER_CHUNK_BYTES
    return 1 << max(10, (max(n, 1) - 1).bit_length())


def allgather_objects(value: Any) -> list[Any]:
    """[value of process 0, value of process 1, ...] on every process (pickled; any picklable
    host object). One process: [value]. Every process must call it at the same point."""
    if process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils

    payload = np.frombuffer(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = _gather_sizes(payload.size)
    padded = np.zeros(_padded_length(int(sizes.max())), np.uint8)
    padded[:payload.size] = payload
    pieces = [np.asarray(multihost_utils.process_allgather(padded[start:start + GATHER_CHUNK_BYTES]))
              for start in range(0, padded.size, GATHER_CHUNK_BYTES)]
    table = np.concatenate([p.reshape(len(sizes), -1) for p in pieces], axis=1)
    return [pickle.loads(table[i, :int(n)].tobytes()) for i, n in enumerate(sizes)]


def concatenate_lists(per_process: Sequence[Sequence[Any]]) -> list[Any]:
    return [item for part in per_process for item in part]


# ----------------------------------------------------------------------------- arrays
def local_submesh(mesh):
    """The block of `mesh` made of this process's devices, with the same axis names. A mesh
    spanning P processes along some axis yields that axis shortened P times."""
    import jax
    from jax.sharding import Mesh

    owner = np.vectorize(lambda d: d.process_index)(mesh.devices)
    mine = owner == jax.process_index()
    index = [np.unique(where) for where in np.nonzero(mine)]
    block = mesh.devices[np.ix_(*index)]
    if block.size != int(mine.sum()):
        raise ValueError(f"this process's devices do not form a block of mesh {dict(mesh.shape)}")
    return Mesh(block, mesh.axis_names)


def _fitting_spec(spec, shape: Sequence[int], mesh):
    """`spec` with every dimension the local mesh does not divide replicated instead."""
    from jax.sharding import PartitionSpec

    out = []
    for dim, entry in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        ways = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
        out.append(entry if axes and shape[dim] % ways == 0 else None)
    return PartitionSpec(*out)


@functools.lru_cache(maxsize=16)
def _replicator(shardings: tuple):
    """One jitted identity per tuple of target shardings: a group of arrays is replicated by
    one program (one compile), not one all-gather per array."""
    import jax

    return jax.jit(lambda *arrays: arrays, out_shardings=shardings)


def to_local(tree):
    """A copy of `tree` whose arrays live on this process's devices only (each array laid out
    on the local block of its mesh, same partition spec), for programs that one process runs
    alone, such as rollout sampling of its own prompts. Arrays already local are returned as
    they are. Collective when any array spans processes: every process must call it.

    Memory: the spanning arrays are replicated on every device in groups of at most
    REPLICATE_GROUP_BYTES (a group is one program: few compiles, a bounded peak)."""
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    leaves, treedef = jax.tree.flatten(tree)
    spanning = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not x.is_fully_addressable]
    named = [i for i in spanning if isinstance(leaves[i].sharding, NamedSharding)]
    groups: list[list[int]] = []
    size = 0
    for i in named:  # consecutive arrays, up to REPLICATE_GROUP_BYTES replicated at a time
        if not groups or size + leaves[i].nbytes > REPLICATE_GROUP_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += leaves[i].nbytes
    for group in groups:
        shardings = tuple(NamedSharding(leaves[i].sharding.mesh, PartitionSpec()) for i in group)
        replicated = _replicator(shardings)(*[leaves[i] for i in group])
        for i, full in zip(group, replicated):
            mesh = local_submesh(leaves[i].sharding.mesh)
            target = NamedSharding(mesh, _fitting_spec(leaves[i].sharding.spec, full.shape, mesh))
            leaves[i] = jax.device_put(full.addressable_data(0), target)
        del replicated
    for i in set(spanning) - set(named):  # other shardings: through the host
        host = np.asarray(multihost_utils.process_allgather(leaves[i], tiled=True))
        leaves[i] = jax.device_put(host, jax.local_devices()[0])
    return jax.tree.unflatten(treedef, leaves)


def local_model(model):
    """`model` (an nnx.Module) with every variable on this process's devices; `model` itself
    in a single-process run. Collective in a multi-process run."""
    if process_count() == 1:
        return model
    from flax import nnx

    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, to_local(state))


def model_mesh(model):
    """The mesh `model`'s parameters are laid out on (None when they are not on a multi-device
    mesh). Trainers hand it to TrainStep so that batches are split over every device of every
    process and updated parameters keep their layout from step to step."""
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding

    for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
            return sharding.mesh
    return None
