"""The checkpoints the jobs write, as other tools load them: `AutoProcessor.from_pretrained` on an
`export` and on the main job's `final/` (both `cli/assembly.py`'s `save_export`) builds transformers' own
Qwen3-VL processor (tokenizer, image and video processors, chat template) from their files,
renders a tool-calling chat with a video and images to our prompt ids, patches and grids, and
`AutoModelForImageTextToText` loaded from the same directory decodes our sampler's greedy
tokens."""
import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

from conftest import once_per_session, require_torch
from paravt_jax.text import chat
from paravt_jax.text.hf_processor import IMAGE_PROCESSOR, VIDEO_PROCESSOR, processor_files
from paravt_jax.text.inputs import encode
from paravt_jax.text.tokenizer import Tokenizer, train_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = ["When does the red circle appear? <0.5 seconds> summary of the segment",
          'The answer is [12.0, 15.5]. A blue square appears. {"name": "crop_video"}'] * 30
NEW = 8
CALLS = [{"video_path": "clip.mp4", "start_time": 1.0, "end_time": 4.5},
         {"video_path": "clip.mp4", "start_time": 20.0, "end_time": 26.0}]
QUESTION = "When does the blue square appear?"
THOUGHT = "<think>\nTwo windows to check.\n</think>"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    from paravt_jax.cli.assembly import save_export
    from paravt_jax.models.qwen3_vl import init_model, preset

    directory = str(tmp_path_factory.mktemp("export") / "export")
    save_export(init_model(preset("tiny"), seed=5), train_tokenizer(CORPUS), directory)
    return directory


def _main_job(builtin_root, directory):
    """`paravt-jax run` on the tiny preset: one SFT step, no RL, no evaluation; it writes final/."""
    from paravt_jax.cli import main

    out, log = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(log):
        status = main(["paravt-jax", "run", f"--config={ROOT}/configs/paragrpo.py:tiny",
                       f"--workdir={directory}/run", f"--config.data.builtin_root={builtin_root}",
                       "--config.sft.steps=1", "--config.sft.batch_size=1", "--config.sft.nframes=2",
                       "--config.rl.steps=0", "--config.evals.held_out.nframes=()"])
    assert status == 0, (out.getvalue() + log.getvalue())[-2000:]


@pytest.fixture(scope="session")
def main_job_final(builtin_root):
    root = once_per_session("hf_export_main_job", lambda directory: _main_job(builtin_root, directory))
    return os.path.join(root, "run", "final")


@pytest.fixture(params=["export", "main_job_final"])
def checkpoint(request):
    """The directory of an `export`, then of the main job's `final/`."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    """A 4 s, 4 fps, 64x96 mp4 (16 frames): at the video processor's 2 fps both samplers take 8."""
    from paravt_jax.data.synthetic import Event, write_video

    path = str(tmp_path_factory.mktemp("video") / "clip.mp4")
    return write_video(path, 4.0, [Event(1.0, 3.0, "blue", "square")], fps=4.0, height=64, width=96, seed=1)


def auto_processor(directory):
    """transformers' processor from the checkpoint's files alone (its Qwen3-VL video processor
    needs torchvision: under CI a missing torchvision fails, as a missing torch does)."""
    require_torch("torchvision")
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(directory)
    assert [type(x).__name__ for x in (processor, processor.image_processor, processor.video_processor)] == [
        "Qwen3VLProcessor", "Qwen2VLImageProcessor", "Qwen3VLVideoProcessor"]
    return processor


def call_text(arguments):
    return "<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": arguments}) + "\n</tool_call>"


def conversation(visual, video, tools, seed):
    """The same tool-calling chat as our segments and as chat-template messages: the overview
    (timestamped 256x256 images, or the video item: our reader's frames at 2 fps; transformers
    gets every decoded frame and the video's metadata and samples them itself), two parallel
    calls, one response per call (the first with two crop frames as images, the timestamped
    frames-mode layout), the next turn's prompt with the `<think>` prefix. Returns (segments,
    messages, processor keyword arguments)."""
    from PIL import Image

    from paravt_jax.video.reader import VideoReader, read_frames

    rng = np.random.default_rng(seed)
    crops = (rng.random((2, 256, 256, 3)) * 255).astype(np.uint8)  # >= 65,536 pixels: no resize
    response = f"2 frames from {CALLS[0]['start_time']:.1f} s to {CALLS[0]['end_time']:.1f} s.\n"
    user, kwargs = [], {}
    if visual == "images":
        frames, times = (rng.random((2, 256, 256, 3)) * 255).astype(np.uint8), [1.0, 12.5]
        for frame, t in zip(frames, times):
            user += [{"type": "text", "text": f"<{t:.1f} seconds>"}, {"type": "image", "image": Image.fromarray(frame)}]
    else:
        clip = read_frames(video, fps=2.0)
        frames, times = clip.frames, clip.timestamps
        assert frames.shape == (8, 64, 96, 3) and clip.indices.tolist() == [0, 2, 4, 6, 9, 11, 13, 15]
        reader = VideoReader(video)
        meta = reader.metadata
        user.append({"type": "video", "video": reader.get(range(meta.num_frames))})
        kwargs["video_metadata"] = [{"fps": meta.fps, "total_num_frames": meta.num_frames}]
    user.append({"type": "text", "text": f"{QUESTION}\nThe video path for this video is: clip.mp4"})
    theirs = [{"role": "user", "content": user},
              {"role": "assistant", "content": THOUGHT,
               "tool_calls": [{"type": "function", "function": {"name": "crop_video", "arguments": a}}
                              for a in CALLS]},
              {"role": "tool", "content": [{"type": "text", "text": response}] + [
                  item for crop, t in zip(crops, (1.0, 4.5))
                  for item in ({"type": "text", "text": f"<{t:.1f} seconds>"},
                               {"type": "image", "image": Image.fromarray(crop)})]},
              {"role": "tool", "content": [{"type": "text", "text": "A blue square at 22 s."}]}]

    ours = chat.paravt_messages(QUESTION, frames, times, video_name="clip.mp4", tools=tools, visual=visual)
    ours += [chat.Message.of("assistant", THOUGHT + "\n" + "\n".join(call_text(a) for a in CALLS))]
    ours += chat.tool_response_messages([[chat.Text(response), *chat.frames_as_images(crops, [1.0, 4.5])],
                                         "A blue square at 22 s."])
    segments = chat.render(ours, add_generation_prompt=True, assistant_prefix="<think>\n")
    return segments, theirs, kwargs


