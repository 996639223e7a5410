"""SFT chat messages (reference schema) -> ModelInputs with the loss on assistant turns."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from paravt_jax.data.paravt_parquet import SchemaError, resolve_path
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs, encode
from paravt_jax.text.tokenizer import Tokenizer
from paravt_jax.video.reader import Clip, VideoMetadata, blank_clip, read_frames, resize_frames

CROP_FPS, CROP_MAX_FRAMES = 1.0, 16  # a crop item's frames, as the crop dispatcher reads them


@dataclasses.dataclass(frozen=True)
class FrameSpec:
    """How an SFT example's whole-video items (its overview) are sampled, sized and sent.

    nframes > 0: that many frames spread over the video; 0: `fps` frames a second, at most
    `max_frames` (qwen-vl-utils' count: at least 2, rounded down to an even number). Every frame,
    crops and image items included, is resized to [min_pixels, max_pixels] by `sizing`
    (video/frames.py). visual: the overview as timestamped image items, or as one Qwen3-VL video
    item (the second stage of two_stage then the video processor's, as the reference's SFT
    data loader sends videos)."""
    nframes: int = 8
    fps: float = 1.0
    max_frames: int = 64
    min_pixels: int = 784
    max_pixels: int = 50176
    sizing: str = "single"
    visual: str = "images"

    def __post_init__(self):
        if self.visual not in chat.VISUALS:
            raise ValueError(f"SFT overview visual {self.visual!r}: expected one of {chat.VISUALS}")
        if self.nframes < 0 or self.max_frames < 1 or not self.fps > 0:
            raise ValueError(f"FrameSpec: nframes={self.nframes} must be >= 0, max_frames={self.max_frames} "
                             f">= 1 and fps={self.fps} > 0")

    def sampling(self) -> dict:
        """read_frames' sampling and sizing arguments for a whole video."""
        counts = (dict(nframes=self.nframes) if self.nframes else
                  dict(fps=self.fps, min_frames=1, max_frames=self.max_frames))
        return dict(**counts, min_pixels=self.min_pixels, max_pixels=self.max_pixels, sizing=self.sizing,
                    video_item=self.visual == "video")

    def overview(self, clip: Clip) -> list:
        return chat.overview_segments(clip.frames, clip.timestamps, self.visual)


def blank_overview(meta: VideoMetadata, frames: FrameSpec) -> Clip:
    """The overview clip `sft_inputs` reads from a video with metadata `meta`, black and not
    decoded (the memory planner's)."""
    return blank_clip(meta, **frames.sampling())


def _content(item: dict, video_root: str, frames: FrameSpec) -> list:
    kind = item.get("type")
    pixels = dict(min_pixels=frames.min_pixels, max_pixels=frames.max_pixels, sizing=frames.sizing)
    if kind == "text":
        return [chat.Text(str(item.get("text", "")))]
    if kind == "video_url":
        path = resolve_path(item["video_url"]["url"], video_root)
        if "video_start" in item or "video_end" in item:  # a crop at 1 fps, as the crop dispatcher reads it
            clip = read_frames(path, fps=CROP_FPS, start=item.get("video_start"), end=item.get("video_end"),
                               min_frames=1, max_frames=CROP_MAX_FRAMES, **pixels)
            layout = item.get("crop_response")
            if layout is None:  # bare frames, as the sub-agent sees them
                return chat.frames_as_images(clip.frames, None)
            if layout != "timestamped":
                raise SchemaError(f"crop_response {layout!r}: expected 'timestamped' (a frames-mode tool response)")
            # the whole tool response as agent.rollout writes it in frames mode
            start, end = float(item["video_start"]), float(item["video_end"])
            header = f"{len(clip.frames)} frames from {start:.1f} s to {end:.1f} s.\n"
            return [chat.Text("<tool_response>\n" + header), *chat.frames_as_images(clip.frames, clip.timestamps),
                    chat.Text("\n</tool_response>")]
        return frames.overview(read_frames(path, **frames.sampling()))
    if kind == "image_url":
        from PIL import Image

        frame = np.asarray(Image.open(resolve_path(item["image_url"]["url"], video_root)).convert("RGB"))
        return [chat.Image(resize_frames(frame[None], **pixels)[0])]
    raise SchemaError(f"unsupported content item type {kind!r}")


DIRECT_THINK = "<think>\nI answer from the overview frames.\n</think>\n"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def _text_of(message: dict) -> str:
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(str(item.get("text", "")) for item in content if item.get("type") == "text")


def direct_answer(messages: list[dict]) -> list[dict] | None:
    """A tool-calling trajectory answered without the tool: its messages before the first
    assistant turn (system, the user's overview and question), then one assistant turn that
    gives the trajectory's final answer straight away. None when the first assistant turn
    calls no tool or the last one has no `<answer>`."""
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if len(turns) < 2 or "<tool_call>" not in _text_of(messages[turns[0]]):
        return None
    first = turns[0]
    found = _ANSWER.search(_text_of(messages[turns[-1]]))
    if found is None:
        return None
    reply = DIRECT_THINK + f"<answer>{found.group(1).strip()}</answer>"
    return [*messages[:first], {"role": "assistant", "content": [{"type": "text", "text": reply}]}]


def sft_inputs(messages: list[dict], tokenizer: Tokenizer, video_root: str,
               frames: FrameSpec = FrameSpec()) -> ModelInputs:
    turns = []
    for turn in messages:
        content = turn.get("content", "")
        items = content if isinstance(content, list) else [{"type": "text", "text": content}]
        segments = []
        for item in items:
            segments += _content(item, video_root, frames)
        turns.append(chat.Message(turn["role"], tuple(segments)))
    return encode(chat.render(turns), tokenizer)
