"""Parity of our Qwen3-VL against transformers' PyTorch implementation (fp32, tiny random)."""
import numpy as np
import pytest

from conftest import require_torch
from paravt_jax.models.qwen3_vl import load_pretrained
from support.hf_tiny import (
    IM_END,
    IM_START,
    build_hf_tiny,
    image_tokens,
    pad_batch,
    patches,
    rewrite_config_as_457,
    text_ids,
    video_tokens,
)

TOL = 1e-4


def hf_logits(hf_model, ids, mask, types, pv=None, igrid=None, pvv=None, vgrid=None,
              position_ids=None):
    torch = require_torch()
    kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                  mm_token_type_ids=torch.tensor(types))
    if pv is not None:
        kwargs.update(pixel_values=torch.tensor(pv), image_grid_thw=torch.tensor(igrid))
    if pvv is not None:
        kwargs.update(pixel_values_videos=torch.tensor(pvv), video_grid_thw=torch.tensor(vgrid))
    if position_ids is not None:
        kwargs["position_ids"] = torch.tensor(position_ids)
    with torch.no_grad():
        return hf_model(**kwargs).logits.numpy()


def hf_positions(hf_model, ids, mask, types, igrid=None, vgrid=None):
    torch = require_torch()
    t = lambda x: None if x is None else torch.tensor(x)
    pos, deltas = hf_model.model.get_rope_index(t(ids), t(types), t(igrid), t(vgrid), t(mask))
    return pos.numpy(), deltas.numpy().reshape(-1)


def assert_close(ours, theirs, mask, tol=TOL):
    valid = mask.astype(bool)
    diff = np.abs(np.asarray(ours)[valid] - theirs[valid]).max()
    assert diff <= tol, f"max |logit diff| on valid positions = {diff:.3e} > {tol}"
    print(f"parity max diff {diff:.2e}, logit scale {np.abs(theirs[valid]).max():.2f}")
    return diff


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, torch_module):
    directory = str(tmp_path_factory.mktemp("tiny"))
    hf = build_hf_tiny(directory)
    return directory, hf, load_pretrained(directory)


def test_text_only_left_padded(tiny):
    directory, hf, ours = tiny
    rng = np.random.default_rng(0)
    ids, mask, types = pad_batch([[IM_START] + text_ids(rng, 12), [IM_START] + text_ids(rng, 6)])
    out = ours(input_ids=ids, attention_mask=mask, mm_token_type_ids=types)
    pos, _ = hf_positions(hf, ids, mask, types)
    np.testing.assert_array_equal(out.position_ids, pos)
    text_pos = np.maximum(np.cumsum(mask, -1) - 1, 0)[None]
    four_row = np.concatenate([text_pos, pos], 0)
    assert_close(out.logits, hf_logits(hf, ids, mask, types, position_ids=four_row), mask)
    # a left-padded row equals its unpadded run
    alone = ours(input_ids=ids[1:, -7:])
    np.testing.assert_allclose(np.asarray(alone.logits)[0], np.asarray(out.logits)[1, -7:], atol=1e-5)


def test_one_image(tiny):
    _, hf, ours = tiny
    rng = np.random.default_rng(1)
    grid = [[1, 8, 12]]
    row = [IM_START] + text_ids(rng, 4) + image_tokens(grid[0]) + text_ids(rng, 5) + [IM_END]
    ids, mask, types = pad_batch([row])
    pv = patches(rng, grid)
    out = ours(input_ids=ids, attention_mask=mask, mm_token_type_ids=types, pixel_values=pv,
               image_grid_thw=grid)
    pos, deltas = hf_positions(hf, ids, mask, types, igrid=grid)
    np.testing.assert_array_equal(out.position_ids, pos)
    np.testing.assert_array_equal(out.rope_deltas, deltas)
    assert_close(out.logits, hf_logits(hf, ids, mask, types, pv, grid), mask)


def test_one_video_three_groups(tiny):
    _, hf, ours = tiny
    rng = np.random.default_rng(2)
    grid = [[3, 4, 8]]
    row = [IM_START] + text_ids(rng, 3) + video_tokens(rng, grid[0]) + text_ids(rng, 4)
    ids, mask, types = pad_batch([row])
    pvv = patches(rng, grid)
    out = ours(input_ids=ids, attention_mask=mask, mm_token_type_ids=types,
               pixel_values_videos=pvv, video_grid_thw=grid)
    pos, _ = hf_positions(hf, ids, mask, types, vgrid=grid)
    np.testing.assert_array_equal(out.position_ids, pos)
    assert_close(out.logits, hf_logits(hf, ids, mask, types, pvv=pvv, vgrid=grid), mask)


