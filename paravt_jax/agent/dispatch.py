"""The parallel crop dispatcher: every crop of a turn, across all episodes of the batch, is
decoded concurrently on a host thread pool; results keep call order; each failure (bad
arguments, unreadable video, timeout) becomes error text for that call's tool response.

Only the episode's own video file is ever opened (the path comes from the dataset row, never
from the model's arguments).
"""
from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import threading
import time
from collections.abc import Sequence

from paravt_jax.agent.tools import TOOL_NAME, CropRequest, ToolCall, lenient_window, validate_crop
from paravt_jax.config import checked, integer, one_of, validate
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
    task: CropTask
    request: CropRequest | None
    clip: Clip | None
    error: str | None
    started: float  # perf_counter stamps, for concurrency checks and profiling
    finished: float

    @property
    def ok(self) -> bool:
        return self.error is None


def _crop(task: CropTask, config: DispatchConfig) -> CropResult:
    started = time.perf_counter()
    call = task.call
    if config.arguments == "lenient":
        start, end = lenient_window(call)
        call = ToolCall(TOOL_NAME, {"start_time": start, "end_time": end})
    try:
        request = validate_crop(call, task.duration)
    except ValueError as e:
        return CropResult(task, None, None, f"invalid arguments: {e}", started, time.perf_counter())
    except Exception as e:  # validation is meant to raise ValueError only; a model-written call never crashes
        return CropResult(task, None, None, f"invalid arguments: {type(e).__name__}", started,
                          time.perf_counter())
    try:
        clip = read_frames(task.video_path, fps=config.fps, start=request.start, end=request.end,
                           min_frames=config.min_frames, max_frames=config.max_frames,
                           min_pixels=config.min_pixels, max_pixels=config.max_pixels, sizing=config.sizing)
    except (VideoError, ValueError) as e:
        return CropResult(task, request, None, f"could not read the video segment: {e}", started,
                          time.perf_counter())
    except Exception as e:  # never let one crop take the batch down
        return CropResult(task, request, None, f"crop failed: {type(e).__name__}: {e}", started,
                          time.perf_counter())
    return CropResult(task, request, clip, None, started, time.perf_counter())


class CropDispatcher:
    """Runs crop tasks on a shared thread pool. Use as a context manager or call close()."""

    def __init__(self, config: DispatchConfig = DispatchConfig()):
        self.config = config
        self._pool = futures.ThreadPoolExecutor(max_workers=config.max_workers,
                                                thread_name_prefix="crop")
        self._lock = threading.Lock()
        self.counters = {"calls": 0, "errors": 0, "timeouts": 0}

    def run(self, tasks: Sequence[CropTask]) -> list[CropResult]:
        """All tasks concurrently; results in the order of `tasks`."""
        submitted = [(task, self._pool.submit(_crop, task, self.config)) for task in tasks]
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

    def submit(self, fn, *args) -> futures.Future:
        """Runs other host work (e.g. overview decoding) on the same pool."""
        return self._pool.submit(fn, *args)

    def close(self):
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
