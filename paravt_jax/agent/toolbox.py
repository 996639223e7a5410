"""The tool seam: what a tool the policy may call is (`Tool`; crop_video, the one ParaVT trains
with, is `agent.dispatch.CropVideo`).

A tool owns its schema (what the prompt's system message lists), the check of a parsed call's
arguments against the episode (`request`: raises ValueError with the reason, which becomes the
call's error response) and its execution (`run`) on the episode's own video (the dataset row's
path, never one the model wrote). It answers with an `Observation`: frames (a `Clip`, which the
rollout turns into a sub-agent summary or shows as frames, by its mode) or text (shown as the
tool response as it is). The dispatcher (agent/dispatch.py) finds a call's tool by name and runs
every call of a round concurrently; a second tool (a frame zoom, a subtitle look-up) is a class
with these four members passed to the dispatcher, not an edit of the rollout loop.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from paravt_jax.agent.tools import ToolCall, quote
from paravt_jax.video.reader import Clip

__all__ = ["Observation", "Tool", "find_tool"]


@dataclasses.dataclass(frozen=True)
class Observation:
    """A tool's answer: frames (`clip`) or text; exactly one of them."""
    clip: Clip | None = None
    text: str | None = None

    def __post_init__(self):
        if (self.clip is None) == (self.text is None):
            raise ValueError("an Observation holds either a clip or a text")


@runtime_checkable
class Tool(Protocol):
    """A tool the policy can call (see the module's docstring)."""
    name: str

    def schema(self, layout: str) -> dict:
        """The function schema the prompt lists, in one of chat.TOOL_LAYOUTS."""

    def request(self, call: ToolCall, duration: float, lenient: bool) -> Any:
        """The call's checked arguments against a video of `duration` seconds; raises
        ValueError naming what is wrong. `lenient`: the evaluation driver's reading, which never
        refuses a call."""

    def run(self, request: Any, video_path: str) -> Observation:
        """Executes a checked request on the episode's own video; raises VideoError or
        ValueError when the video cannot be read."""


def find_tool(tools: Sequence[Tool], call: ToolCall, lenient: bool) -> Tool:
    """The tool `call` names; under `lenient` (the evaluation driver's reading, where any name
    is the crop) an unknown name is the first tool. Raises ValueError naming the tools."""
    for tool in tools:
        if tool.name == call.name:
            return tool
    if lenient and tools:
        return tools[0]
    names = [tool.name for tool in tools]
    known = f"the only tool is {names[0]}" if len(names) == 1 else f"the tools are {', '.join(names)}"
    raise ValueError(f"unknown tool {quote(call.name)}; {known}")
