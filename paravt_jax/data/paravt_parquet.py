"""Loaders for the reference RL and SFT parquet schemas.

RL rows: `prompt` (list of {role, content}; `<video>` marks the video), `videos` (list of
{"video": path}), `extra_info` (dict or JSON string with `answer`, `question_type`).
SFT rows: `messages` (JSON string: chat turns whose content items are text, image_url or
video_url). Paths may be relative to a video root or `file://` URIs; rows whose video is
missing are skipped and counted (logged once, with the first few paths).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import pyarrow.parquet as pq

log = logging.getLogger(__name__)
RL_COLUMNS = ("prompt", "videos", "extra_info")
SFT_COLUMNS = ("messages",)


class SchemaError(ValueError):
    """A parquet file lacks a column or a row lacks a field; the message names both."""


@dataclasses.dataclass(frozen=True)
class RLRow:
    index: int
    question: str
    video_path: str
    answer: str
    question_type: str
    extra: dict
    system_prompt: str = ""  # the row's own system turn, kept as the reference keeps it
    # the video as the table names it (before resolving against the video root): the key of
    # the nFrames gating draw, so K does not depend on where the data lives ("" = video_path)
    video_key: str = ""


@dataclasses.dataclass(frozen=True)
class LoadReport:
    path: str
    rows: int
    kept: int
    missing_videos: int
    examples: tuple[str, ...]
    # SFT: each kept row's `kind` column ("" where the table has none), e.g. main_subagent,
    # subagent, tool_free in the events set; what `sft.first_kinds` selects
    kinds: tuple[str, ...] = ()


def resolve_path(path: str, video_root: str) -> str:
    raw = path[len("file://"):] if path.startswith("file://") else path
    return raw if os.path.isabs(raw) else os.path.join(video_root, raw)


def _read(path: str, columns: tuple[str, ...]) -> list[dict]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: parquet file not found")
    table = pq.read_table(path)
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise SchemaError(f"{path}: missing column(s) {missing}; found {table.column_names}")
    return table.to_pylist()


def _report(path, rows, kept, missing, kinds=()):
    report = LoadReport(path, rows, kept, len(missing), tuple(missing[:3]), tuple(kinds))
    if missing:
        log.warning("%s: skipped %d of %d rows whose video is missing (first: %s)", path,
                    len(missing), rows, ", ".join(missing[:3]))
    return report


def _json_field(row: dict, field: str, path: str, index: int) -> Any:
    """A column that may hold a JSON string or the decoded value."""
    value = row[field]
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise SchemaError(f"{path}: row {index}: {field} is not valid JSON ({e})") from e


def _turn_texts(prompt: Any, path: str, index: int, role: str) -> list[str]:
    if isinstance(prompt, str):
        return [prompt.replace("<video>", "").strip()] if role == "user" else []
    texts = []
    for turn in prompt or []:
        if not isinstance(turn, dict) or "content" not in turn:
            raise SchemaError(f"{path}: row {index}: prompt turns need a 'content' field")
        if turn.get("role", "user") == role:
            content = turn["content"]
            if isinstance(content, list):
                content = " ".join(c.get("text", "") for c in content if isinstance(c, dict))
            texts.append(str(content).replace("<video>", "").strip())
    return [t for t in texts if t]


def question_text(prompt: Any, path: str, index: int) -> str:
    """The row's user turns (without the `<video>` marker), joined by newlines."""
    return "\n".join(_turn_texts(prompt, path, index, "user"))


def system_text(prompt: Any, path: str, index: int) -> str:
    """The row's system turn ("" without one)."""
    return "\n".join(_turn_texts(prompt, path, index, "system"))


def load_rl_rows(path: str, video_root: str) -> tuple[list[RLRow], LoadReport]:
    rows = _read(path, RL_COLUMNS)
    out, missing = [], []
    for i, row in enumerate(rows):
        info = _json_field(row, "extra_info", path, i)
        for key in ("answer", "question_type"):
            if not isinstance(info, dict) or key not in info:
                raise SchemaError(f"{path}: row {i}: extra_info lacks {key!r}")
        videos = row["videos"] or []
        if not videos or not isinstance(videos[0], dict) or "video" not in videos[0]:
            raise SchemaError(f"{path}: row {i}: videos must be a list of {{'video': path}}")
        video = resolve_path(str(videos[0]["video"]), video_root)
        if not os.path.isfile(video):
            missing.append(video)
            continue
        out.append(RLRow(i, question_text(row["prompt"], path, i), video, str(info["answer"]),
                         str(info["question_type"]), dict(info), system_text(row["prompt"], path, i),
                         video_key=str(videos[0]["video"])))
    return out, _report(path, len(rows), len(out), missing)


def _videos_in(messages: list) -> list[str]:
    found = []
    for turn in messages:
        for item in turn.get("content", []) if isinstance(turn.get("content"), list) else []:
            if isinstance(item, dict) and item.get("type") in ("video_url", "image_url"):
                found.append(item[item["type"]]["url"])
    return found


def load_sft_rows(path: str, video_root: str) -> tuple[list[list[dict]], LoadReport]:
    rows = _read(path, SFT_COLUMNS)
    out, missing, kinds = [], [], []
    for i, row in enumerate(rows):
        messages = _json_field(row, "messages", path, i)
        if not isinstance(messages, list):
            raise SchemaError(f"{path}: row {i}: messages must be a list of turns")
        absent = [p for p in (resolve_path(u, video_root) for u in _videos_in(messages)) if not os.path.isfile(p)]
        if absent:
            missing.append(absent[0])
            continue
        out.append(messages)
        kinds.append(str(row.get("kind") or ""))
    return out, _report(path, len(rows), len(out), missing, kinds)
