"""Evaluation prompt modes: the system message, whether tools are offered, and the forced
final-answer instruction of the reference driver's protocol.

Instructions are in our own words; formats (tag names, the Hermes tool envelope, the tool
JSON shape, the grounding answer sentence) are kept identical to the reference because the
evaluated models were trained on them. `prompt_file` (a JSON file of `PromptTexts`) replaces
every text verbatim, e.g. with the exact texts a released checkpoint was evaluated with.

  direct           one turn, answer in <answer></answer>
  reasoning        one turn, <think>...</think> then <answer>...</answer>
  agentic_general  crop_video offered, several calls per turn encouraged, explicit format
  agentic_minimal  crop_video offered in the bare Hermes envelope (the reference uses it
                   for Charades-STA: tighter spans)
"""
from __future__ import annotations

import dataclasses
import json

from paravt_jax.text import chat

# The evaluation returns the cropped frames themselves (frames mode), so the tool says so.
EVAL_CROP_TOOL = chat.crop_video_tool(
    "Inspect one time window of the video: frames sampled between start_time and end_time are "
    "returned. Several calls in one turn inspect several windows at once.", layout="object")

DIRECT_SYSTEM = ("You answer questions about videos. Look at the video carefully, then give "
                 "your final answer inside <answer></answer> tags.")

REASONING_SYSTEM = ("You answer questions about videos. First reason about the question inside "
                    "<think>...</think> tags, then give the final answer inside "
                    "<answer>...</answer> tags.")

_GENERAL_AGENTIC = """You analyse videos and can zoom into any time window of the video with a tool.

Available tool:
<tools>
{tool}
</tools>

To call the tool, write a JSON object inside <tool_call></tool_call> tags:
<tool_call>
{{"name": "crop_video", "arguments": {{"video_path": "...", "start_time": 0, "end_time": 10}}}}
</tool_call>

You may write **several <tool_call> blocks in one turn** to inspect different windows in parallel; this is faster than one call per turn and is the preferred way to use the tool.

Format strictly as:
<think>your reasoning here</think>
<tool_call>...</tool_call>  (zero or more, parallel if multiple)
<answer>your final answer</answer>

Always put your reasoning in <think> tags and your final answer in <answer> tags."""

FINAL_MCQ = "Using the video and the inspected windows above, reply with the option letter only."
FINAL_GROUNDING = ("Using the video and any inspected windows, give your final answer on when the "
                   "event happens, in the format: 'The event happens in the X.X - Y.Y seconds.'")
FINAL_OPEN = "Using the video and the inspected windows above, give your final answer in <answer></answer> tags."

MODES = ("direct", "reasoning", "agentic_general", "agentic_minimal")


@dataclasses.dataclass(frozen=True)
class PromptTexts:
    """Every instruction text of the evaluation, verbatim. The defaults are ours; a JSON file
    with any of these keys (`load_prompt_texts`) replaces them, e.g. with the exact texts of
    another release. System texts of the agentic modes are used as given (they hold the tool
    schema themselves)."""
    direct: str = DIRECT_SYSTEM
    reasoning: str = REASONING_SYSTEM
    agentic_general: str = _GENERAL_AGENTIC.format(tool=json.dumps(EVAL_CROP_TOOL))
    agentic_minimal: str = chat.tools_system_prompt([EVAL_CROP_TOOL])
    final_mcq: str = FINAL_MCQ
    final_grounding: str = FINAL_GROUNDING
    final_open: str = FINAL_OPEN


def load_prompt_texts(path: str) -> PromptTexts:
    """PromptTexts from a JSON object of strings ("" = the defaults); unknown keys and values
    that are not strings are errors naming the file and the key."""
    if not path:
        return PromptTexts()
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"prompt_file {path}: cannot read a JSON object: {e}") from e
    if not isinstance(values, dict):
        raise ValueError(f"prompt_file {path}: expected a JSON object of strings")
    known = {f.name for f in dataclasses.fields(PromptTexts)}
    for key, value in values.items():
        if key not in known:
            raise ValueError(f"prompt_file {path}: unknown key {key!r} (known: {sorted(known)})")
        if not isinstance(value, str):
            raise ValueError(f"prompt_file {path}: {key!r} must be a string")
    return PromptTexts(**values)


@dataclasses.dataclass(frozen=True)
class PromptMode:
    name: str
    system: str
    tools: bool


def prompt_mode(name: str, texts: PromptTexts = PromptTexts()) -> PromptMode:
    """The system message and tool switch of one prompt mode."""
    if name not in MODES:
        raise ValueError(f"prompt_mode {name!r}: expected one of {MODES}")
    return PromptMode(name, getattr(texts, name), name.startswith("agentic_"))


def final_instruction(question_type: str, texts: PromptTexts = PromptTexts()) -> str:
    """The user message that forces a short final answer after the last tool round."""
    if question_type == "mcq":
        return texts.final_mcq
    if question_type == "tvg":
        return texts.final_grounding
    return texts.final_open
