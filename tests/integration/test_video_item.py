"""The Qwen3-VL video item: layout, patches, timestamps and positions against transformers'
own video code, logits against its PyTorch model, and the Charades-STA request built with it."""
import dataclasses
import types

import numpy as np
import pytest

from conftest import require_torch
from paravt_jax.agent.dispatch import CropDispatcher
from paravt_jax.agent.protocol import PromptFormat
from paravt_jax.agent.rollout import Episode, overview_prompts
from paravt_jax.data.synthetic import Event, write_video
from paravt_jax.eval import driver, prompts
from paravt_jax.eval import records as store
from paravt_jax.models.qwen3_vl import load_pretrained
from paravt_jax.run_config import build_run
from paravt_jax.text import chat
from paravt_jax.text.inputs import encode
from paravt_jax.text.tokenizer import train_tokenizer
from paravt_jax.video.frames import group_times, patchify_video, video_smart_resize
from paravt_jax.video.reader import read_video_item
from support.hf_tiny import build_hf_tiny

CORPUS = ["When does the person open the door? <0.2 seconds> 1.0 seconds", "crop_video start_time"] * 20
PAD6 = "<|video_pad|>" * 6


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS)


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("video") / "charades.mp4")
    return write_video(path, 12.0, [Event(3.0, 6.0, "blue", "circle")], fps=4.0, height=96, width=128, seed=3)


def three_frames():
    return np.random.default_rng(0).integers(0, 256, (3, 64, 96, 3), dtype=np.uint8)


