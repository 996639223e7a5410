"""No TPU runtime on a machine without TPU chips.

With JAX_PLATFORMS unset, JAX initialises every backend it can load, libtpu's included when the
`tpu` extra is installed (the `test` extra pulls it in for the planner's TPU compiler). On a
machine without TPU chips libtpu then runs its start-up anyway: it prints `WARNING: could not
determine TPU accelerator type ...` and `... TPU worker hostnames ...` (and an `E0000 ...
common_lib.cc` error) on stderr, takes its lock file in the temporary directory, and fails, after which JAX falls
back to the CPU. `skip_absent_tpu` (called by paravt_jax/__init__.py, before JAX starts a
backend) sets JAX_PLATFORMS=cpu when nothing asked for a platform and the machine has neither
TPU chips nor a GPU, so such runs start the CPU backend only, quietly.

Left alone: JAX_PLATFORMS set to anything (`JAX_PLATFORMS=` asks for JAX's own choice among
every backend), JAX_FORCE_TPU_INIT, a Cloud TPU environment (its variables, /dev/accel*,
/dev/vfio groups, TPU chips on the PCI bus), a GPU (NVIDIA or AMD device nodes), neither libtpu
nor a CUDA plugin installed. A CUDA plugin (jax[cuda12], the planner's GPU target) counts as
libtpu does: on a machine without a GPU its start-up fails and prints a traceback (`Jax plugin
configuration error ... cuInit(0) failed`). The planner's TPU target (`paravt-jax plan
--target=tpu`) needs no backend: it loads libtpu itself to compile for a TPU topology
(planner/programs.py `tpu_devices`), whatever JAX_PLATFORMS says.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys
from collections.abc import MutableMapping

# jax/_src/hardware_utils.py: Google's PCI vendor id and its TPU chips' device ids (v3 to 7x)
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076")
# Set by Cloud TPU VMs, TPU pods and GKE TPU nodes
# (not TPU_SKIP_MDS_QUERY: JAX and the planner set it on machines without TPU chips)
TPU_ENV = ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS",
           "TPU_ACCELERATOR_TYPE", "JAX_FORCE_TPU_INIT")
GPU_DEVICES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def tpu_chips_on_pci(root: str = "/sys/bus/pci/devices") -> int:
    """The TPU chips on this machine's PCI bus (what JAX counts, without importing JAX)."""
    count = 0
    for vendor in glob.glob(os.path.join(root, "*", "vendor")):
        device = _read(os.path.join(os.path.dirname(vendor), "device"))
        if _read(vendor) == GOOGLE_PCI_VENDOR and device in TPU_PCI_DEVICES:
            count += 1
    return count


def accelerator_present(environ: MutableMapping[str, str]) -> bool:
    """Whether this machine may hold a TPU or a GPU (then JAX chooses its backends itself)."""
    if any(environ.get(name) for name in TPU_ENV):
        return True
    if glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"):
        return True
    if any(os.path.exists(device) for device in GPU_DEVICES):
        return True
    return tpu_chips_on_pci() > 0


# Accelerator runtimes JAX would start in every process when installed: libtpu (the tpu extra)
# and the CUDA plugins (jax[cuda12] / jax[cuda13]: the gpu and gpu-plan extras; on a machine
# without a GPU its start-up fails with `Jax plugin configuration error ... cuInit(0) failed`).
ACCELERATOR_PLUGINS = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin")


def accelerator_plugins() -> list[str]:
    """The ACCELERATOR_PLUGINS installed here."""
    return [name for name in ACCELERATOR_PLUGINS if importlib.util.find_spec(name) is not None]


def skip_absent_tpu(environ: MutableMapping[str, str] | None = None) -> bool:
    """Sets JAX_PLATFORMS=cpu when it is unset, libtpu or a CUDA plugin is installed and the
    machine has no TPU chips and no GPU (see the module's docstring); whether it did. Effective before JAX starts
    a backend (JAX imported already gets the setting through its config)."""
    environ = os.environ if environ is None else environ
    if "JAX_PLATFORMS" in environ or not accelerator_plugins() or accelerator_present(environ):
        return False
    environ["JAX_PLATFORMS"] = "cpu"
    if environ is os.environ and "jax" in sys.modules:  # JAX read JAX_PLATFORMS when it was imported
        try:
            sys.modules["jax"].config.update("jax_platforms", "cpu")
        except Exception:  # a backend already started: too late to choose, nothing to undo
            pass
    return True