def test_the_checkpoint_carries_the_template_and_processor_configs(checkpoint):
    for name, text in processor_files().items():
        with open(os.path.join(checkpoint, name)) as f:
            assert f.read() == text
    with open(os.path.join(checkpoint, "preprocessor_config.json")) as f:
        assert json.load(f)["size"] == {"shortest_edge": 65536, "longest_edge": 16777216}
    assert IMAGE_PROCESSOR["patch_size"] * IMAGE_PROCESSOR["merge_size"] == 32
    assert VIDEO_PROCESSOR["size"] == {"shortest_edge": 4096, "longest_edge": 25165824}
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert os.path.isfile(os.path.join(checkpoint, name)), name


@pytest.mark.parametrize("visual,layout", [("video", "object"), ("video", "flat"), ("images", "object")])
def test_auto_processor_renders_a_tool_calling_chat_with_a_video_and_images_as_we_do(checkpoint, video, visual,
                                                                                      layout):
    processor = auto_processor(checkpoint)
    tools = (chat.crop_video_tool(layout=layout),)
    segments, theirs, kwargs = conversation(visual, video, tools, seed=0)
    text = processor.apply_chat_template(theirs, tools=list(tools), add_generation_prompt=True, tokenize=False)
    assert text == chat.placeholder_text(segments)
    bare = processor.apply_chat_template(theirs, tools=list(tools), add_generation_prompt=True, tokenize=False,
                                         think_prefix=False)
    assert bare == text[:-len("<think>\n")] and bare.endswith("<|im_start|>assistant\n")
    no_tools = chat.render(chat.paravt_messages("Hi?", np.zeros((1, 32, 32, 3), np.uint8), None, tools=()),
                           add_generation_prompt=True, assistant_prefix="<think>\n")
    assert processor.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
            {"type": "image", "image": None}, {"type": "text", "text": "Hi?"}]}],
        add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n" + chat.placeholder_text(no_tools))

    inputs = processor.apply_chat_template(theirs, tools=list(tools), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="np", processor_kwargs=kwargs)
    mine = encode(segments, Tokenizer.from_directory(checkpoint))
    assert inputs["input_ids"][0].tolist() == mine.input_ids.tolist()
    assert inputs["mm_token_type_ids"][0].tolist() == mine.mm_token_type_ids.tolist()
    np.testing.assert_array_equal(inputs["image_grid_thw"], mine.image_grid_thw)
    np.testing.assert_allclose(inputs["pixel_values"], mine.pixel_values, atol=1e-6)
    if visual == "video":
        np.testing.assert_array_equal(inputs["video_grid_thw"], mine.video_grid_thw)
        np.testing.assert_allclose(inputs["pixel_values_videos"], mine.pixel_values_videos, atol=1e-6)
        assert mine.video_grid_thw.tolist() == [[4, 4, 6]] and len(mine.image_grid_thw) == 2
    else:
        assert "video_grid_thw" not in inputs and len(mine.image_grid_thw) == 4


def test_auto_model_decodes_our_greedy_tokens_after_a_video_and_images(checkpoint, video):
    torch = require_torch("torchvision")
    from transformers import AutoModelForImageTextToText

    from paravt_jax.models.qwen3_vl import load_pretrained
    from paravt_jax.sampling import Sampler, SamplingParams

    processor = auto_processor(checkpoint)
    tools = (chat.CROP_VIDEO_TOOL,)
    segments, theirs, kwargs = conversation("video", video, tools, seed=1)
    inputs = processor.apply_chat_template(theirs, tools=list(tools), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt", processor_kwargs=kwargs)
    assert inputs["video_grid_thw"].tolist() == [[4, 4, 6]] and inputs["image_grid_thw"].shape == (2, 3)
    hf = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3VLForConditionalGeneration"
    with torch.no_grad():
        out = hf.generate(**inputs, max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    theirs_tokens = out[0, inputs["input_ids"].shape[1]:].tolist()

    prompt = encode(segments, Tokenizer.from_directory(checkpoint))
    result, _ = Sampler(load_pretrained(checkpoint)).generate([prompt], sampling=SamplingParams(max_new_tokens=NEW))
    assert len(theirs_tokens) == NEW and result.tokens[0] == theirs_tokens