def test_layout_with_concrete_tokens(tokenizer):
    """3 frames (odd: the last is repeated) at 0, 0.5, 1 s: two groups at (0+0.5)/2 and 1 s,
    each 64x96 group = (64/32)*(96/32) = 6 pads, in place of the template's whole placeholder."""
    segments = chat.render([chat.Message("user", (chat.Video(three_frames(), np.array([0.0, 0.5, 1.0])),
                                                  chat.Text("When?")))], add_generation_prompt=True)
    inputs = encode(segments, tokenizer)
    assert tokenizer.decode(inputs.input_ids) == (
        "<|im_start|>user\n<0.2 seconds><|vision_start|>" + PAD6 + "<|vision_end|>"
        "<1.0 seconds><|vision_start|>" + PAD6 + "<|vision_end|>When?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert chat.placeholder_text(segments) == (
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>When?<|im_end|>\n<|im_start|>assistant\n")
    np.testing.assert_array_equal(inputs.video_grid_thw, [[2, 4, 6]])
    assert inputs.pixel_values_videos.shape == (2 * 4 * 6, 1536) and len(inputs.image_grid_thw) == 0
    assert (inputs.mm_token_type_ids == 2).sum() == 12 and (inputs.mm_token_type_ids == 1).sum() == 0
    assert not inputs.loss_mask.any()
    # each group is one (1, 4, 6) rope grid: the second group's pads start after its own text
    video_pos = inputs.position_ids[:, inputs.mm_token_type_ids == 2]
    first = video_pos[:, :6]
    np.testing.assert_array_equal(first[1] - first[0], [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(first[2] - first[0], [0, 1, 2, 0, 1, 2])
    assert video_pos[0, 6] > first.max()


def test_video_smart_resize_matches_transformers(torch_module):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    for t, h, w in [(32, 480, 640), (32, 360, 480), (120, 720, 1280), (4, 96, 160), (3, 20, 300), (31, 333, 517)]:
        for lo, hi in [(4096, 25165824), (4096, 32 * 32 * 64), (131072, 786432)]:
            assert video_smart_resize(t, h, w, min_pixels=lo, max_pixels=hi) == smart_resize(
                t, h, w, temporal_factor=2, factor=32, min_pixels=lo, max_pixels=hi), (t, h, w, lo, hi)


def test_patches_and_timestamps_match_transformers(torch_module):
    torch = require_torch()
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    frames = three_frames()
    ours, grid = patchify_video(frames)
    x = torch.tensor((frames.astype(np.float32) / 255 - 0.5) / 0.5).permute(0, 3, 1, 2)[None]  # B T C H W
    theirs, *their_grid = Qwen3VLVideoProcessor.patchify(None, x, patch_size=16, merge_size=2, temporal_patch_size=2)
    np.testing.assert_array_equal(grid, their_grid)
    np.testing.assert_allclose(ours, theirs[0].numpy(), atol=1e-6)
    indices, fps = [0, 7, 15, 22, 30], 7.5
    assert group_times(np.array(indices) / fps) == pytest.approx(
        Qwen3VLProcessor._calculate_timestamps(None, indices, fps, 2))


def test_ids_and_logits_match_transformers(tokenizer, tmp_path, torch_module):
    """Our encoded video prompt equals the one transformers' Qwen3VLProcessor expands (its
    `replace_video_token` in place of the template's whole placeholder), and the tiny model's logits
    over it equal transformers' PyTorch Qwen3-VL's (fp32)."""
    torch = require_torch()
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    indices, fps = np.array([0, 3, 6, 9, 12]), 6.0
    frames = np.random.default_rng(1).integers(0, 256, (5, 64, 64, 3), dtype=np.uint8)
    segments = chat.render([chat.Message("user", (chat.Video(frames, indices / fps), chat.Text("When?")))],
                           add_generation_prompt=True)
    inputs = encode(segments, tokenizer)

    processor = types.SimpleNamespace(
        video_processor=types.SimpleNamespace(merge_size=2, temporal_patch_size=2),
        vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>", video_token="<|video_pad|>",
        _calculate_timestamps=lambda *a: Qwen3VLProcessor._calculate_timestamps(None, *a))
    metadata = types.SimpleNamespace(fps=fps, frames_indices=indices)
    expanded = Qwen3VLProcessor.replace_video_token(
        processor, {"video_grid_thw": torch.tensor([[3, 4, 4]]), "video_metadata": [metadata]}, 0)
    prompt = "<|im_start|>user\n" + expanded + "When?<|im_end|>\n<|im_start|>assistant\n"
    assert inputs.input_ids.tolist() == tokenizer.encode(prompt)

    directory = str(tmp_path / "tiny")
    hf = build_hf_tiny(directory)
    ids = torch.tensor(inputs.input_ids[None].astype(np.int64))
    types_ = torch.tensor(inputs.mm_token_type_ids[None].astype(np.int64))
    grid = torch.tensor(inputs.video_grid_thw)
    positions, _ = hf.model.get_rope_index(ids, types_, None, grid, torch.ones_like(ids))
    np.testing.assert_array_equal(inputs.position_ids, positions.numpy()[:, 0])
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types_,
                    pixel_values_videos=torch.tensor(inputs.pixel_values_videos), video_grid_thw=grid).logits.numpy()
    ours = load_pretrained(directory)(**inputs.model_kwargs()).logits
    assert np.abs(np.asarray(ours) - theirs).max() < 1e-4


def test_read_video_item_samples_and_resizes_as_a_server(video):
    clip = read_video_item(video, 8, 4096, 8 * 64 * 96)
    np.testing.assert_array_equal(clip.indices, np.linspace(0, 47, 8).astype(int))  # 48 frames at 4 fps
    np.testing.assert_allclose(clip.timestamps, clip.indices / 4.0)
    assert clip.frames.shape[1:3] == video_smart_resize(8, 96, 128, min_pixels=4096, max_pixels=8 * 64 * 96)
    assert read_video_item(video, 64, 4096, 25165824).frames.shape[0] == 48  # fewer frames: all of them


def charades_prompt(tokenizer, video, visual):
    """The rendered Charades-STA request of the evaluation driver (agentic_minimal)."""
    prompt = dataclasses.replace(PromptFormat.reference_eval(), overview_visual=visual, overview_video_frames=4,
                                 overview_video_max_pixels=4 * 96 * 128, overview_min_pixels=784,
                                 overview_max_pixels=96 * 128, overview_sizing="single")  # tiny frames: one resize
    config = driver.DriverConfig(prompt_mode="agentic_minimal", nframes=4, prompt=prompt)
    rollout = driver.rollout_config(config, "tvg")
    episode = Episode("0", "When does the blue circle appear?", "[3.0, 6.0]", "tvg", video, config.nframes)
    with CropDispatcher() as pool:
        (inputs,), errors, _, _ = overview_prompts([episode], tokenizer, rollout.prompt, pool)
    assert errors == [None]
    return rollout, inputs


def test_charades_request_sends_one_video_item(tokenizer, video):
    rollout, inputs = charades_prompt(tokenizer, video, "video")
    assert rollout.prompt.overview_visual == "video" and driver.DriverConfig().prompt.overview_visual == "images"
    text = tokenizer.decode(inputs.input_ids)
    system = prompts.prompt_mode("agentic_minimal").system
    # 4 frames of 48 (indices 0, 15, 31, 47 at 4 fps): groups at 1.9 s and 9.8 s; 96x128 -> 12 pads
    pads = "<|video_pad|>" * 12
    assert text == (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
                    f"<1.9 seconds><|vision_start|>{pads}<|vision_end|><9.8 seconds><|vision_start|>{pads}"
                    "<|vision_end|>When does the blue circle appear? The video path for this video "
                    "is: charades.mp4<|im_end|>\n<|im_start|>assistant\n")
    np.testing.assert_array_equal(inputs.video_grid_thw, [[2, 6, 8]])
    assert len(inputs.image_grid_thw) == 0


def test_charades_images_option_restores_image_items(tokenizer, video):
    _, inputs = charades_prompt(tokenizer, video, "images")
    text = tokenizer.decode(inputs.input_ids)
    image = "<|vision_start|>" + "<|image_pad|>" * 12 + "<|vision_end|>"
    assert f"<|im_start|>user\n{image * 4}When does the blue circle appear? The video path" in text
    assert "seconds>" not in text and len(inputs.video_grid_thw) == 0 and len(inputs.image_grid_thw) == 4
    with pytest.raises(ValueError, match=r"overview_visual='clip': must be one of \('images', 'video'\)"):
        PromptFormat(overview_visual="clip")


def test_driver_runs_a_charades_sample_on_the_tiny_model(video, tokenizer, tmp_path):
    from paravt_jax.eval.datasets import EvalSample, LoadedBenchmark
    from paravt_jax.models.qwen3_vl import init_model, preset
    from paravt_jax.sampling import Sampler, SamplerConfig

    sample = EvalSample("charades", "0", video, "When does the blue circle appear?", "[3.0, 6.0]", False, "tvg",
                        span=(3.0, 6.0), key="charades.mp4>>>blue circle>>>[3.0, 6.0]")
    benchmark = LoadedBenchmark("charades", (sample,), (), ())
    prompt = dataclasses.replace(PromptFormat.reference_eval(), overview_visual="video", overview_video_frames=4,
                                 overview_video_max_pixels=4 * 96 * 128)
    config = driver.DriverConfig(prompt_mode="agentic_minimal", max_turns=1, max_new_tokens=8,
                                 grounding_answer_tokens=8, crop_max_pixels=96 * 128, batch_size=1, prompt=prompt)
    sampler = Sampler(init_model(preset("tiny"), seed=0), SamplerConfig(min_chunk_bucket=64))
    summary = driver.run_dataset(sampler, tokenizer, benchmark, config, str(tmp_path), log=lambda _: None)
    (record,) = store.read_records([store.shard_path(str(tmp_path), "charades", 0, 1)]).values()
    assert summary["complete"] and "error" not in record and record["turns"] >= 1
    assert record["context_tokens"] > 2 * 12 and 0.0 <= record["score"] <= 1.0
    assert {"mIoU", "R@0.5"} <= set(summary)


def test_charades_gets_the_video_item_by_default():
    from paravt_jax.configs import eval as eval_config

    c = eval_config.get_config("paravt_8b")
    charades, videomme = driver.driver_config(build_run(c), "charades"), driver.driver_config(build_run(c), "videomme")
    assert (charades.prompt_mode, charades.prompt.overview_visual) == ("agentic_minimal", "video")
    assert (videomme.prompt_mode, videomme.prompt.overview_visual) == ("agentic_general", "images")
    c.grounding_visual = "images"
    built = driver.driver_config(build_run(c), "charades")
    assert built.prompt.overview_visual == "images"
    assert (built.prompt.overview_video_frames, built.prompt.overview_video_max_pixels) == (32, 25165824)
