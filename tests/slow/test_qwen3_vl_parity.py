"""The benchmark preset against transformers (the tiny model's parity runs by default in
tests/integration/test_qwen3_vl_parity.py)."""
import json

import numpy as np

from conftest import require_torch
from support.hf_tiny import randomize


def test_small125m_parity_with_transformers(tmp_path):
    """The benchmark preset (12 layers, GQA 12/4, vocab 32k, 2-layer vision tower) against
    transformers on a random checkpoint: image + text batch, fp32."""
    torch = require_torch()
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from paravt_jax.models.qwen3_vl import load_pretrained, preset
    from paravt_jax.models.qwen3_vl.config import config_to_hf_dict

    d = config_to_hf_dict(preset("small125m"))
    torch.manual_seed(0)
    hf = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**{k: v for k, v in d.items() if k != "architectures"}))
    hf = randomize(hf.eval(), norm=0.1, bias=0.05, weight=0.0)
    hf.save_pretrained(str(tmp_path))
    assert json.load(open(tmp_path / "config.json"))["text_config"]["num_hidden_layers"] == 12
    ours = load_pretrained(str(tmp_path))
    rng = np.random.default_rng(0)
    grid = np.array([[1, 8, 8]])
    ids = np.concatenate([rng.integers(0, 900, 5), [909], [912] * 16, [910], rng.integers(0, 900, 40)])[None]
    pv = rng.standard_normal((64, 1536)).astype(np.float32)
    types = (ids == 912).astype(np.int64)
    mask = np.ones_like(ids)
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    mm_token_type_ids=torch.tensor(types), pixel_values=torch.tensor(pv),
                    image_grid_thw=torch.tensor(grid)).logits.numpy()
    out = np.asarray(ours(input_ids=ids, attention_mask=mask, mm_token_type_ids=types, pixel_values=pv,
                          image_grid_thw=grid).logits)
    assert np.abs(out - theirs).max() < 1e-4
