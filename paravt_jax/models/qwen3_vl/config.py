"""Qwen3-VL configuration: frozen dataclasses, HF config.json in both formats, presets.

transformers 4.57 (every hub checkpoint) writes `rope_theta` + `rope_scaling.mrope_section`
and a vision `model_type: qwen3_vl`; transformers 5.x writes `rope_parameters`. We read
both and write the 4.57 form, which both major versions load.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from paravt_jax.config import ConfigValueError, checked, integer, one_of, rule_problems

DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLEMENTATIONS = ("auto", "dense", "blockwise", "cudnn", "splash")
# the runtime knobs' rules (paravt_jax/config.py's idiom), shared with the run config's `model` section
DTYPE = one_of(DTYPES)
ATTENTION = one_of(ATTENTION_IMPLEMENTATIONS)
ATTENTION_BLOCK = integer(8)


class ConfigError(ConfigValueError):
    """A config.json (or preset) field is missing or invalid; the message names the field."""


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0
    hidden_act: str = "gelu_pytorch_tanh"
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2


@dataclasses.dataclass(frozen=True)
class TextConfig:
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 500000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    max_position_embeddings: int = 128000
    attention_bias: bool = False
    hidden_act: str = "silu"
    initializer_range: float = 0.02


@dataclasses.dataclass(frozen=True)
class Qwen3VLConfig:
    text: TextConfig = dataclasses.field(default_factory=TextConfig)
    vision: VisionConfig = dataclasses.field(default_factory=VisionConfig)
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    tie_word_embeddings: bool = False
    # Runtime knobs (not part of the HF checkpoint).
    param_dtype: str = checked("float32", DTYPE)
    dtype: str = checked("float32", DTYPE)  # compute dtype
    remat: bool = False  # rematerialise each decoder layer / vision block in the backward pass
    # lax.scan over layers: one compiled layer body (compile time for deep models) and no
    # per-layer weight slicing copies; measured faster than unrolling even on CPU.
    scan_layers: bool = True
    # The attention implementation of every attention (text decoder, sampler, vision tower):
    # auto | dense | blockwise | cudnn | splash (models/qwen3_vl/attention.py), and the query /
    # key block of `blockwise`.
    attention: str = checked("auto", ATTENTION)
    attention_block: int = checked(512, ATTENTION_BLOCK)

    def replace(self, **changes: Any) -> Qwen3VLConfig:
        return dataclasses.replace(self, **changes)

    def validate(self) -> Qwen3VLConfig:
        t, v = self.text, self.vision
        problems = rule_problems(Qwen3VLConfig, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        if problems:  # the runtime knobs' rules, every bad one named
            raise ConfigError(problems=problems)
        if t.num_attention_heads % t.num_key_value_heads:
            raise ConfigError(
                f"text num_attention_heads={t.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={t.num_key_value_heads}")
        if len(t.mrope_section) != 3 or 2 * sum(t.mrope_section) != t.head_dim:
            raise ConfigError(
                f"text mrope_section={list(t.mrope_section)} must have 3 entries summing to "
                f"head_dim/2={t.head_dim // 2}")
        if v.hidden_size % v.num_heads or v.head_dim % 4:
            raise ConfigError(f"vision hidden_size={v.hidden_size} / num_heads={v.num_heads} must "
                              "give a head_dim divisible by 4 (axial 2-D rotary)")
        if v.out_hidden_size != t.hidden_size:
            raise ConfigError(f"vision out_hidden_size={v.out_hidden_size} must equal text "
                              f"hidden_size={t.hidden_size}")
        side = int(round(v.num_position_embeddings**0.5))
        if side * side != v.num_position_embeddings:
            raise ConfigError(f"vision num_position_embeddings={v.num_position_embeddings} "
                              "is not a square")
        for index in v.deepstack_visual_indexes:
            if not 0 <= index < v.depth:
                raise ConfigError(f"vision deepstack_visual_indexes entry {index} outside "
                                  f"[0, depth={v.depth})")
        if len(v.deepstack_visual_indexes) > t.num_hidden_layers:
            raise ConfigError("more DeepStack features than text layers")
        return self


# ----------------------------------------------------------------------------- HF I/O
def _require(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise ConfigError(f"{where}: missing field {key!r}")
    return d[key]


def _text_from_hf(d: Mapping[str, Any], where: str) -> TextConfig:
    defaults = TextConfig()
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    theta = rope.get("rope_theta", d.get("rope_theta", defaults.rope_theta))
    section = tuple(int(x) for x in (rope.get("mrope_section") or (24, 20, 20)))
    hidden = int(_require(d, "hidden_size", where))
    heads = int(_require(d, "num_attention_heads", where))
    return TextConfig(
        vocab_size=int(_require(d, "vocab_size", where)),
        hidden_size=hidden,
        intermediate_size=int(_require(d, "intermediate_size", where)),
        num_hidden_layers=int(_require(d, "num_hidden_layers", where)),
        num_attention_heads=heads,
        num_key_value_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or hidden // heads),
        rms_norm_eps=float(d.get("rms_norm_eps", defaults.rms_norm_eps)),
        rope_theta=float(theta),
        mrope_section=section,  # type: ignore[arg-type]
        max_position_embeddings=int(d.get("max_position_embeddings",
                                          defaults.max_position_embeddings)),
        attention_bias=bool(d.get("attention_bias", False)),
        hidden_act=str(d.get("hidden_act", "silu")),
        initializer_range=float(d.get("initializer_range", defaults.initializer_range)),
    )


def _vision_from_hf(d: Mapping[str, Any], where: str) -> VisionConfig:
    defaults = VisionConfig()
    rope = d.get("rope_parameters") or {}
    fields = {}
    for f in dataclasses.fields(VisionConfig):
        if f.name in d:
            fields[f.name] = d[f.name]
    if "deepstack_visual_indexes" in fields:
        fields["deepstack_visual_indexes"] = tuple(int(i) for i in fields["deepstack_visual_indexes"])
    fields["rope_theta"] = float(rope.get("rope_theta", defaults.rope_theta))
    for key in ("depth", "hidden_size", "num_heads", "out_hidden_size"):
        _require(d, key, where)
    return VisionConfig(**fields)


def config_from_hf_dict(d: Mapping[str, Any], source: str = "config.json") -> Qwen3VLConfig:
    """Builds a config from a parsed HF `config.json` (4.57 or 5.x format)."""
    text = _text_from_hf(_require(d, "text_config", source), f"{source}: text_config")
    vision = _vision_from_hf(_require(d, "vision_config", source), f"{source}: vision_config")
    tie = d.get("tie_word_embeddings", d["text_config"].get("tie_word_embeddings", False))
    defaults = Qwen3VLConfig()
    return Qwen3VLConfig(
        text=text, vision=vision,
        image_token_id=int(d.get("image_token_id", defaults.image_token_id)),
        video_token_id=int(d.get("video_token_id", defaults.video_token_id)),
        vision_start_token_id=int(d.get("vision_start_token_id", defaults.vision_start_token_id)),
        vision_end_token_id=int(d.get("vision_end_token_id", defaults.vision_end_token_id)),
        tie_word_embeddings=bool(tie),
    ).validate()


def load_config(directory: str) -> Qwen3VLConfig:
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no config.json in the checkpoint directory")
    with open(path) as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from e
    return config_from_hf_dict(d, source=path)


def config_to_hf_dict(config: Qwen3VLConfig, torch_dtype: str = "float32") -> dict[str, Any]:
    """The 4.57 ("hub") format; transformers 4.57 and 5.x both load it."""
    t, v = config.text, config.vision
    text = {
        "model_type": "qwen3_vl_text",
        "vocab_size": t.vocab_size, "hidden_size": t.hidden_size,
        "intermediate_size": t.intermediate_size, "num_hidden_layers": t.num_hidden_layers,
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads, "head_dim": t.head_dim,
        "rms_norm_eps": t.rms_norm_eps, "rope_theta": t.rope_theta,
        "rope_scaling": {"rope_type": "default", "mrope_section": list(t.mrope_section),
                         "mrope_interleaved": True},
        "max_position_embeddings": t.max_position_embeddings,
        "attention_bias": t.attention_bias, "attention_dropout": 0.0,
        "hidden_act": t.hidden_act, "initializer_range": t.initializer_range,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": None, "eos_token_id": None, "dtype": torch_dtype,
        "use_cache": True,
    }
    vision = {
        "model_type": "qwen3_vl", "depth": v.depth, "hidden_size": v.hidden_size,
        "intermediate_size": v.intermediate_size, "num_heads": v.num_heads,
        "in_channels": v.in_channels, "patch_size": v.patch_size,
        "temporal_patch_size": v.temporal_patch_size,
        "spatial_merge_size": v.spatial_merge_size, "out_hidden_size": v.out_hidden_size,
        "num_position_embeddings": v.num_position_embeddings,
        "deepstack_visual_indexes": list(v.deepstack_visual_indexes),
        "hidden_act": v.hidden_act, "initializer_range": v.initializer_range,
    }
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": text, "vision_config": vision,
        "image_token_id": config.image_token_id, "video_token_id": config.video_token_id,
        "vision_start_token_id": config.vision_start_token_id,
        "vision_end_token_id": config.vision_end_token_id,
        "tie_word_embeddings": config.tie_word_embeddings,
        "dtype": torch_dtype,
    }


# ----------------------------------------------------------------------------- presets
def _vision_large(out: int, deepstack=(8, 16, 24)) -> VisionConfig:
    return VisionConfig(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                        out_hidden_size=out, deepstack_visual_indexes=deepstack)


def _vision_medium(out: int) -> VisionConfig:
    return VisionConfig(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                        out_hidden_size=out, deepstack_visual_indexes=(5, 11, 17))


def _text(hidden, inter, layers, heads, kv, vocab=151936, theta=5_000_000.0,
          section=(24, 20, 20), head_dim=128) -> TextConfig:
    return TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, head_dim=head_dim, rope_theta=theta,
                      mrope_section=section, max_position_embeddings=262144)


# Tiny special ids follow the "real - 151643 + 900" convention of docs/model.md.
TINY_SPECIAL = dict(image_token_id=912, video_token_id=913, vision_start_token_id=909,
                    vision_end_token_id=910)

PRESETS: dict[str, Qwen3VLConfig] = {
    "tiny": Qwen3VLConfig(
        text=_text(64, 128, 2, 4, 2, vocab=1000, section=(4, 2, 2), head_dim=16),
        vision=VisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                            out_hidden_size=64, num_position_embeddings=64,
                            deepstack_visual_indexes=(0, 1)),
        **TINY_SPECIAL),
    # The `events` toy task's model (configs/paragrpo.py:toy): tiny's vocabulary and special
    # ids, a 4-layer 128-wide text tower and a 64-wide vision tower.
    "toy": Qwen3VLConfig(
        text=_text(128, 256, 4, 4, 2, vocab=1000, section=(8, 4, 4), head_dim=32),
        vision=VisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=4,
                            out_hidden_size=128, num_position_embeddings=64,
                            deepstack_visual_indexes=(0, 1)),
        **TINY_SPECIAL),
    # Shared by every benchmark: a ~125M-parameter text tower with a 2-layer vision tower.
    "small125m": Qwen3VLConfig(
        text=_text(768, 2048, 12, 12, 4, vocab=32000, section=(16, 8, 8), head_dim=64),
        vision=VisionConfig(depth=2, hidden_size=256, intermediate_size=1024, num_heads=4,
                            out_hidden_size=768, num_position_embeddings=2304,
                            deepstack_visual_indexes=(0, 1)),
        **TINY_SPECIAL),
    "2b": Qwen3VLConfig(text=_text(2048, 6144, 28, 16, 8), vision=_vision_medium(2048),
                        tie_word_embeddings=True),
    "4b": Qwen3VLConfig(text=_text(2560, 9728, 36, 32, 8), vision=_vision_medium(2560),
                        tie_word_embeddings=True),
    "8b": Qwen3VLConfig(text=_text(4096, 12288, 36, 32, 8), vision=_vision_large(4096)),
    "32b": Qwen3VLConfig(text=_text(5120, 25600, 64, 64, 8), vision=_vision_large(5120)),
}


def preset(name: str, **changes: Any) -> Qwen3VLConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**changes).validate()