def test_image_and_video_in_one_prompt(tiny):
    _, hf, ours = tiny
    rng = np.random.default_rng(3)
    igrid, vgrid = [[1, 4, 4], [1, 6, 4]], [[2, 4, 4]]
    row = ([IM_START] + image_tokens(igrid[0]) + text_ids(rng, 2) + video_tokens(rng, vgrid[0])
           + image_tokens(igrid[1]) + text_ids(rng, 3))
    ids, mask, types = pad_batch([row])
    pv, pvv = patches(rng, igrid), patches(rng, vgrid)
    out = ours(input_ids=ids, attention_mask=mask, mm_token_type_ids=types, pixel_values=pv,
               image_grid_thw=igrid, pixel_values_videos=pvv, video_grid_thw=vgrid)
    assert_close(out.logits, hf_logits(hf, ids, mask, types, pv, igrid, pvv, vgrid), mask)


def mixed_batch(seed=4):
    rng = np.random.default_rng(seed)
    igrid, vgrid = [[1, 4, 6], [1, 4, 4]], [[3, 4, 4]]
    rows = [[IM_START] + text_ids(rng, 2) + image_tokens(igrid[0]) + text_ids(rng, 6),
            [IM_START] + text_ids(rng, 3) + video_tokens(rng, vgrid[0]) + text_ids(rng, 2),
            [IM_START] + text_ids(rng, 9),
            [IM_START] + image_tokens(igrid[1]) + text_ids(rng, 1)]
    ids, mask, types = pad_batch(rows, left=True)
    return dict(ids=ids, mask=mask, types=types, pv=patches(rng, igrid), igrid=igrid,
                pvv=patches(rng, vgrid), vgrid=vgrid)


def ours_on(model, b):
    return model(input_ids=b["ids"], attention_mask=b["mask"], mm_token_type_ids=b["types"],
                 pixel_values=b["pv"], image_grid_thw=b["igrid"],
                 pixel_values_videos=b["pvv"], video_grid_thw=b["vgrid"])


def test_mixed_batch(tiny):
    _, hf, ours = tiny
    b = mixed_batch()
    out = ours_on(ours, b)
    pos, deltas = hf_positions(hf, b["ids"], b["mask"], b["types"], b["igrid"], b["vgrid"])
    np.testing.assert_array_equal(out.position_ids, pos)
    np.testing.assert_array_equal(out.rope_deltas, deltas)
    theirs = hf_logits(hf, b["ids"], b["mask"], b["types"], b["pv"], b["igrid"], b["pvv"], b["vgrid"])
    assert_close(out.logits, theirs, b["mask"])


@pytest.mark.parametrize("scan", [False, True])
def test_deepstack_non_default_indexes_and_scan(tmp_path, torch_module, scan):
    directory = str(tmp_path)
    hf = build_hf_tiny(directory, seed=5, depth=4, text_layers=3, deepstack=(3, 1))
    ours = load_pretrained(directory, scan_layers=scan, remat=scan)
    b = mixed_batch(6)
    theirs = hf_logits(hf, b["ids"], b["mask"], b["types"], b["pv"], b["igrid"], b["pvv"], b["vgrid"])
    assert_close(ours_on(ours, b).logits, theirs, b["mask"])


def test_tied_embeddings(tmp_path, torch_module):
    import os

    from paravt_jax.models.qwen3_vl import safetensors_io as st

    directory = str(tmp_path)
    hf = build_hf_tiny(directory, seed=7, tie=True)
    assert "lm_head.weight" not in st.open_checkpoint(directory)
    ours = load_pretrained(directory)
    assert ours.config.tie_word_embeddings and not hasattr(ours.language, "lm_head")
    b = mixed_batch(8)
    theirs = hf_logits(hf, b["ids"], b["mask"], b["types"], b["pv"], b["igrid"], b["pvv"], b["vgrid"])
    assert_close(ours_on(ours, b).logits, theirs, b["mask"])
    assert os.path.isfile(os.path.join(directory, "config.json"))


def test_457_format_config(tmp_path, torch_module):
    from transformers import Qwen3VLForConditionalGeneration

    directory = str(tmp_path)
    build_hf_tiny(directory, seed=9)
    rewrite_config_as_457(directory)
    hf = Qwen3VLForConditionalGeneration.from_pretrained(directory).eval()
    ours = load_pretrained(directory)
    assert ours.config.text.mrope_section == (4, 2, 2)
    assert ours.config.text.rope_theta == 5_000_000.0
    b = mixed_batch(10)
    theirs = hf_logits(hf, b["ids"], b["mask"], b["types"], b["pv"], b["igrid"], b["pvv"], b["vgrid"])
    assert_close(ours_on(ours, b).logits, theirs, b["mask"])


def test_bf16_close_to_fp32(tiny):
    directory, _, ours = tiny
    b = mixed_batch(11)
    fp32 = np.asarray(ours_on(ours, b).logits)
    bf16_model = load_pretrained(directory, dtype="bfloat16")
    bf16 = np.asarray(ours_on(bf16_model, b).logits)
    valid = b["mask"].astype(bool)
    assert np.isfinite(bf16[valid]).all()
    diff = np.abs(bf16[valid] - fp32[valid]).max()
    assert diff <= 0.15, f"bf16 vs fp32 max diff {diff}"
