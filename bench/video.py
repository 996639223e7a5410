"""Video decoding throughput on a synthetic 10-minute 640x360 video.

Overview sampling (64 uniform frames) and 1 fps crops (<= 16 frames, 50176-pixel budget);
K = 1..5 crops decoded concurrently on threads vs one after another.

    python bench/video.py [--minutes 10] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, print_table  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.minutes * 60 < 4 * 60 + 20:  # the five crop windows start at 5, 65, ... 245 s
        parser.error(f"--minutes={args.minutes:g}: the five 15-second crop windows need at least 4.4 minutes")

    from paravt_jax.data.synthetic import make_video, write_video
    from paravt_jax.video import read_frames

    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        video = make_video(7, args.minutes * 60)
        path = os.path.join(tmp, "long.mp4")
        start = time.perf_counter()
        write_video(path, video.duration, list(video.events), fps=args.fps, height=360, width=640, seed=7)
        print(f"wrote {args.minutes:.0f} min 640x360 @ {args.fps:.0f} fps in {time.perf_counter() - start:.1f} s "
              f"({os.path.getsize(path) / 1e6:.1f} MB)")

        def best(fn):
            times = []
            for _ in range(args.repeats):
                s = time.perf_counter()
                fn()
                times.append(time.perf_counter() - s)
            return min(times)

        def cores_busy(fn):
            """Process CPU seconds per wall second while fn runs (decoder threads included)."""
            r0, s = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            fn()
            wall, r1 = time.perf_counter() - s, resource.getrusage(resource.RUSAGE_SELF)
            return (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / wall

        overview = lambda k: read_frames(path, nframes=k, min_pixels=784, max_pixels=50176)
        rows = []
        for k in (16, 64):
            t = best(lambda: overview(k))
            rows.append([f"overview, {k} uniform frames", f"{t * 1e3:.0f}", f"{k / t:.1f}"])
        windows = [(60.0 * i + 5, 60.0 * i + 20) for i in range(5)]  # 15 s each -> 14 frames at 1 fps
        crop = lambda w: read_frames(path, fps=1, start=w[0], end=w[1], min_frames=1, max_frames=16,
                                     min_pixels=784, max_pixels=50176)
        frames_per_crop = len(crop(windows[0]).frames)
        t = best(lambda: crop(windows[0]))
        rows.append([f"one crop, 1 fps over 15 s ({frames_per_crop} frames)", f"{t * 1e3:.0f}",
                     f"{frames_per_crop / t:.1f}"])
        print_table("Video sampling", ["what", "ms", "frames/s"], rows)

        rows = []
        with ThreadPoolExecutor(max_workers=5) as pool:
            for k in range(1, 6):
                seq = best(lambda: [crop(w) for w in windows[:k]])
                par = best(lambda: list(pool.map(crop, windows[:k])))
                busy = cores_busy(lambda: [crop(w) for w in windows[:k]])
                rows.append([k, f"{seq * 1e3:.0f}", f"{par * 1e3:.0f}", f"{seq / par:.2f}x",
                             f"{k * frames_per_crop / par:.1f}", f"{busy:.1f} of {os.cpu_count()}"])
        print_table("K crops in one turn: threads vs one after another",
                    ["K", "sequential ms", "threads ms", "speed-up", "frames/s (threads)",
                     "cores busy when sequential"], rows)


if __name__ == "__main__":
    main()
