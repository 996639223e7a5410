"""Atomic file writes: a reader (a sweep polling `summary.json`, a resumed evaluation, a crashed
run's restart) sees either the old file or the whole new one, never a partial one."""
from __future__ import annotations

import json
import os
from typing import Any


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Writes `data` to a temporary file beside `path`, fsyncs it and renames it over `path`."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: str, payload: Any) -> None:
    """Writes `payload` as indented JSON (unknown types through `str`), atomically."""
    write_bytes_atomic(path, json.dumps(payload, indent=2, default=str).encode())
