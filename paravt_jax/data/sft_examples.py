"""SFT chat messages (reference schema) -> ModelInputs with the loss on assistant turns."""
from __future__ import annotations

import numpy as np

from paravt_jax.data.paravt_parquet import SchemaError, resolve_path
from paravt_jax.text import chat
from paravt_jax.text.inputs import ModelInputs, encode
from paravt_jax.text.tokenizer import Tokenizer
from paravt_jax.video.reader import read_frames, resize_frames


def _content(item: dict, video_root: str, nframes: int, max_pixels: int) -> list:
    kind = item.get("type")
    if kind == "text":
        return [chat.Text(str(item.get("text", "")))]
    if kind == "video_url":
        path = resolve_path(item["video_url"]["url"], video_root)
        if "video_start" in item or "video_end" in item:  # a crop at 1 fps, as the crop dispatcher reads it
            clip = read_frames(path, fps=1.0, start=item.get("video_start"), end=item.get("video_end"),
                               min_frames=1, max_frames=16, max_pixels=max_pixels)
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
        clip = read_frames(path, nframes=nframes, max_pixels=max_pixels)
        return chat.frames_as_images(clip.frames, clip.timestamps)
    if kind == "image_url":
        from PIL import Image

        frame = np.asarray(Image.open(resolve_path(item["image_url"]["url"], video_root)).convert("RGB"))
        return [chat.Image(resize_frames(frame[None], None, max_pixels)[0])]
    raise SchemaError(f"unsupported content item type {kind!r}")


def sft_inputs(messages: list[dict], tokenizer: Tokenizer, video_root: str, nframes: int = 8,
               max_pixels: int = 50176) -> ModelInputs:
    turns = []
    for turn in messages:
        content = turn.get("content", "")
        items = content if isinstance(content, list) else [{"type": "text", "text": content}]
        segments = []
        for item in items:
            segments += _content(item, video_root, nframes, max_pixels)
        turns.append(chat.Message(turn["role"], tuple(segments)))
    return encode(chat.render(turns), tokenizer)
