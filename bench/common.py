"""Shared benchmark helpers: machine description, timing, table printing, peer models."""
from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time


def machine() -> str:
    import jax

    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
            f"jax {jax.__version__} on {jax.devices()[0].platform} x {jax.device_count()}")


def steady_times(fn, repeats: int) -> list[float]:
    """Seconds of each of `repeats` consecutive calls (no warm-up)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def timeit(fn, repeats: int = 5, warmup: int = 1) -> tuple[float, float]:
    """(first call seconds, median of `repeats` steady calls in seconds)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        fn()
    return first, statistics.median(steady_times(fn, repeats))


def best_time(fn, repeats: int = 5) -> float:
    """Seconds of the fastest of `repeats` calls after one warm-up call."""
    fn()
    return min(steady_times(fn, repeats))


def print_table(title: str, header: list[str], rows: list[list]) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    out = [f"\n### {title}", line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    text = "\n".join(out)
    print(text, flush=True)
    return text


def hf_peer(model):
    """transformers' PyTorch Qwen3-VL holding exactly `model`'s weights (fp32, eval)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from paravt_jax.models.qwen3_vl import save_pretrained

    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as directory:
        save_pretrained(model, directory, torch_dtype="float32")
        return Qwen3VLForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
