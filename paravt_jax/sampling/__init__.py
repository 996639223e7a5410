"""Jitted KV-cache sampling: `Sampler` (multimodal, multi-turn) and `generate` (text-only)."""
from paravt_jax.sampling.calls import SampleOutput
from paravt_jax.sampling.decode import sample_logits
from paravt_jax.sampling.params import SamplingParams
from paravt_jax.sampling.sampler import Sampler, SamplerConfig, SamplerState, generate

__all__ = ["SampleOutput", "Sampler", "SamplerConfig", "SamplerState", "SamplingParams", "generate",
           "sample_logits"]
