"""Tiny random transformers Qwen3-VL checkpoints and hand-built multimodal inputs."""
from __future__ import annotations

import json
import os

import numpy as np

IM_START, IM_END, PAD = 901, 902, 900
VISION_START, VISION_END, IMAGE, VIDEO = 909, 910, 912, 913


def tiny_hf_config(*, deepstack=(0, 1), depth=2, text_layers=2, tie=False):
    from transformers import Qwen3VLConfig

    text = dict(vocab_size=1000, hidden_size=64, intermediate_size=128,
                num_hidden_layers=text_layers, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0,
                                 "mrope_section": [4, 2, 2], "mrope_interleaved": True})
    vision = dict(depth=depth, hidden_size=32, intermediate_size=64, num_heads=4,
                  out_hidden_size=64, num_position_embeddings=64, patch_size=16,
                  temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                  deepstack_visual_indexes=list(deepstack))
    return Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE,
                         video_token_id=VIDEO, vision_start_token_id=VISION_START,
                         vision_end_token_id=VISION_END, tie_word_embeddings=tie)


def build_hf_tiny(directory: str, *, seed: int = 0, **config_kwargs):
    """Saves a random tiny model (random norm scales and biases) and returns it (eval, fp32)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    model = randomize(Qwen3VLForConditionalGeneration(tiny_hf_config(**config_kwargs)).eval())
    model.save_pretrained(directory)
    return model


def randomize(model, norm=0.2, bias=0.1, weight=0.05):
    """Random norm scales (not ones) and biases (not zeros), so layout bugs cannot hide."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + norm * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(bias * torch.randn_like(param))
            elif weight:
                param.copy_(weight * torch.randn_like(param))
    return model


def rewrite_config_as_457(directory: str):
    """Turns a 5.x config.json into the transformers 4.57 (hub) layout."""
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        d = json.load(f)
    text = d["text_config"]
    rope = text.pop("rope_parameters")
    text["rope_theta"] = rope["rope_theta"]
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": rope["mrope_section"],
                            "mrope_interleaved": True}
    vision = d["vision_config"]
    vision.pop("rope_parameters", None)
    vision["model_type"] = "qwen3_vl"
    with open(path, "w") as f:
        json.dump(d, f, indent=2)


def text_ids(rng, n):
    return list(rng.integers(10, 890, size=n))


def image_tokens(grid):
    t, h, w = grid
    return [VISION_START] + [IMAGE] * (t * h * w // 4) + [VISION_END]


def video_tokens(rng, grid):
    """Per temporal group `<t seconds>` text + start/pads/end (transformers 5.25's layout)."""
    t, h, w = grid
    out = []
    for _ in range(t):
        out += text_ids(rng, 3) + [VISION_START] + [VIDEO] * (h * w // 4) + [VISION_END]
    return out


def pad_batch(rows, left=True):
    length = max(len(r) for r in rows)
    ids = np.full((len(rows), length), PAD, np.int64)
    mask = np.zeros((len(rows), length), np.int64)
    for b, r in enumerate(rows):
        if left:
            ids[b, length - len(r):] = r
            mask[b, length - len(r):] = 1
        else:
            ids[b, :len(r)] = r
            mask[b, :len(r)] = 1
    types = (ids == IMAGE) * 1 + (ids == VIDEO) * 2
    return ids, mask, types


def patches(rng, grids):
    n = sum(int(np.prod(g)) for g in grids)
    return rng.standard_normal((n, 1536)).astype(np.float32)
