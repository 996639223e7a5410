"""The planner's GPU target: XLA:GPU compiling for NVIDIA GPUs in a CPU-only process.

`paravt-jax plan --target=gpu` compiles every program with the real GPU compiler for the mesh
preset's GPUs, with no GPU present: the CUDA PJRT plugin (`jax[cuda12]`, installed by the `gpu`
extra and by the planner's `gpu-plan` extra) makes compile-only devices from a description of
the GPU, `jax.experimental.topologies.get_topology_desc(platform="cuda", topology_name="",
topology="S x H x D", target_config=TEXT)`: S slices (NVLink domains: a mesh preset's hosts)
of H hosts of D devices each, all from one process; TEXT is a GpuTargetConfig text proto
(`target_config_text`), written here from the vendors' specifications of each GPU (`GPUS`).
Programs lowered on `jax.ShapeDtypeStruct`s sharded over a Mesh of those devices compile as
they would on the GPUs: XLA:GPU's fusion, layouts, scheduler, buffer assignment, ptxas for the
GPU's compute capability (ptxas from the `nvidia-cuda-nvcc-cu12` wheel, which jax finds
itself: `ptxas_path`), cuDNN's fused attention. Nothing runs.

Limits of a compile without the device: no autotuning (XLA keeps its default GEMM and fusion
tiles), and `compiled.cost_analysis()` is None; the planner reads FLOPs and bytes from the
optimised GPU module with XLA:CPU's cost analysis instead (planner/memory.py `module_costs`).
The plugin is loaded under JAX_PLATFORMS=cpu: the planner's child processes run so
(targets.py `target_env`).
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import math
import os
import shutil

# XLA:GPU's options for the planner's compiles: code generation without optimisation (LLVM at
# level 0 without its expensive passes, ptxas at -O0). What the planner reads is fixed before
# code generation: the optimised HLO module (its fusions, schedule and cost analysis) and its
# buffer assignment (memory_analysis), so the numbers are the same, byte for byte, and the
# compile takes less time; the code itself is never run nor reported (no device: 0 bytes).
# tests/integration/test_plan_gpu.py checks the sameness.
COMPILE_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
                   "xla_gpu_disable_gpuasm_optimizations": True}

# The CUDA plugin's package (jax[cuda12]) and the wheel that carries ptxas.
CUDA_PLUGIN = "jax_cuda12_plugin"
INSTALL_HINT = "pip install 'paravt_jax[gpu-plan]' (jax[cuda12]: the CUDA plugin, cuDNN and ptxas)"


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """What XLA:GPU needs to know about one GPU model (GpuTargetConfig's gpu_device_info)."""
    name: str  # the device name CUDA reports (cudaDeviceProp.name)
    compute_capability: tuple[int, int]
    sms: int  # streaming multiprocessors (core_count)
    fp32_cores_per_sm: int  # fpus_per_core
    clock_ghz: float  # boost clock
    memory_bytes: int  # device memory (device_memory_size)
    memory_bandwidth: int  # HBM bytes per second
    l2_bytes: int
    shared_memory_per_sm: int
    shared_memory_per_block_optin: int


# Per compute capability, from NVIDIA's CUDA C++ Programming Guide ("Technical Specifications
# per Compute Capability", the same for 8.0 and 9.0): 1,024 threads per block, 32 threads per
# warp, 2,048 resident threads per SM, 64 K 32-bit registers per SM and per block, block
# dimensions 1,024 x 1,024 x 64, grid dimensions (2^31 - 1) x 65,535 x 65,535, 48 KB of shared
# memory per block without opting in.
THREADS_PER_BLOCK = 1024
THREADS_PER_WARP = 32
THREADS_PER_SM = 2048
REGISTERS_PER_SM = 65536
REGISTERS_PER_BLOCK = 65536
BLOCK_DIMS = (1024, 1024, 64)
GRID_DIMS = (2**31 - 1, 65535, 65535)
SHARED_MEMORY_PER_BLOCK = 48 * 1024

GPUS = {
    # H100 SXM5 80 GB. NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100):
    # 80 GB HBM3 at 3.35 TB/s. NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 132 SMs
    # on the SXM5 part, 128 FP32 cores per SM, 50 MB of L2, 228 KB of shared memory per SM, 227 KB
    # per block (opt-in), compute capability 9.0. Boost clock 1,980 MHz (nvidia-smi's max SM
    # clock of the SXM5 part). Memory: the 79.1 GiB CUDA reports for the 80 GB part
    # (cudaDeviceProp.totalGlobalMem = 84,942,979,072 bytes), what XLA may allocate.
    "h100": GpuSpec("NVIDIA H100 80GB HBM3", (9, 0), 132, 128, 1.98, 84_942_979_072, 3_350_000_000_000,
                    50 * 2**20, 228 * 1024, 227 * 1024),
    # H200 SXM 141 GB: the H100's GH100 die with 141 GB of HBM3e at 4.8 TB/s (NVIDIA H200 Tensor
    # Core GPU datasheet, nvidia.com/en-us/data-center/h200); SMs, caches, shared memory and
    # clocks as the H100 SXM5's above. Memory: 141 GiB (the mesh presets' DEVICE_MEMORY_GB).
    "h200": GpuSpec("NVIDIA H200", (9, 0), 132, 128, 1.98, 141 * 2**30, 4_800_000_000_000,
                    50 * 2**20, 228 * 1024, 227 * 1024),
    # A100 SXM4 80 GB. NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100):
    # 80 GB HBM2e at 2,039 GB/s. NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108
    # SMs, 64 FP32 cores per SM, 40 MB of L2, 164 KB of shared memory per SM, 163 KB per block
    # (opt-in), boost clock 1,410 MHz, compute capability 8.0. Memory: 79.25 GiB as CUDA reports
    # the 80 GB part (85,100,068,864 bytes).
    "a100": GpuSpec("NVIDIA A100-SXM4-80GB", (8, 0), 108, 64, 1.41, 85_100_068_864, 2_039_000_000_000,
                    40 * 2**20, 164 * 1024, 163 * 1024),
}


def cudnn_version() -> tuple[int, int, int]:
    """The cuDNN the CUDA plugin runs with (the nvidia-cudnn-cu12 wheel jax[cuda12] installs):
    the target config's dnn_version_info, which decides the fused attention XLA may emit."""
    try:
        parts = importlib.metadata.version("nvidia-cudnn-cu12").split(".")
    except importlib.metadata.PackageNotFoundError:
        return (9, 8, 0)  # the least jax[cuda12] 0.10 accepts
    return tuple(int(p) for p in (parts + ["0", "0"])[:3])


def target_config_text(accelerator: str, cudnn: tuple[int, int, int] | None = None) -> str:
    """The GpuTargetConfig text proto of `accelerator` (a GPUS key) that the CUDA plugin takes as
    `target_config`. cudnn: (major, minor, patch) of cuDNN (default: the installed one)."""
    if accelerator not in GPUS:
        raise ValueError(f"no GPU target config for {accelerator!r}; known: {', '.join(GPUS)}")
    g = GPUS[accelerator]
    major, minor, patch = cudnn or cudnn_version()
    fields = [
        ("threads_per_block_limit", THREADS_PER_BLOCK), ("threads_per_warp", THREADS_PER_WARP),
        ("shared_memory_per_block", SHARED_MEMORY_PER_BLOCK), ("shared_memory_per_core", g.shared_memory_per_sm),
        ("threads_per_core_limit", THREADS_PER_SM), ("core_count", g.sms), ("fpus_per_core", g.fp32_cores_per_sm),
        ("block_dim_limit_x", GRID_DIMS[0]), ("block_dim_limit_y", GRID_DIMS[1]), ("block_dim_limit_z", GRID_DIMS[2]),
        ("memory_bandwidth", g.memory_bandwidth), ("l2_cache_size", g.l2_bytes), ("clock_rate_ghz", g.clock_ghz),
        ("device_memory_size", g.memory_bytes), ("shared_memory_per_block_optin", g.shared_memory_per_block_optin),
    ]
    lines = ["gpu_device_info {", *(f"  {k}: {v}" for k, v in fields),
             "  cuda_compute_capability {", f"    major: {g.compute_capability[0]}",
             f"    minor: {g.compute_capability[1]}", "  }",
             f"  registers_per_core_limit: {REGISTERS_PER_SM}", f"  registers_per_block_limit: {REGISTERS_PER_BLOCK}",
             *(f"  thread_dim_limit_{axis}: {n}" for axis, n in zip("xyz", BLOCK_DIMS)),
             "}", 'platform_name: "CUDA"', "dnn_version_info {", f"  major: {major}", f"  minor: {minor}",
             f"  patch: {patch}", "}", f'device_description_str: "{g.name}"']
    return "\n".join(lines) + "\n"


def gpu_topology(hosts: int, devices: int, slices: int | None = None) -> str:
    """The plugin's topology "slices x hosts per slice x devices per host" of `devices` GPUs on
    `hosts` hosts, each host an NVLink domain of its own (a slice) unless `slices` says otherwise."""
    slices = hosts if slices is None else slices
    if hosts < 1 or devices % hosts or hosts % slices:
        raise ValueError(f"no GPU topology of {devices} devices on {hosts} hosts in {slices} slices")
    return f"{slices}x{hosts // slices}x{devices // hosts}"


def topology_devices(topology: str) -> int:
    """The devices of a topology "S x H x D"."""
    return math.prod(int(part) for part in topology.split("x"))


def cuda_plugin_available() -> bool:
    """Whether the CUDA plugin is installed (jax[cuda12])."""
    return importlib.util.find_spec(CUDA_PLUGIN) is not None


def ptxas_path() -> str | None:
    """The ptxas XLA:GPU runs: the nvidia-cuda-nvcc-cu12 wheel's (jax looks there itself, so no
    PATH is needed), else one on PATH; None when there is none."""
    spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(root, "bin", "ptxas")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("ptxas")


def missing() -> str | None:
    """Why this machine cannot compile for GPUs (None when it can)."""
    if not cuda_plugin_available():
        return f"the CUDA plugin ({CUDA_PLUGIN}) is not installed: {INSTALL_HINT}"
    if ptxas_path() is None:
        return f"no ptxas (the nvidia-cuda-nvcc-cu12 wheel): {INSTALL_HINT}"
    return None


def gpu_devices(accelerator: str, topology: str) -> list:
    """Compile-only devices of `topology` GPUs of the `accelerator` model, made by the CUDA plugin
    in this process (JAX_PLATFORMS=cpu: nothing initialises a CUDA runtime)."""
    from jax.experimental import topologies

    return list(topologies.get_topology_desc(platform="cuda", topology_name="", topology=topology,
                                             target_config=target_config_text(accelerator)).devices)
