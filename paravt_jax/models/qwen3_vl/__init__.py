"""Qwen3-VL in Flax NNX: config, model, HF safetensors import/export."""
from paravt_jax.models.qwen3_vl.config import PRESETS, ConfigError, Qwen3VLConfig, TextConfig, VisionConfig, preset
from paravt_jax.models.qwen3_vl.hf_io import CheckpointError, init_model, load_pretrained, save_pretrained
from paravt_jax.models.qwen3_vl.model import ModelOutput, PreparedInputs, Qwen3VL, prepare_inputs

__all__ = ["PRESETS", "ConfigError", "Qwen3VLConfig", "TextConfig", "VisionConfig", "preset",
           "ModelOutput", "PreparedInputs", "Qwen3VL", "prepare_inputs", "CheckpointError",
           "load_pretrained", "save_pretrained", "init_model"]
