"""paravt-jax: ParaVT (parallel crop_video tool calls, PARA-GRPO) on Qwen3-VL in JAX/Flax NNX."""
from paravt_jax.infra import logs, platforms, reproducibility

logs.install()  # log lines: one format, on stderr, from process 0 (paravt_jax/infra/logs.py)
# XLA:CPU's thread count fixed before JAX starts its CPU client: numbers independent of the
# machine's core count (paravt_jax/infra/reproducibility.py)
reproducibility.fix_cpu_threads()
# ... and its kernels pinned to one vector extension: the same numbers on AVX2 and AVX-512 hosts
reproducibility.fix_cpu_isa()
# CPU only on a machine without TPU chips or a GPU, unless JAX_PLATFORMS says otherwise: JAX
# would start libtpu's runtime there, which warns on stderr and fails (paravt_jax/infra/platforms.py)
platforms.skip_absent_tpu()
