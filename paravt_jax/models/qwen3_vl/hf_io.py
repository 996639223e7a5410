"""HF safetensors import and export for Qwen3-VL.

One table (`parameter_table`) maps every parameter of our model to its HF tensor name(s) and
the transform between layouts. Loading builds the model abstractly (`nnx.eval_shape`), then
reads one tensor at a time from memory-mapped safetensors and places it straight onto its
sharding. Every problem (missing, unexpected, mis-shaped tensors) is collected and reported
in one error.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl import safetensors_io as st
from paravt_jax.models.qwen3_vl.config import Qwen3VLConfig, config_to_hf_dict, load_config
from paravt_jax.models.qwen3_vl.layers import to_dtype
from paravt_jax.models.qwen3_vl.model import Qwen3VL


class CheckpointError(ValueError):
    """Missing, unexpected or mis-shaped tensors; the message lists every offending name."""


@dataclasses.dataclass(frozen=True)
class Entry:
    path: tuple[str, ...]  # our parameter path
    hf: str  # HF name; "{i}" is the layer index for stacked parameters
    layout: str  # "copy" | "linear" (HF [out, in] <-> ours [in, out]) | "conv" (patch embed)
    stacked: int = 0  # number of stacked layers, 0 for unstacked


def parameter_table(config: Qwen3VLConfig) -> list[Entry]:
    v, t = config.vision, config.text
    V, T = "model.visual", "model.language_model"
    e = []
    e += [Entry(("visual", "patch_kernel"), f"{V}.patch_embed.proj.weight", "conv"),
          Entry(("visual", "patch_bias"), f"{V}.patch_embed.proj.bias", "copy"),
          Entry(("visual", "pos_embed"), f"{V}.pos_embed.weight", "copy")]
    block = {"norm1_scale": ("norm1.weight", "copy"), "norm1_bias": ("norm1.bias", "copy"),
             "qkv_kernel": ("attn.qkv.weight", "linear"), "qkv_bias": ("attn.qkv.bias", "copy"),
             "proj_kernel": ("attn.proj.weight", "linear"), "proj_bias": ("attn.proj.bias", "copy"),
             "norm2_scale": ("norm2.weight", "copy"), "norm2_bias": ("norm2.bias", "copy"),
             "fc1_kernel": ("mlp.linear_fc1.weight", "linear"), "fc1_bias": ("mlp.linear_fc1.bias", "copy"),
             "fc2_kernel": ("mlp.linear_fc2.weight", "linear"), "fc2_bias": ("mlp.linear_fc2.bias", "copy")}
    e += [Entry(("visual", "blocks", k), f"{V}.blocks.{{i}}.{name}", lay, v.depth)
          for k, (name, lay) in block.items()]
    merger = {"norm_scale": ("norm.weight", "copy"), "norm_bias": ("norm.bias", "copy"),
              "fc1_kernel": ("linear_fc1.weight", "linear"), "fc1_bias": ("linear_fc1.bias", "copy"),
              "fc2_kernel": ("linear_fc2.weight", "linear"), "fc2_bias": ("linear_fc2.bias", "copy")}
    e += [Entry(("visual", "merger", k), f"{V}.merger.{name}", lay) for k, (name, lay) in merger.items()]
    n_ds = len(v.deepstack_visual_indexes)
    e += [Entry(("visual", "deepstack", k), f"{V}.deepstack_merger_list.{{i}}.{name}", lay, n_ds)
          for k, (name, lay) in merger.items()]
    e.append(Entry(("language", "embed_tokens"), f"{T}.embed_tokens.weight", "copy"))
    layer = {"input_norm": ("input_layernorm.weight", "copy"),
             "q_proj": ("self_attn.q_proj.weight", "linear"), "k_proj": ("self_attn.k_proj.weight", "linear"),
             "v_proj": ("self_attn.v_proj.weight", "linear"), "o_proj": ("self_attn.o_proj.weight", "linear"),
             "q_norm": ("self_attn.q_norm.weight", "copy"), "k_norm": ("self_attn.k_norm.weight", "copy"),
             "post_norm": ("post_attention_layernorm.weight", "copy"),
             "gate_proj": ("mlp.gate_proj.weight", "linear"), "up_proj": ("mlp.up_proj.weight", "linear"),
             "down_proj": ("mlp.down_proj.weight", "linear")}
    e += [Entry(("language", "layers", k), f"{T}.layers.{{i}}.{name}", lay, t.num_hidden_layers)
          for k, (name, lay) in layer.items()]
    e.append(Entry(("language", "norm"), f"{T}.norm.weight", "copy"))
    if not config.tie_word_embeddings:
        e.append(Entry(("language", "lm_head"), "lm_head.weight", "linear"))
    return e


def _hf_shape(ours: tuple[int, ...], layout: str, config: Qwen3VLConfig) -> tuple[int, ...]:
    if layout == "linear":
        return (ours[1], ours[0])
    if layout == "conv":
        v = config.vision
        return (ours[1], v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    return ours


def _to_ours(array: np.ndarray, layout: str) -> np.ndarray:
    if layout == "linear":
        return array.T
    if layout == "conv":
        return array.reshape(array.shape[0], -1).T
    return array


def _to_hf(array: np.ndarray, layout: str, config: Qwen3VLConfig) -> np.ndarray:
    if layout == "linear":
        return np.ascontiguousarray(array.T)
    if layout == "conv":
        return np.ascontiguousarray(array.T).reshape(_hf_shape(array.shape, "conv", config))
    return np.ascontiguousarray(array)


def _variables(model: nnx.Module) -> dict[tuple, nnx.Variable]:
    return {tuple(str(p) for p in path): node for path, node in nnx.iter_graph(model)
            if isinstance(node, nnx.Variable)}


def abstract_model(config: Qwen3VLConfig) -> Qwen3VL:
    return nnx.eval_shape(lambda: Qwen3VL(config, rngs=nnx.Rngs(0)))


def init_model(config: Qwen3VLConfig, seed: int = 0, mesh=None, rules=sh.DEFAULT_RULES) -> Qwen3VL:
    """A randomly initialised model (norm scales 1, biases 0), optionally sharded."""
    graphdef, abstract_state = nnx.split(abstract_model(config))
    shardings = None
    if mesh is not None:
        shardings = sh.state_shardings(nnx.merge(graphdef, abstract_state), mesh, rules)

    # One jitted initialisation: every parameter is created directly on its sharding.
    @functools.partial(jax.jit, out_shardings=shardings)
    def create():
        return nnx.split(Qwen3VL(config, rngs=nnx.Rngs(seed)))[1]

    return nnx.merge(graphdef, create())


def load_pretrained(directory: str, dtype: str = "float32", compute_dtype: str | None = None,
                    mesh=None, rules=sh.DEFAULT_RULES, **config_changes) -> Qwen3VL:
    """Loads an HF Qwen3-VL checkpoint directory (config.json + safetensors).

    dtype: parameter dtype; compute_dtype defaults to dtype. With a mesh, each tensor is placed
    directly on its NamedSharding. config_changes: runtime knobs (remat, scan_layers).
    """
    config = load_config(directory).replace(param_dtype=dtype, dtype=compute_dtype or dtype,
                                            **config_changes).validate()
    files = st.open_checkpoint(directory)
    model = abstract_model(config)
    variables = _variables(model)
    target_dtype = np.dtype(jnp.dtype(to_dtype(dtype)))
    missing, misshaped, seen = [], [], set()
    plans = []
    for entry in parameter_table(config):
        var = variables[entry.path]
        shape = tuple(var.get_value().shape)
        per_layer = shape[1:] if entry.stacked else shape
        names = ([entry.hf.format(i=i) for i in range(entry.stacked)] if entry.stacked
                 else [entry.hf])
        want = _hf_shape(per_layer, entry.layout, config)
        ok = True
        for name in names:
            seen.add(name)
            if name not in files:
                missing.append(name)
                ok = False
            elif files[name].shape(name) != want:
                misshaped.append(f"{name}: checkpoint {list(files[name].shape(name))}, expected {list(want)}")
                ok = False
        plans.append((entry, var, shape, names, ok))
    unexpected = sorted(set(files) - seen)
    # A tied checkpoint may still carry lm_head.weight; HF ignores it, so do we.
    if config.tie_word_embeddings and "lm_head.weight" in unexpected:
        unexpected.remove("lm_head.weight")
    if missing or unexpected or misshaped:
        parts = [f"{directory}: checkpoint does not match the config"]
        if missing:
            parts.append(f"missing ({len(missing)}): " + ", ".join(missing))
        if unexpected:
            parts.append(f"unexpected ({len(unexpected)}): " + ", ".join(unexpected))
        if misshaped:
            parts.append(f"mis-shaped ({len(misshaped)}): " + "; ".join(misshaped))
        raise CheckpointError("\n  ".join(parts))
    for entry, var, shape, names, _ in plans:
        if entry.stacked:
            host = np.empty(shape, target_dtype)
            for i, name in enumerate(names):
                host[i] = _to_ours(files[name].read(name), entry.layout).astype(target_dtype)
        else:
            host = np.asarray(_to_ours(files[names[0]].read(names[0]), entry.layout)).astype(target_dtype)
        if mesh is not None:
            placed = jax.device_put(host, sh.named_sharding(mesh, sh.param_axes(var), shape, rules))
        else:
            placed = jax.device_put(host)
        var.set_value(placed)
        del host
    return model


def iter_hf_tensors(model: Qwen3VL, torch_dtype: str = "float32") -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, numpy array) for every tensor, one parameter gathered to host at a time."""
    config = model.config
    variables = _variables(model)
    out_dtype = np.dtype(ml_dtypes.bfloat16) if torch_dtype == "bfloat16" else np.dtype(np.float32)
    for entry in parameter_table(config):
        host = np.asarray(jax.device_get(variables[entry.path].get_value())).astype(out_dtype)
        if entry.stacked:
            for i in range(entry.stacked):
                yield entry.hf.format(i=i), _to_hf(host[i], entry.layout, config)
        else:
            yield entry.hf, _to_hf(host, entry.layout, config)


def parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)I?B?\s*", str(size).upper())
    if not m:
        raise ValueError(f"max_shard_size={size!r}: expected bytes or e.g. '5GB', '500MB'")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " "))


def save_pretrained(model: Qwen3VL, directory: str, max_shard_size: int | str = "5GB",
                    torch_dtype: str | None = None) -> list[str]:
    """Writes config.json + (sharded) safetensors loadable by transformers'
    Qwen3VLForConditionalGeneration.from_pretrained. Only process 0 writes on multi-host."""
    torch_dtype = torch_dtype or model.config.param_dtype
    os.makedirs(directory, exist_ok=True)
    tensors = iter_hf_tensors(model, torch_dtype)
    if jax.process_index() != 0:
        for _ in tensors:  # every process takes part in gathering sharded values
            pass
        return []
    for stale in os.listdir(directory):
        if stale.startswith("model") and (stale.endswith(".safetensors") or stale.endswith(".index.json")):
            os.remove(os.path.join(directory, stale))
    files = st.write_sharded(directory, tensors, parse_size(max_shard_size))
    tmp = os.path.join(directory, "config.json.tmp")
    with open(tmp, "w") as f:
        json.dump(config_to_hf_dict(model.config, torch_dtype), f, indent=2)
    os.replace(tmp, os.path.join(directory, "config.json"))
    return files
