"""Our patches / prompt ids / positions / logits vs transformers' processor and model."""
import numpy as np
import pytest

from conftest import require_torch
from paravt_jax.models.qwen3_vl import load_pretrained
from paravt_jax.text import chat
from paravt_jax.text.inputs import check_against_model, encode, encode_ids
from paravt_jax.text.tokenizer import Tokenizer, train_tokenizer
from paravt_jax.video.frames import patchify_image
from paravt_jax.video.reader import resize_frames
from support.hf_tiny import build_hf_tiny

CORPUS = ["When does the red circle appear? <0.5 seconds> summary of the segment",
          "The answer is [12.0, 15.5]. A blue square appears."] * 30


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tok"))
    train_tokenizer(CORPUS).save(directory)
    return Tokenizer.from_directory(directory), directory


def hf_processor(tokenizer_dir):
    require_torch("torchvision")  # transformers' Qwen3-VL video processor needs it
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessorPil, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tok = PreTrainedTokenizerFast(tokenizer_file=f"{tokenizer_dir}/tokenizer.json",
                                  pad_token="<|endoftext|>", eos_token="<|im_end|>")
    images = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                                      image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                      size={"shortest_edge": 784, "longest_edge": 50176})
    return Qwen3VLProcessor(image_processor=images, tokenizer=tok, video_processor=Qwen3VLVideoProcessor())


def random_frames(rng, n, h, w):
    return (rng.random((n, h, w, 3)) * 255).astype(np.uint8)


def test_special_ids_come_from_the_tokenizer(tokenizer):
    tok, _ = tokenizer
    sp = tok.special
    assert (sp.pad, sp.im_start, sp.im_end, sp.vision_start, sp.image_pad, sp.think_end) == (
        900, 901, 902, 909, 912, 925)
    assert tok.decode(tok.encode("<think>\nhi</think>")) == "<think>\nhi</think>"


@pytest.mark.parametrize("size", [(64, 96), (128, 32), (224, 224)])
def test_patches_equal_hf_without_resize(tokenizer, size):
    from PIL import Image

    proc = hf_processor(tokenizer[1])
    frame = random_frames(np.random.default_rng(0), 1, *size)[0]
    theirs = proc.image_processor(images=[Image.fromarray(frame)], return_tensors="np")
    ours, grid = patchify_image(frame)
    np.testing.assert_array_equal(grid[None], theirs["image_grid_thw"])
    np.testing.assert_allclose(ours, theirs["pixel_values"], atol=1e-6)


@pytest.mark.parametrize("size", [(100, 150), (360, 640), (37, 501)])
def test_patches_close_to_hf_with_resize(tokenizer, size):
    from PIL import Image

    proc = hf_processor(tokenizer[1])
    frame = random_frames(np.random.default_rng(1), 1, *size)[0]
    theirs = proc.image_processor(images=[Image.fromarray(frame)], return_tensors="np")
    resized = resize_frames(frame[None], 784, 50176)[0]
    ours, grid = patchify_image(resized)
    np.testing.assert_array_equal(grid[None], theirs["image_grid_thw"])
    assert np.abs(ours - theirs["pixel_values"]).max() <= 2 * (2 / 255) + 1e-6


def paravt_segments(rng, n_frames=3):
    frames = random_frames(rng, n_frames, 64, 96)
    messages = chat.paravt_messages("When does the red circle appear?", frames,
                                    [0.0, 4.5, 9.0][:n_frames], video_name="v.mp4")
    return chat.render(messages, add_generation_prompt=True, assistant_prefix="<think>\n"), frames


def test_prompt_ids_types_positions_and_logits_equal_hf(tokenizer, tmp_path, torch_module):
    from PIL import Image

    tok, tok_dir = tokenizer
    proc = hf_processor(tok_dir)
    segments, frames = paravt_segments(np.random.default_rng(2))
    ours = encode(segments, tok)
    theirs = proc(text=[chat.placeholder_text(segments)], images=[Image.fromarray(f) for f in frames],
                  return_tensors="np")
    np.testing.assert_array_equal(ours.input_ids, theirs["input_ids"][0])
    np.testing.assert_array_equal(ours.mm_token_type_ids, theirs["mm_token_type_ids"][0])
    np.testing.assert_allclose(ours.pixel_values, theirs["pixel_values"], atol=1e-6)
    np.testing.assert_array_equal(ours.image_grid_thw, theirs["image_grid_thw"])
    hf = build_hf_tiny(str(tmp_path), seed=31)
    torch = torch_module
    t = {k: torch.tensor(v) for k, v in theirs.items()}
    pos, delta = hf.model.get_rope_index(t["input_ids"], t["mm_token_type_ids"], t["image_grid_thw"],
                                         None, t["attention_mask"])
    np.testing.assert_array_equal(ours.position_ids, pos.numpy()[:, 0])
    assert ours.rope_delta == int(delta.reshape(-1)[0])
    model = load_pretrained(str(tmp_path))
    check_against_model(tok, model.config)
    with torch.no_grad():
        hf_logits = hf(**t).logits.numpy()[0]
    our_logits = np.asarray(model(**ours.model_kwargs()).logits)[0]
    assert np.abs(our_logits - hf_logits).max() <= 1e-4


def test_extension_equals_full_encode(tokenizer):
    tok, _ = tokenizer
    rng = np.random.default_rng(3)
    prefix, _ = paravt_segments(rng, 2)
    generated = tok.encode('The window matters.</think>\n<tool_call>\n{"name": "crop_video"}\n</tool_call>')
    generated += [tok.special.im_end]
    crop = random_frames(rng, 2, 32, 64)
    responses = chat.tool_response_messages(["a red circle from 3.0 to 5.0 seconds",
                                             [chat.Text("2 frames from 3 s to 5 s."),
                                              *chat.frames_as_images(crop, [3.0, 5.0])]])
    chunk = [chat.Text("\n")] + chat.render(responses, add_generation_prompt=True, assistant_prefix="<think>\n")
    first = encode(prefix, tok)
    step = encode_ids(generated, first.next_position)
    second = encode(chunk, tok, start_position=first.next_position + len(generated))
    incremental = first.extend(step).extend(second)
    full = encode(prefix + [chat.Text(tok.decode(generated), trainable=True)] + chunk, tok)
    for field in ("input_ids", "mm_token_type_ids", "position_ids", "pixel_values", "image_grid_thw", "loss_mask"):
        np.testing.assert_array_equal(getattr(incremental, field), getattr(full, field), err_msg=field)
    assert incremental.next_position == full.next_position
    assert incremental.loss_mask.sum() == len(generated)
    with pytest.raises(ValueError, match="start_position"):
        first.extend(encode(chunk, tok, start_position=0))


def test_tokenizer_model_mismatch_is_named(tokenizer):
    from paravt_jax.models.qwen3_vl import preset

    tok, _ = tokenizer
    with pytest.raises(ValueError, match="image_token_id: config 151655 vs tokenizer 912"):
        check_against_model(tok, preset("8b"))
    with pytest.raises(Exception, match="no tokenizer.json"):
        Tokenizer.from_directory("/nonexistent")
