"""Infrastructure: local and gs:// files (storage), the workdir lock (locking), checkpoints
(checkpointing), metric files (metrics_writer), log lines (logs), SIGTERM/SIGINT handling
(preemption), JAX's compilation cache (compile_cache), multi-host processes (distributed),
meshes and sharding rules (sharding, meshes), the platform and reproducibility settings
(platforms, reproducibility) and shape buckets (buckets). The lowest layer with paravt_jax/config.py:
it imports nothing of paravt_jax above it (docs/architecture.md)."""
