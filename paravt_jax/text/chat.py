"""Chat rendering (Qwen3-VL template semantics), the tools system prompt and the ParaVT prompt.

Messages render to a list of segments: `Text` (may contain special-token strings), `Image`
(one frame) and `Video` (frames with their timestamps: Qwen3-VL's video item). Adjacent text
is merged before tokenisation (a video's first `<t seconds>` with the text before it), and
every image and every temporal group of a video is bounded by `<|vision_start|>`/`<|vision_end|>`,
so encoding gives the same ids as tokenising the whole expanded prompt string.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Text:
    text: str
    trainable: bool = False  # loss mask 1 (assistant content in SFT data)


@dataclasses.dataclass(frozen=True, eq=False)
class Image:
    frame: np.ndarray  # uint8 [H, W, 3], sides multiples of 32


@dataclasses.dataclass(frozen=True, eq=False)
class Video:
    """One video item: frames uint8 [T, H, W, 3] (sides multiples of 32, all frames one size)
    and timestamps [T] in seconds (source frame index / the video's fps)."""
    frames: np.ndarray
    timestamps: np.ndarray

    def __post_init__(self):
        frames = np.asarray(self.frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
            raise ValueError(f"video item: frames must be a non-empty [T, H, W, 3], got {frames.shape}")
        if len(self.timestamps) != len(frames):
            raise ValueError(f"video item: {len(frames)} frames but {len(self.timestamps)} timestamps")


Segment = Text | Image | Video
VISUALS = ("images", "video")  # how an overview is sent: image items | one video item
PLACEHOLDERS = {Image: "<|vision_start|><|image_pad|><|vision_end|>",
                Video: "<|vision_start|><|video_pad|><|vision_end|>"}


@dataclasses.dataclass(frozen=True)
class Message:
    role: str  # system | user | assistant
    content: tuple[Segment, ...]

    @classmethod
    def of(cls, role: str, *content: Segment | str) -> Message:
        return cls(role, tuple(Text(c) if isinstance(c, str) else c for c in content))


CROP_VIDEO_ARGUMENTS = {
    "video_path": {"type": "string", "description": "Path of the video file"},
    "start_time": {"type": "number", "description": "Window start in seconds"},
    "end_time": {"type": "number", "description": "Window end in seconds"},
}
CROP_VIDEO_SUMMARY = ("Look closely at one time window of the video: frames are sampled from "
                      "[start_time, end_time] and a summary of what happens in that window is "
                      "returned. Call it several times in one turn to inspect several windows at once.")
# Two layouts of the same schema, as the reference has them: "object" (a JSON-schema object
# with properties and required: the evaluation driver and the SFT data) and "flat" (the
# argument table itself as "parameters", no "required": the RL workflow's injected schema).
TOOL_LAYOUTS = ("object", "flat")


def crop_video_tool(description: str = CROP_VIDEO_SUMMARY, layout: str = "object") -> dict:
    """The crop_video function schema in one of `TOOL_LAYOUTS`."""
    if layout == "object":
        parameters = {"type": "object", "properties": CROP_VIDEO_ARGUMENTS,
                      "required": list(CROP_VIDEO_ARGUMENTS)}
    elif layout == "flat":
        parameters = CROP_VIDEO_ARGUMENTS
    else:
        raise ValueError(f"tool layout {layout!r}: expected one of {TOOL_LAYOUTS}")
    return {"type": "function", "function": {"name": "crop_video", "description": description,
                                             "parameters": parameters}}


CROP_VIDEO_TOOL = crop_video_tool()
VIDEO_PATH_LINES = ("newline", "space_if_absent", "none")


def tools_system_prompt(tools: Sequence[dict]) -> str:
    """The Hermes tool envelope Qwen models are trained on (a format: kept verbatim)."""
    listing = "\n".join(json.dumps(tool) for tool in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listing}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def render(messages: Sequence[Message], add_generation_prompt: bool = False,
           assistant_prefix: str = "") -> list[Segment]:
    """Qwen chat template: `<|im_start|>{role}\\n...<|im_end|>\\n` per message.

    Assistant content is trainable (loss mask 1) together with its closing `<|im_end|>`.
    With add_generation_prompt the result ends with `<|im_start|>assistant\\n` plus the
    forced `assistant_prefix` (e.g. "<think>\\n"), which is prompt, not trainable.
    """
    out: list[Segment] = []
    for message in messages:
        if message.role not in ("system", "user", "assistant"):
            raise ValueError(f"message role {message.role!r}: expected system, user or assistant")
        out.append(Text(f"<|im_start|>{message.role}\n"))
        for item in message.content:
            if isinstance(item, Text):
                out.append(Text(item.text, trainable=message.role == "assistant"))
            elif isinstance(item, (Image, Video)):
                if message.role == "assistant":
                    raise ValueError("assistant messages cannot hold images or videos")
                out.append(item)
            else:
                raise TypeError(f"message content item of type {type(item).__name__}")
        out.append(Text("<|im_end|>", trainable=message.role == "assistant"))
        out.append(Text("\n"))
    if add_generation_prompt:
        out.append(Text("<|im_start|>assistant\n" + assistant_prefix))
    return out


def frames_as_images(frames: np.ndarray, timestamps: Sequence[float] | None) -> list[Segment]:
    """Frames as image items, each preceded by its `<t seconds>` text (one decimal: the RL
    workflow's overview); with timestamps None, bare images (the evaluation driver's)."""
    if timestamps is None:
        return [Image(np.asarray(frame)) for frame in frames]
    if len(frames) != len(timestamps):
        raise ValueError(f"{len(frames)} frames but {len(timestamps)} timestamps")
    out: list[Segment] = []
    for frame, t in zip(frames, timestamps):
        out += [Text(f"<{float(t):.1f} seconds>"), Image(np.asarray(frame))]
    return out


def with_video_path(question: str, video_name: str | None, style: str = "newline") -> str:
    """The question with the video-path sentence the tool's `video_path` argument refers to.
    newline: after a newline, always; space_if_absent: after a space, only when the question
    does not already mention a video path (the evaluation driver); none: the question as is."""
    if style not in VIDEO_PATH_LINES:
        raise ValueError(f"video path line {style!r}: expected one of {VIDEO_PATH_LINES}")
    if not video_name or style == "none":
        return question
    sentence = f"The video path for this video is: {video_name}"
    if style == "newline":
        return f"{question}\n{sentence}"
    return question if "video path" in question.lower() else f"{question} {sentence}"


def overview_segments(frames: np.ndarray, timestamps: Sequence[float] | None,
                      visual: str = "images") -> list[Segment]:
    """The overview as image items (`frames_as_images`) or as one video item (which needs the
    timestamps: Qwen3-VL writes each temporal group's time before it)."""
    if visual not in VISUALS:
        raise ValueError(f"overview visual {visual!r}: expected one of {VISUALS}")
    if visual == "images":
        return frames_as_images(frames, timestamps)
    if timestamps is None:
        raise ValueError("a video item needs its frames' timestamps")
    return [Video(np.asarray(frames), np.asarray(timestamps, np.float64))]


def paravt_messages(question: str, frames: np.ndarray, timestamps: Sequence[float] | None,
                    video_name: str | None = None, tools: Sequence[dict] = (CROP_VIDEO_TOOL,),
                    system_text: str = "", video_path_line: str = "newline",
                    visual: str = "images") -> list[Message]:
    """System + user turn: the overview (`overview_segments`: images, timestamped or bare with
    timestamps None, or one video item), then the question. The tool schema is appended to
    `system_text` (after a blank line) unless that text already holds a `<tools>` block, as
    the reference does with a data row's own system prompt."""
    schema = tools_system_prompt(tools) if tools and "<tools>" not in system_text else ""
    system = "\n\n".join(t for t in (system_text, schema) if t)
    messages = [Message.of("system", system)] if system else []
    question_text = with_video_path(question, video_name, video_path_line)
    messages.append(Message("user", (*overview_segments(frames, timestamps, visual), Text(question_text))))
    return messages


def tool_response_messages(responses: Sequence[str | Sequence[Segment]]) -> list[Message]:
    """One user turn per tool call, in call order: `<tool_response>\\n...\\n</tool_response>`.
    A response may be a string or segments (text plus frames, for the frames mode)."""
    out = []
    for response in responses:
        if isinstance(response, str):
            out.append(Message.of("user", f"<tool_response>\n{response}\n</tool_response>"))
        else:
            out.append(Message("user", (Text("<tool_response>\n"), *response,
                                        Text("\n</tool_response>"))))
    return out


def placeholder_text(segments: Sequence[Segment]) -> str:
    """The prompt string with each image and video as the template's single-pad placeholder
    (what an HF processor expands); useful for logging and cross-checks."""
    return "".join(s.text if isinstance(s, Text) else PLACEHOLDERS[type(s)] for s in segments)


def segment_instruction(start: float, end: float) -> str:
    """The sub-agent's task for one crop, shown after the crop's bare frames: the segment's
    time range as MM:SS and its duration with one decimal, as the reference's sub-agent prompt
    has them (the wording is ours)."""
    mmss = lambda s: f"{int(s // 60):02d}:{int(s % 60):02d}"
    return (f"You are looking at a video segment from {mmss(start)} to {mmss(end)} (duration: "
            f"{end - start:.1f} seconds). The images are frames sampled from it, in order.\n\n"
            "Summarise what happens in this segment: the key actions, objects and changes, in the "
            "order they occur, stating only what is visible.\n\nSummary:")
