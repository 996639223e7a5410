"""The files beside an exported HF checkpoint that let transformers' `AutoProcessor` and serving
engines build prompts as our renderer does: the chat template (`chat_template.jinja`), the
image processor's `preprocessor_config.json` and the video processor's
`video_preprocessor_config.json` (the stock Qwen3-VL values: 16-pixel patches merged 2x2,
temporal patches of 2 frames, pixels scaled to [-1, 1]).

The template renders what `chat.render` renders for the same conversation:
- a system turn with the Hermes tool envelope of `chat.tools_system_prompt` when tools are given
  (after the system message's own text and a blank line);
- user content as text, `{"type": "image"}` and `{"type": "video"}` items, each image or video
  as `<|vision_start|><|image_pad|><|vision_end|>` (or `<|video_pad|>`), which the processor
  expands to the item's merged patch count;
- assistant turns as their text, then any structured `tool_calls` as
  `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` blocks, newline-separated;
- every `tool` message as its own user turn, `<tool_response>\\n...\\n</tool_response>`: the
  ParaVT protocol the model is trained on (one turn per call, in call order), where the stock
  Qwen3-VL template puts consecutive tool messages in one user turn;
- the generation prompt `<|im_start|>assistant\\n` followed by `<think>\\n`, the forced prefix
  of our rollouts (`think_prefix=false` in the template arguments leaves it out).
"""
from __future__ import annotations

import json

from paravt_jax.video.frames import MERGE, PATCH, PROCESSOR_MAX_PIXELS, PROCESSOR_MIN_PIXELS, TEMPORAL

# Jinja whitespace: every tag trims on both sides ({%- -%}), so only {{ }} output reaches the
# prompt.
_CONTENT = """\
{%- macro content(items) -%}
  {%- if items is string -%}{{ items }}
  {%- else -%}
    {%- for item in items -%}
      {%- if item.type == 'image' or 'image' in item or 'image_url' in item -%}
        {{ '<|vision_start|><|image_pad|><|vision_end|>' }}
      {%- elif item.type == 'video' or 'video' in item -%}
        {{ '<|vision_start|><|video_pad|><|vision_end|>' }}
      {%- elif 'text' in item -%}{{ item.text }}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
"""

_TOOLS = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
_TOOLS_END = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
)

CHAT_TEMPLATE = _CONTENT + """\
{%- set first = 0 -%}
{%- if messages and messages[0].role == 'system' -%}{%- set first = 1 -%}{%- endif -%}
{%- if tools or first -%}
  {{ '<|im_start|>system\\n' }}
  {%- if first -%}{{ content(messages[0].content) }}{%- if tools -%}{{ '\\n\\n' }}{%- endif -%}{%- endif -%}
  {%- if tools -%}
    {{ "@TOOLS@" }}
    {%- for tool in tools -%}{{ '\\n' }}{{ tool | tojson }}{%- endfor -%}
    {{ "@TOOLS_END@" }}
  {%- endif -%}
  {{ '<|im_end|>\\n' }}
{%- endif -%}
{%- for message in messages[first:] -%}
  {%- if message.role == 'user' or message.role == 'system' -%}
    {{ '<|im_start|>' + message.role + '\\n' }}{{ content(message.content) }}{{ '<|im_end|>\\n' }}
  {%- elif message.role == 'assistant' -%}
    {{ '<|im_start|>assistant\\n' }}
    {%- if message.content -%}{{ content(message.content) }}{%- endif -%}
    {%- for call in message.tool_calls or [] -%}
      {%- if message.content or not loop.first -%}{{ '\\n' }}{%- endif -%}
      {%- if call.function -%}{%- set call = call.function -%}{%- endif -%}
      {{ '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
      {%- if call.arguments is string -%}{{ call.arguments }}{%- else -%}{{ call.arguments | tojson }}{%- endif -%}
      {{ '}\\n</tool_call>' }}
    {%- endfor -%}
    {{ '<|im_end|>\\n' }}
  {%- elif message.role == 'tool' -%}
    {{ '<|im_start|>user\\n<tool_response>\\n' }}{{ content(message.content) }}{{ '\\n</tool_response><|im_end|>\\n' }}
  {%- else -%}
    {{ raise_exception('message role ' + message.role + ': expected system, user, assistant or tool') }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{ '<|im_start|>assistant\\n' }}
  {%- if think_prefix is not defined or think_prefix -%}{{ '<think>\\n' }}{%- endif -%}
{%- endif -%}
""".replace("@TOOLS@", _TOOLS).replace("@TOOLS_END@", _TOOLS_END)

_SHARED = {"patch_size": PATCH, "temporal_patch_size": TEMPORAL, "merge_size": MERGE,
           "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255,
           "do_rescale": True, "do_normalize": True, "do_resize": True, "do_convert_rgb": True,
           "resample": 3,  # bicubic
           "processor_class": "Qwen3VLProcessor"}
IMAGE_PROCESSOR = {**_SHARED, "image_processor_type": "Qwen2VLImageProcessor",
                   "size": {"shortest_edge": PROCESSOR_MIN_PIXELS, "longest_edge": PROCESSOR_MAX_PIXELS}}
# The video budget bounds a whole video's T*H*W (video/frames.py `video_smart_resize`).
VIDEO_PROCESSOR = {**_SHARED, "video_processor_type": "Qwen3VLVideoProcessor",
                   "size": {"shortest_edge": 4096, "longest_edge": 25165824},
                   "fps": 2, "min_frames": 4, "max_frames": 768, "do_sample_frames": True}


def processor_files() -> dict[str, str]:
    """File name -> text of the chat template and both processor configurations."""
    return {"chat_template.jinja": CHAT_TEMPLATE,
            "preprocessor_config.json": json.dumps(IMAGE_PROCESSOR, indent=2) + "\n",
            "video_preprocessor_config.json": json.dumps(VIDEO_PROCESSOR, indent=2) + "\n"}


def save_processor(directory: str) -> list[str]:
    """Writes `processor_files()` into a local directory; returns their paths."""
    import os

    from paravt_jax.infra import storage

    paths = []
    for name, text in processor_files().items():
        paths.append(os.path.join(directory, name))
        storage.write_atomic(paths[-1], text)
    return paths
