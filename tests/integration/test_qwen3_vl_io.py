"""Export round trip, sharded forward, checkpoint and input errors."""
import json
import os

import jax
import numpy as np
import pytest

from conftest import require_torch
from integration.test_qwen3_vl_parity import assert_close, hf_logits, mixed_batch, ours_on
from paravt_jax.infra import sharding as sh
from paravt_jax.models.qwen3_vl import CheckpointError, init_model, load_pretrained, preset, save_pretrained
from paravt_jax.models.qwen3_vl import safetensors_io as st
from support.hf_tiny import IM_START, build_hf_tiny, image_tokens, pad_batch, patches, text_ids


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, torch_module):
    directory = str(tmp_path_factory.mktemp("tiny_io"))
    build_hf_tiny(directory, seed=21)
    return directory


def test_export_round_trip_sharded_files(tiny_dir, tmp_path):
    torch = require_torch()
    from transformers import Qwen3VLForConditionalGeneration

    ours = load_pretrained(tiny_dir)
    out_dir = str(tmp_path / "export")
    files = save_pretrained(ours, out_dir, max_shard_size="300KB")
    assert len(files) > 1 and os.path.isfile(os.path.join(out_dir, "model.safetensors.index.json"))
    hf = Qwen3VLForConditionalGeneration.from_pretrained(out_dir).eval()
    b = mixed_batch(12)
    theirs = hf_logits(hf, b["ids"], b["mask"], b["types"], b["pv"], b["igrid"], b["pvv"], b["vgrid"])
    assert_close(ours_on(ours, b).logits, theirs, b["mask"])
    # tensors are bit-identical to the source checkpoint
    src, dst = st.open_checkpoint(tiny_dir), st.open_checkpoint(out_dir)
    assert sorted(src) == sorted(dst)
    for name in src:
        np.testing.assert_array_equal(src[name].read(name), dst[name].read(name), err_msg=name)
    # and our own loader reads the export back (sharded index path)
    again = load_pretrained(out_dir)
    np.testing.assert_array_equal(np.asarray(ours_on(again, b).logits), np.asarray(ours_on(ours, b).logits))
    del torch


def test_export_bf16_and_random_init(tmp_path, torch_module):
    from transformers import Qwen3VLForConditionalGeneration

    model = init_model(preset("tiny", param_dtype="bfloat16", dtype="bfloat16"), seed=3)
    save_pretrained(model, str(tmp_path))
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["text_config"]["dtype"] == "bfloat16"
    hf = Qwen3VLForConditionalGeneration.from_pretrained(str(tmp_path))
    assert next(hf.parameters()).dtype == torch_module.bfloat16


def test_sharded_forward_matches_unsharded(tiny_dir):
    assert jax.device_count() == 8
    mesh = sh.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    plain = load_pretrained(tiny_dir)
    sharded = load_pretrained(tiny_dir, mesh=mesh)
    q = sharded.language.layers["q_proj"][...]
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert len(q.addressable_shards) == 8 and q.addressable_shards[0].data.shape == (2, 16, 32)
    b = mixed_batch(13)
    np.testing.assert_allclose(np.asarray(ours_on(sharded, b).logits),
                               np.asarray(ours_on(plain, b).logits), atol=2e-5)


def test_logical_rules_replicate_undivisible_dims():
    mesh = sh.make_mesh({"fsdp": 4, "tensor": 2})
    assert sh.logical_to_spec(("embed", "mlp"), (64, 128), mesh) == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert sh.logical_to_spec(("embed", "mlp"), (6, 128), mesh) == jax.sharding.PartitionSpec(None, "tensor")
    with pytest.raises(KeyError, match="no_such_axis"):
        sh.logical_to_spec(("no_such_axis",), (4,), mesh)
    with pytest.raises(ValueError, match="has 12 devices, 8 available"):
        sh.make_mesh({"data": 3, "fsdp": 2, "tensor": 2})


def _rewrite(directory, dst, edit):
    files = st.open_checkpoint(directory)
    tensors = {name: np.array(files[name].read(name)) for name in files}
    edit(tensors)
    os.makedirs(dst, exist_ok=True)
    st.write_file(os.path.join(dst, "model.safetensors"), tensors)
    with open(os.path.join(directory, "config.json")) as f, open(os.path.join(dst, "config.json"), "w") as g:
        g.write(f.read())


def test_checkpoint_errors_list_every_name(tiny_dir, tmp_path):
    def edit(t):
        del t["model.language_model.layers.1.mlp.up_proj.weight"]
        del t["model.visual.blocks.0.attn.qkv.bias"]
        t["model.extra.weight"] = np.zeros((2,), np.float32)
        t["model.language_model.norm.weight"] = np.zeros((65,), np.float32)

    _rewrite(tiny_dir, str(tmp_path / "bad"), edit)
    with pytest.raises(CheckpointError) as info:
        load_pretrained(str(tmp_path / "bad"))
    message = str(info.value)
    for name in ("model.language_model.layers.1.mlp.up_proj.weight", "model.visual.blocks.0.attn.qkv.bias",
                 "model.extra.weight", "model.language_model.norm.weight: checkpoint [65], expected [64]"):
        assert name in message
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(str(tmp_path))
    os.makedirs(tmp_path / "noweights")
    with open(tmp_path / "noweights" / "config.json", "w") as f:
        f.write(open(os.path.join(tiny_dir, "config.json")).read())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_pretrained(str(tmp_path / "noweights"))


def test_truncated_safetensors_names_file(tmp_path):
    path = tmp_path / "model.safetensors"
    st.write_file(str(path), {"a": np.ones((4, 4), np.float32)})
    data = path.read_bytes()
    path.write_bytes(data[:-8])
    with pytest.raises(st.SafetensorsError, match="model.safetensors"):
        st.SafetensorsFile(str(path)).read("a")


def test_image_pad_count_mismatch_names_both_numbers():
    model = init_model(preset("tiny"))
    rng = np.random.default_rng(0)
    grid = [[1, 4, 4]]  # 4 tokens
    row = [IM_START] + text_ids(rng, 2) + image_tokens([1, 4, 6]) + text_ids(rng, 2)  # 6 pads
    ids, mask, types = pad_batch([row])
    with pytest.raises(ValueError, match=r"image pad tokens in input_ids: 6, but image_grid_thw gives 4"):
        model(input_ids=ids, attention_mask=mask, mm_token_type_ids=types,
              pixel_values=patches(rng, grid), image_grid_thw=grid)
    with pytest.raises(ValueError, match=r"shape \(16, 1536\).*\[24, 1536\]"):
        model(input_ids=ids, pixel_values=patches(rng, grid), image_grid_thw=[[1, 4, 6]])
    with pytest.raises(ValueError, match="no pixel_values"):
        model(input_ids=ids)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(input_ids=np.array([[5, 1000]]))
