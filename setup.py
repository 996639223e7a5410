"""paravt-jax: ParaVT (parallel video tool calls + PARA-GRPO) on Qwen3-VL in JAX/Flax NNX."""
from setuptools import find_packages, setup

# Versions are the ones verified on our CPU CI machine; ranges stay within the same
# minor series because JAX/Flax APIs move quickly between minors.
RUNTIME = [
    "jax>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "ml-collections>=1.1.0,<2",
    "transformers>=5.24.0,<6",  # tokenizers only at runtime; never imports torch
    "tokenizers>=0.22",
    "decord==0.6.0",
    "tensorflow-datasets>=4.9.10,<5",  # ArrayRecord builders, no TensorFlow
    "importlib_resources>=6",  # needed by tensorflow-datasets builders
    "grain>=0.2.18,<0.3",
    "matplotlib>=3.8",  # the PNG of training curves
    "numpy>=1.26,<3",
    "safetensors>=0.5",
    "pillow>=10",
    "av>=12",  # writes the built-in synthetic videos
    "absl-py>=2",
    "gcsfs>=2026.10.1",  # gs:// workdirs (paravt_jax/infra/storage.py; orbax reaches gs:// through it too)
]

# The TPU compiler (libtpu): `paravt-jax plan --target=tpu` compiles for a TPU topology from a
# CPU machine; the test extra includes it so CI compiles the tiny recipe for v5p:2x2x2. Nothing
# else imports it: the runtime runs on CPU and GPU without it.
TPU = ["jax[tpu]>=0.10.2,<0.11"]

# The CUDA runtime (jax[cuda12]: the plugin, its NVIDIA wheels, nvcc's ptxas).
GPU = ["jax[cuda12]>=0.10.2,<0.11"]

EXTRAS = {
    "test": [
        *TPU,
        "pytest>=8",
        "pytest-xdist>=3.6,<4",  # launch/test.sh runs the suite on every core (-n)
        "pytest-cov>=7",  # line coverage: bash launch/test.sh --cov (.coveragerc)
        "hypothesis>=6",
        # torch + torchvision for the parity tests and transformers' Qwen3-VL video processor
        # (AutoProcessor). torchvision exists on the package index only as a CUDA build, which
        # needs the matching CUDA torch (and its nvidia-* wheels); both run on CPU without a GPU.
        "torch==2.14.1",
        "torchvision==0.29.1",
        # 5.25 lays a video item out as Qwen3-VL's release did (no outer start/end pair), as we do
        "transformers>=5.25.0,<6",
        # tests/integration/test_notebooks.py executes notebooks/*.ipynb on a python3 kernel
        "nbclient>=0.10",
        "nbformat>=5.10",
        "ipykernel>=6.29",
        "ruff>=0.17.5,<0.18",  # `ruff check .` in CI (.ci/run) and the pre-commit hook
        "gcp-storage-emulator>=2026.7.19",  # a Cloud Storage API on 127.0.0.1 for the gs:// workdir tests
    ],
    "gpu": GPU,
    # the planner's GPU compiler on a machine without a GPU (`paravt-jax plan --target=gpu`): the
    # CUDA plugin, cuDNN and ptxas (nvidia-cuda-nvcc-cu12, which jax finds itself), as `gpu`
    # installs them. Not in the test extra: 4.4 GB of NVIDIA wheels (about 3 minutes to install
    # here) and about 5 minutes for the tiny plan on 2 H100s; tests/integration/test_plan_gpu.py skips its
    # compiles, with the reason, where it is missing.
    "gpu-plan": GPU,
    "tpu": TPU,
}

setup(
    name="paravt_jax",
    version="0.1.0",
    description="ParaVT in JAX: Qwen3-VL, parallel crop_video tool calls, PARA-GRPO",
    # The config files stay in the repository's top-level configs/ folder (`--config=configs/...`)
    # but install as the package paravt_jax.configs, never as a top-level `configs` on everyone's
    # path. The mapping builds the wheel (and the sdist) and points an editable install at the
    # folder; in a source checkout on PYTHONPATH, paravt_jax/configs/__init__.py reads the same
    # folder (that file is not packaged, hence the package is named here, not found).
    packages=find_packages(include=["paravt_jax", "paravt_jax.*"], exclude=["paravt_jax.configs"])
    + ["paravt_jax.configs"],
    package_dir={"paravt_jax.configs": "configs"},
    python_requires=">=3.10",
    install_requires=RUNTIME,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["paravt-jax=paravt_jax.cli:main"]},
)
