"""Run metrics: a JSONL file, TensorBoard event files (written directly in the TFRecord /
Event protobuf format, so no TensorFlow is needed) and a one-line console progress report.
Only process 0 writes. The workdir may be local or gs:// (paravt_jax.infra.storage)."""
from __future__ import annotations

import json
import math
import posixpath
import socket
import struct
import time
import uuid

import jax
from absl import logging

from paravt_jax.infra import storage


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
    return (header + struct.pack("<I", masked_crc32c(crc32c(header)))
            + data + struct.pack("<I", masked_crc32c(crc32c(data))))


class MetricsWriter:
    def __init__(self, workdir: str, console: bool = True, total_steps: int | None = None):
        self.enabled = jax.process_index() == 0
        self.console = console and self.enabled
        self.total_steps = total_steps
        self.jsonl_path = storage.join(workdir, "metrics.jsonl")
        self.events_dir = storage.join(workdir, "tensorboard")
        self._jsonl = self._events = None
        self._start = time.time()
        if self.enabled:
            storage.makedirs(self.events_dir)
            # the second, the host and a random suffix: a writer opened in the same second as an
            # interrupted run's (a fast resume) gets a file of its own, so resume() truncates the
            # earlier one instead of appending to it
            name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{uuid.uuid4().hex[:8]}"
            self._events = storage.Appender(storage.join(self.events_dir, name))
            self._events.write(record(event_bytes(time.time(), 0, file_version="brain.Event:2")))
            self._jsonl = storage.Appender(self.jsonl_path)

    def resume(self, start_step: int):
        """Drops what an interrupted run logged for steps >= start_step (the steps the resumed
        run repeats), from metrics.jsonl and from the earlier TensorBoard event files."""
        if not self.enabled:
            return
        if storage.isfile(self.jsonl_path):
            truncate_jsonl(self.jsonl_path, start_step)
        own = posixpath.basename(self._events.path)
        for name in storage.listdir(self.events_dir):
            if name.startswith("events.out.tfevents") and name != own:
                truncate_events(storage.join(self.events_dir, name), start_step)

    def write(self, step: int, metrics: dict, prefix: str = ""):
        if not self.enabled:
            return
        scalars = {prefix + k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}
        self._jsonl.write(json.dumps({"step": step, "time": round(time.time() - self._start, 3),
                                      **{prefix + k: v for k, v in metrics.items()}}, default=str) + "\n")
        self._events.write(record(event_bytes(time.time(), step, scalars)))
        if self.console:
            keys = [k for k in ("loss", "reward", "acc_reward", "format_compliance", "kappa", "grad_norm")
                    if prefix + k in scalars]
            shown = "  ".join(f"{k} {scalars[prefix + k]:.4g}" for k in keys)
            total = f"/{self.total_steps}" if self.total_steps else ""
            logging.info(f"[{prefix or 'step'} {step}{total}] {shown}")

    def close(self):
        for appender in (self._jsonl, self._events):
            if appender:
                appender.close()
        self._jsonl = self._events = None


def truncate_jsonl(path: str, start_step: int) -> None:
    """Keeps the lines of steps < start_step (and drops a torn last line), atomically."""
    kept = []
    for line in storage.read_bytes(path).splitlines(keepends=True):
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue  # a line torn by a kill mid-write
        if step < start_step:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
    storage.write_atomic(path, b"".join(kept))


def event_records(data: bytes):
    """(start, end, body) of each whole record; stops at a torn or corrupt tail."""
    pos = 0
    while pos + 12 <= len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        end = pos + 16 + length
        if (struct.unpack("<I", data[pos + 8:pos + 12])[0] != masked_crc32c(crc32c(header)) or end > len(data)):
            return
        body = data[pos + 12:pos + 12 + length]
        if struct.unpack("<I", data[end - 4:end])[0] != masked_crc32c(crc32c(body)):
            return
        yield pos, end, body
        pos = end


def truncate_events(path: str, start_step: int) -> None:
    """Keeps the file-version record and the scalar records of steps < start_step."""
    data = storage.read_bytes(path)
    kept = []
    for start, end, body in event_records(data):
        step, scalars = parse_event(body)
        if step < start_step or not scalars:
            kept.append(data[start:end])
    storage.write_atomic(path, b"".join(kept))


def _read_varint(buf, pos):
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _parse_fields(buf):
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            length, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        yield number, value


def parse_event(buf) -> tuple[int, dict[str, float]]:
    """(step, {tag: value}) of one serialized Event protobuf."""
    step, scalars = 0, {}
    for number, value in _parse_fields(buf):
        if number == 2:
            step = value
        elif number == 5:
            for _, v in _parse_fields(value):
                fields = dict(_parse_fields(v))
                scalars[fields[1].decode()] = struct.unpack("<f", fields[2])[0]
    return step, scalars
