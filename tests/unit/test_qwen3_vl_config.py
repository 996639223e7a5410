import json

import jax
import numpy as np
import pytest
from flax import nnx

from paravt_jax.models.qwen3_vl import ConfigError, preset
from paravt_jax.models.qwen3_vl.config import config_from_hf_dict, config_to_hf_dict, load_config
from paravt_jax.models.qwen3_vl.hf_io import abstract_model

HUB_8B = {  # the 4.57 layout of the published Qwen3-VL-8B-Instruct config
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "tie_word_embeddings": False,
    "text_config": {"model_type": "qwen3_vl_text", "vocab_size": 151936, "hidden_size": 4096,
                    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
                    "rope_theta": 5000000, "max_position_embeddings": 262144,
                    "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20],
                                     "mrope_interleaved": True}},
    "vision_config": {"model_type": "qwen3_vl", "depth": 27, "hidden_size": 1152,
                      "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 4096,
                      "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24],
                      "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2},
}


def test_hub_457_config_equals_8b_preset():
    assert config_from_hf_dict(HUB_8B) == preset("8b")


def test_5x_rope_parameters_format():
    d = json.loads(json.dumps(HUB_8B))
    text = d["text_config"]
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000000.0,
                               "mrope_section": [24, 20, 20], "mrope_interleaved": True}
    del text["rope_theta"], text["rope_scaling"]
    d["vision_config"]["rope_parameters"] = {"rope_type": "axial", "rope_theta": 10000.0}
    assert config_from_hf_dict(d) == preset("8b")


def test_round_trip_through_hf_dict(tmp_path):
    for name in ("tiny", "2b", "32b"):
        cfg = preset(name)
        (tmp_path / "config.json").write_text(json.dumps(config_to_hf_dict(cfg)))
        assert load_config(str(tmp_path)) == cfg


@pytest.mark.parametrize("name,billions", [("2b", 2.13), ("4b", 4.44), ("8b", 8.77), ("32b", 33.36)])
def test_preset_parameter_counts(name, billions):
    state = nnx.state(abstract_model(preset(name)))
    total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))
    assert abs(total / 1e9 - billions) < 0.01, total


def test_tiny_matches_docs():
    state = nnx.state(abstract_model(preset("tiny")))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state)) == 345_312


def test_bad_config_fields_are_named(tmp_path):
    d = json.loads(json.dumps(HUB_8B))
    del d["text_config"]["hidden_size"]
    with pytest.raises(ConfigError, match="text_config: missing field 'hidden_size'"):
        config_from_hf_dict(d)
    d = json.loads(json.dumps(HUB_8B))
    d["vision_config"]["out_hidden_size"] = 100
    with pytest.raises(ConfigError, match="out_hidden_size=100"):
        config_from_hf_dict(d)
    with pytest.raises(ConfigError, match="unknown model preset 'huge'"):
        preset("huge")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: not valid JSON"):
        load_config(str(tmp_path))
    with pytest.raises(ConfigError, match="dtype='float16'"):
        preset("tiny", dtype="float16")
