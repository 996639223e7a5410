"""The exported HF checkpoint as other tools load it: transformers' processor built from the
export's own files (chat template, tokenizer, preprocessor configs) renders a tool-calling chat
with images to our prompt ids and patches, and `AutoModelForImageTextToText` loaded from the
export decodes the same greedy tokens as our sampler."""
import json
import os

import numpy as np
import pytest

from conftest import require_torch
from paravt_jax.text import chat
from paravt_jax.text.hf_processor import IMAGE_PROCESSOR, VIDEO_PROCESSOR, processor_files
from paravt_jax.text.inputs import encode
from paravt_jax.text.tokenizer import Tokenizer, train_tokenizer

TIER = "integration"  # the tiny model against transformers

CORPUS = ["When does the red circle appear? <0.5 seconds> summary of the segment",
          'The answer is [12.0, 15.5]. A blue square appears. {"name": "crop_video"}'] * 30
NEW = 8
CALLS = [{"video_path": "clip.mp4", "start_time": 1.0, "end_time": 4.5},
         {"video_path": "clip.mp4", "start_time": 20.0, "end_time": 26.0}]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    from paravt_jax.models.qwen3_vl import init_model, preset
    from paravt_jax.runtime import save_export

    directory = str(tmp_path_factory.mktemp("export") / "final")
    tokenizer = train_tokenizer(CORPUS)
    save_export(init_model(preset("tiny"), seed=5), tokenizer, directory)
    return directory


def hf_processor(directory):
    """AutoProcessor on the export; without torchvision (absent here), whose lack stops
    transformers' Qwen3-VL video processor class from loading, the same processor class built
    from the export's tokenizer, image processor and chat template."""
    require_torch()
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, Qwen3VLProcessor
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return AutoProcessor.from_pretrained(directory)
    with pytest.raises(ImportError, match="Qwen3VLVideoProcessor requires the Torchvision library"):
        AutoProcessor.from_pretrained(directory)
    from transformers.processing_utils import ProcessorMixin

    tokenizer = AutoTokenizer.from_pretrained(directory)
    images = AutoImageProcessor.from_pretrained(directory)
    original = ProcessorMixin.check_argument_for_proper_class  # the video processor's class check
    ProcessorMixin.check_argument_for_proper_class = lambda self, name, arg: None
    try:
        return Qwen3VLProcessor(image_processor=images, tokenizer=tokenizer, video_processor=None,
                                chat_template=tokenizer.chat_template)
    finally:
        ProcessorMixin.check_argument_for_proper_class = original


def call_text(arguments):
    return "<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": arguments}) + "\n</tool_call>"


def conversation(frames, timestamps, tools):
    """The same tool-calling chat as our messages and as chat-template messages: the overview
    as timestamped images, two parallel calls, one response per call, the next turn's prompt."""
    question = "When does the blue square appear?"
    ours = chat.paravt_messages(question, frames, timestamps, video_name="clip.mp4", tools=tools)
    thought = "<think>\nTwo windows to check.\n</think>"
    ours += [chat.Message.of("assistant", thought + "\n" + "\n".join(call_text(a) for a in CALLS))]
    ours += chat.tool_response_messages(["A red circle.", "A blue square at 22 s."])
    from PIL import Image

    user = []
    for frame, t in zip(frames, timestamps):
        user += [{"type": "text", "text": f"<{t:.1f} seconds>"}, {"type": "image", "image": Image.fromarray(frame)}]
    user.append({"type": "text", "text": f"{question}\nThe video path for this video is: clip.mp4"})
    theirs = [{"role": "user", "content": user},
              {"role": "assistant", "content": thought,
               "tool_calls": [{"type": "function", "function": {"name": "crop_video", "arguments": a}}
                              for a in CALLS]},
              {"role": "tool", "content": "A red circle."},
              {"role": "tool", "content": [{"type": "text", "text": "A blue square at 22 s."}]}]
    return ours, theirs


