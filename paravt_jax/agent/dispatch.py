"""The parallel tool dispatcher: every call of a turn, across all episodes of the batch, runs
concurrently on a host thread pool (for crop_video: the window's frames decoded); results keep
call order; each failure (unknown tool, bad arguments, unreadable video, timeout) becomes error
text for that call's tool response. The tools are `agent.toolbox.Tool`s, crop_video
(`CropVideo`, built from the config) by default.

Only the episode's own video file is ever opened (the path comes from the dataset row, never
from the model's arguments).
"""
from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import threading
import time
from collections.abc import Sequence

from paravt_jax.agent.toolbox import Observation, Tool, find_tool
from paravt_jax.agent.tools import TOOL_NAME, CropRequest, ToolCall, crop_window, lenient_window
from paravt_jax.config import checked, integer, one_of, validate
from paravt_jax.text import chat
from paravt_jax.video.frames import SIZINGS
from paravt_jax.video.reader import Clip, VideoError, read_frames

ARGUMENTS = ("strict", "lenient")


@dataclasses.dataclass(frozen=True)
class DispatchConfig:
    max_workers: int = checked(8, integer(1))
    fps: float = 1.0
    min_frames: int = 1
    max_frames: int = checked(16, integer(1))
    min_pixels: int = 784
    max_pixels: int = 50176
    # single | two_stage: as PromptFormat.overview_sizing, for crop frames
    sizing: str = checked("single", one_of(SIZINGS))
    timeout_s: float = 60.0
    max_parallel: int = checked(5, integer(1))  # calls executed per turn (the rest: see ToolProtocol.extra_calls)
    # error responses per turn (parse + not executed); the rest are counted in one
    max_error_responses: int = checked(10, integer(1))
    # strict: a call must name crop_video and give start and end (else an error response);
    # lenient: the evaluation driver's reading (`tools.lenient_window`: any name, start 0 and
    # end start + 10 s by default, unreadable times 0)
    arguments: str = checked("strict", one_of(ARGUMENTS))

    def __post_init__(self):
        validate(self)


@dataclasses.dataclass(frozen=True)
class CropTask:
    row: int  # which rollout row asked
    call_index: int  # order within the row's turn
    video_path: str  # the episode's own video
    duration: float
    call: ToolCall


@dataclasses.dataclass(frozen=True)
class CropResult:
    """One call's outcome: its checked request (None when refused), and the tool's answer
    (frames in `clip`, or `text`) or the `error` text."""
    task: CropTask
    request: CropRequest | None
    clip: Clip | None
    error: str | None
    started: float  # perf_counter stamps, for concurrency checks and profiling
    finished: float
    text: str | None = None  # a text tool's answer

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclasses.dataclass(frozen=True)
class CropVideo:
    """crop_video(video_path, start_time, end_time): the window's frames as `config` reads them
    (fps, frame count bounds, pixel budget, sizing)."""
    config: DispatchConfig = DispatchConfig()
    description: str = chat.CROP_VIDEO_SUMMARY
    name: str = TOOL_NAME

    def schema(self, layout: str) -> dict:
        return chat.crop_video_tool(self.description, layout=layout)

    def request(self, call: ToolCall, duration: float, lenient: bool) -> CropRequest:
        if lenient:  # any name; start 0 and end start + 10 s by default; unreadable times 0
            start, end = lenient_window(call)
            return crop_window({"start_time": start, "end_time": end}, duration)
        return crop_window(call.arguments, duration)

    def run(self, request: CropRequest, video_path: str) -> Observation:
        c = self.config
        return Observation(clip=read_frames(video_path, fps=c.fps, start=request.start, end=request.end,
                                            min_frames=c.min_frames, max_frames=c.max_frames,
                                            min_pixels=c.min_pixels, max_pixels=c.max_pixels, sizing=c.sizing))


def _run_call(task: CropTask, tools: tuple[Tool, ...], lenient: bool) -> CropResult:
    started = time.perf_counter()
    try:
        tool = find_tool(tools, task.call, lenient)
        request = tool.request(task.call, task.duration, lenient)
    except ValueError as e:
        return CropResult(task, None, None, f"invalid arguments: {e}", started, time.perf_counter())
    except Exception as e:  # validation is meant to raise ValueError only; a model-written call never crashes
        return CropResult(task, None, None, f"invalid arguments: {type(e).__name__}", started,
                          time.perf_counter())
    try:
        observation = tool.run(request, task.video_path)
    except (VideoError, ValueError) as e:
        return CropResult(task, request, None, f"could not read the video segment: {e}", started,
                          time.perf_counter())
    except Exception as e:  # never let one crop take the batch down
        return CropResult(task, request, None, f"crop failed: {type(e).__name__}: {e}", started,
                          time.perf_counter())
    return CropResult(task, request, observation.clip, None, started, time.perf_counter(), observation.text)


class CropDispatcher:
    """Runs tool calls on a shared thread pool. Use as a context manager or call close().
    `tools`: what the policy may call (default: crop_video as `config` reads frames)."""

    def __init__(self, config: DispatchConfig = DispatchConfig(), tools: tuple[Tool, ...] | None = None):
        self.config = config
        self.tools = (CropVideo(config),) if tools is None else tuple(tools)
        if not self.tools or len({tool.name for tool in self.tools}) != len(self.tools):
            raise ValueError(f"CropDispatcher: tools must be at least one, each name once; got "
                             f"{[tool.name for tool in self.tools]}")
        self._pool = futures.ThreadPoolExecutor(max_workers=config.max_workers,
                                                thread_name_prefix="crop")
        self._lock = threading.Lock()
        self.counters = {"calls": 0, "errors": 0, "timeouts": 0}

    def run(self, tasks: Sequence[CropTask]) -> list[CropResult]:
        """All tasks concurrently; results in the order of `tasks`."""
        lenient = self.config.arguments == "lenient"
        submitted = [(task, self._pool.submit(_run_call, task, self.tools, lenient)) for task in tasks]
        deadline = time.perf_counter() + self.config.timeout_s
        results = []
        for task, future in submitted:
            try:
                result = future.result(timeout=max(0.0, deadline - time.perf_counter()))
            except futures.TimeoutError:
                now = time.perf_counter()
                result = CropResult(task, None, None,
                                    f"timed out after {self.config.timeout_s:g} s", now, now)
                with self._lock:
                    self.counters["timeouts"] += 1
            results.append(result)
        with self._lock:
            self.counters["calls"] += len(results)
            self.counters["errors"] += sum(not r.ok for r in results)
        return results

    def schemas(self, layout: str) -> list[dict]:
        """The tools' function schemas, in order, for the prompt's system message."""
        return [tool.schema(layout) for tool in self.tools]

    def submit(self, fn, *args) -> futures.Future:
        """Runs other host work (e.g. overview decoding) on the same pool."""
        return self._pool.submit(fn, *args)

    def close(self):
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
