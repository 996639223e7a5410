"""paravt-jax: ParaVT (parallel crop_video tool calls, PARA-GRPO) on Qwen3-VL in JAX/Flax NNX."""
from paravt_jax import logs

logs.install()  # log lines: one format, on stderr, from process 0 (paravt_jax/logs.py)
