"""What an append to a gs:// file costs: paravt_jax.infra.storage.Appender (each write uploaded as a
part object and composed onto the file) against the previous Appender (the whole file uploaded
again at each write, the baseline, re-created here), both writing the same lines to a Cloud
Storage emulator (gcp-storage-emulator, in memory, in this process) and the local Appender
writing them to disk.

The emulator's request handler counts the requests and the request bytes each arm sends (the
bytes a run would upload to Cloud Storage); nothing of paravt_jax is wrapped. The seconds are
the emulator's on this machine (its compose concatenates the file in Python memory, which Cloud
Storage does server-side), so the requests and bytes are the numbers to read.

    python bench/append.py --appends 100,1000 --line-bytes 200
"""
from __future__ import annotations

import argparse
import os
import platform
import posixpath
import socket
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_table  # noqa: E402

BUCKET = "append-bench"


class Counter:
    requests = 0
    sent = 0

    @classmethod
    def reset(cls):
        cls.requests, cls.sent = 0, 0


def start_emulator():
    """The emulator on a free port of 127.0.0.1, its handler counting requests and their bytes;
    (its URL, the server to stop)."""
    from gcp_storage_emulator import server

    class CountingHandler(server.RequestHandler):
        def parse_request(self):
            ok = super().parse_request()
            if ok:
                Counter.requests += 1
                Counter.sent += len(self.requestline) + sum(len(k) + len(v) + 4 for k, v in self.headers.items())
                Counter.sent += int(self.headers.get("Content-Length") or 0)
            return ok

    server.RequestHandler = CountingHandler  # read when the API thread builds its HTTP server
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    emulator = server.create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    emulator.start()
    return f"http://127.0.0.1:{port}", emulator


class RewriteAppender:
    """The previous gs:// Appender: the file kept in memory and uploaded whole at each write."""

    def __init__(self, path: str):
        self.path, self._data = path, None

    def write(self, data: bytes) -> None:
        from paravt_jax.infra import storage

        if self._data is None:
            self._data = storage.read_bytes(self.path) if storage.isfile(self.path) else b""
        self._data += data
        storage.write_atomic(self.path, self._data)

    def close(self) -> None:
        pass


def lines(count: int, size: int) -> list[bytes]:
    """`count` JSON-like lines of `size` bytes each (newline included)."""
    out = []
    for i in range(count):
        head = f'{{"step": {i}, "loss": {1.0 / (i + 1):.6f}, "pad": "'.encode()
        out.append(head + b"x" * max(0, size - len(head) - 3) + b'"}\n')
    return out


def run_arm(make, path: str, data: list[bytes]) -> dict:
    from paravt_jax.infra import storage

    Counter.reset()
    start = time.perf_counter()
    appender = make(path)
    for line in data:
        appender.write(line)
    appender.close()
    seconds = time.perf_counter() - start
    requests, sent = Counter.requests, Counter.sent
    directory, name = posixpath.split(path)
    return {"requests": requests, "sent": sent, "seconds": seconds, "bytes": storage.read_bytes(path),
            "left": [n for n in storage.listdir(directory) if n != name]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", default="100,1000", help="comma-separated numbers of appends per run")
    parser.add_argument("--line-bytes", type=int, default=200, help="bytes per append (a metrics.jsonl line)")
    args = parser.parse_args()
    counts = [int(n) for n in args.appends.split(",") if n]

    os.environ["STORAGE_EMULATOR_HOST"], emulator = start_emulator()
    try:
        measure(counts, args.line_bytes)
    finally:
        emulator.stop()


def measure(counts: list[int], line_bytes: int) -> None:
    from paravt_jax.infra import storage

    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores; gcp-storage-emulator "
          f"in memory; {line_bytes}-byte appends", flush=True)
    storage.isfile(f"gs://{BUCKET}/warm-up")  # gcsfs's session opened before either arm is timed
    rows = []
    with tempfile.TemporaryDirectory() as local:
        for count in counts:
            data = lines(count, line_bytes)
            local_path = os.path.join(local, f"metrics-{count}.jsonl")
            appender = storage.Appender(local_path)
            for line in data:
                appender.write(line)
            appender.close()
            with open(local_path, "rb") as f:
                expected = f.read()
            arms = [("whole file re-uploaded per write (before)", RewriteAppender, "rewrite"),
                    ("part + compose per write (Appender)", storage.Appender, "compose")]
            for label, make, name in arms:
                result = run_arm(make, f"gs://{BUCKET}/{name}-{count}/metrics.jsonl", data)
                rows.append([count, label, result["requests"], f"{result['requests'] / count:.1f}",
                             f"{result['sent'] / 2**20:.3f}", f"{result['sent'] / len(expected):.1f}",
                             f"{result['seconds']:.2f}", "yes" if result["bytes"] == expected else "NO",
                             len(result["left"])])
    print_table("gs:// appends: requests and bytes sent to the store (the file: appends x line bytes)",
                ["appends", "arm", "requests", "per append", "MiB sent", "sent / file", "seconds",
                 "same bytes as local", "objects left beside"], rows)


if __name__ == "__main__":
    main()
