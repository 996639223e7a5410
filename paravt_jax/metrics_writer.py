"""Run metrics: a JSONL file, TensorBoard event files (written directly in the TFRecord /
Event protobuf format, so no TensorFlow is needed) and a one-line console progress report.
Only process 0 writes."""
from __future__ import annotations

import json
import math
import os
import socket
import struct
import sys
import time

import jax


def _crc32c_table():
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(crc: int) -> int:
    """TFRecord's masked CRC32C of a length or payload."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint((number << 3) | wire) + payload


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


def event_bytes(wall_time: float, step: int, scalars: dict[str, float] | None = None,
                file_version: str | None = None) -> bytes:
    """A serialized tensorflow.Event (wall_time=1, step=2, file_version=3, summary=5)."""
    out = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if file_version:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        summary = b"".join(_bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5, struct.pack("<f", value)))
                           for tag, value in scalars.items())
        out += _bytes_field(5, summary)
    return out


def record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(crc32c(header))) + data + struct.pack("<I", masked_crc32c(crc32c(data)))


class MetricsWriter:
    def __init__(self, workdir: str, console: bool = True, total_steps: int | None = None):
        self.enabled = jax.process_index() == 0
        self.console = console and self.enabled
        self.total_steps = total_steps
        self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
        self.events_dir = os.path.join(workdir, "tensorboard")
        self._events = None
        self._start = time.time()
        if self.enabled:
            os.makedirs(self.events_dir, exist_ok=True)
            name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
            self._events = open(os.path.join(self.events_dir, name), "ab")
            self._events.write(record(event_bytes(time.time(), 0, file_version="brain.Event:2")))
            self._events.flush()

    def write(self, step: int, metrics: dict, prefix: str = ""):
        if not self.enabled:
            return
        scalars = {prefix + k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}
        with open(self.jsonl_path, "a") as f:
            f.write(json.dumps({"step": step, "time": round(time.time() - self._start, 3),
                                **{prefix + k: v for k, v in metrics.items()}}, default=str) + "\n")
        self._events.write(record(event_bytes(time.time(), step, scalars)))
        self._events.flush()
        if self.console:
            keys = [k for k in ("loss", "reward", "acc_reward", "format_compliance", "kappa", "grad_norm")
                    if prefix + k in scalars]
            shown = "  ".join(f"{k} {scalars[prefix + k]:.4g}" for k in keys)
            total = f"/{self.total_steps}" if self.total_steps else ""
            print(f"[{prefix or 'step'} {step}{total}] {shown}", file=sys.stdout, flush=True)

    def close(self):
        if self._events:
            self._events.close()
            self._events = None