def test_the_export_carries_the_template_and_processor_configs(export):
    for name, text in processor_files().items():
        with open(os.path.join(export, name)) as f:
            assert f.read() == text
    with open(os.path.join(export, "preprocessor_config.json")) as f:
        assert json.load(f)["size"] == {"shortest_edge": 65536, "longest_edge": 16777216}
    assert IMAGE_PROCESSOR["patch_size"] * IMAGE_PROCESSOR["merge_size"] == 32
    assert VIDEO_PROCESSOR["size"] == {"shortest_edge": 4096, "longest_edge": 25165824}
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert os.path.isfile(os.path.join(export, name)), name


@pytest.mark.parametrize("layout", ["object", "flat"])
def test_processor_renders_a_tool_calling_chat_with_images_as_we_do(export, layout):
    processor = hf_processor(export)
    tokenizer = Tokenizer.from_directory(export)
    rng = np.random.default_rng(0)
    frames = (rng.random((2, 256, 256, 3)) * 255).astype(np.uint8)  # >= 65,536 pixels: no resize
    tools = (chat.crop_video_tool(layout=layout),)
    ours, theirs = conversation(frames, [1.0, 12.5], tools)
    segments = chat.render(ours, add_generation_prompt=True, assistant_prefix="<think>\n")
    text = processor.apply_chat_template(theirs, tools=list(tools), add_generation_prompt=True, tokenize=False)
    assert text == chat.placeholder_text(segments)
    bare = processor.apply_chat_template(theirs, tools=list(tools), add_generation_prompt=True, tokenize=False,
                                         think_prefix=False)
    assert bare == text[:-len("<think>\n")] and bare.endswith("<|im_start|>assistant\n")
    no_tools = chat.render(chat.paravt_messages("Hi?", frames[:1], None, tools=()), add_generation_prompt=True,
                           assistant_prefix="<think>\n")
    assert processor.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
            {"type": "image", "image": None}, {"type": "text", "text": "Hi?"}]}],
        add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n" + chat.placeholder_text(no_tools))

    inputs = processor.apply_chat_template(theirs, tools=list(tools), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="np")
    mine = encode(segments, tokenizer)
    assert inputs["input_ids"][0].tolist() == mine.input_ids.tolist()
    assert inputs["mm_token_type_ids"][0].tolist() == mine.mm_token_type_ids.tolist()
    np.testing.assert_array_equal(inputs["image_grid_thw"], mine.image_grid_thw)
    np.testing.assert_allclose(inputs["pixel_values"], mine.pixel_values, atol=1e-6)


def test_auto_model_loads_the_export_and_decodes_our_greedy_tokens(export):
    torch = require_torch()
    from transformers import AutoModelForImageTextToText

    from paravt_jax.models.qwen3_vl import load_pretrained
    from paravt_jax.sampling import Sampler, SamplingParams

    processor = hf_processor(export)
    rng = np.random.default_rng(1)
    frames = (rng.random((2, 256, 320, 3)) * 255).astype(np.uint8)
    tools = (chat.CROP_VIDEO_TOOL,)
    ours, theirs = conversation(frames, [0.0, 30.0], tools)
    inputs = processor.apply_chat_template(theirs, tools=list(tools), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt")
    hf = AutoModelForImageTextToText.from_pretrained(export, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3VLForConditionalGeneration"
    with torch.no_grad():
        out = hf.generate(**inputs, max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    theirs_tokens = out[0, inputs["input_ids"].shape[1]:].tolist()

    prompt = encode(chat.render(ours, add_generation_prompt=True, assistant_prefix="<think>\n"),
                    Tokenizer.from_directory(export))
    result, _ = Sampler(load_pretrained(export)).generate([prompt], sampling=SamplingParams(max_new_tokens=NEW))
    assert len(theirs_tokens) == NEW and result.tokens[0] == theirs_tokens
