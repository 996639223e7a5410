"""Minimal safetensors reader/writer on numpy memmaps (bfloat16 via ml_dtypes).

Reading maps the file and materialises one tensor at a time, so host memory peaks at about
one tensor beyond what has been placed on devices. Writing goes to a temporary name and is
renamed into place, so a crash never leaves a half-written shard behind.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping

import ml_dtypes
import numpy as np

DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
NAMES = {v: k for k, v in DTYPES.items()}


class SafetensorsError(ValueError):
    pass


class SafetensorsFile:
    """Lazy view of one .safetensors file: `names`, `shape(name)`, `read(name)`."""

    def __init__(self, path: str):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                raw = f.read(8)
                if len(raw) != 8:
                    raise SafetensorsError(f"{path}: file too short for a safetensors header")
                (header_len,) = struct.unpack("<Q", raw)
                if header_len > size - 8:
                    raise SafetensorsError(f"{path}: header length {header_len} exceeds file size {size}")
                header = json.loads(f.read(header_len))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SafetensorsError(f"{path}: cannot read safetensors header ({e})") from e
        self.metadata = header.pop("__metadata__", {}) or {}
        self.header = header
        self.data_start = 8 + header_len
        self.size = size

    @property
    def names(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def read(self, name: str) -> np.ndarray:
        info = self.header[name]
        if info["dtype"] not in DTYPES:
            raise SafetensorsError(f"{self.path}: tensor {name} has unsupported dtype {info['dtype']}")
        dtype = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * dtype.itemsize or self.data_start + end > self.size:
            raise SafetensorsError(f"{self.path}: tensor {name} data range {begin}..{end} is "
                                   f"inconsistent with shape {shape} {info['dtype']} / file size")
        if count == 0:
            return np.zeros(shape, dtype)
        return np.memmap(self.path, dtype=dtype, mode="r", offset=self.data_start + begin,
                         shape=shape)


def write_file(path: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None):
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = []
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        if array.dtype not in NAMES:
            raise SafetensorsError(f"tensor {name}: dtype {array.dtype} cannot be stored")
        header[name] = {"dtype": NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for array in arrays:
            f.write(array.tobytes())
    os.replace(tmp, path)


def open_checkpoint(directory: str) -> dict[str, SafetensorsFile]:
    """name -> file for `model.safetensors` or a sharded checkpoint with an index."""
    index = os.path.join(directory, "model.safetensors.index.json")
    single = os.path.join(directory, "model.safetensors")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise SafetensorsError(f"{index}: unreadable index ({e})") from e
        files: dict[str, SafetensorsFile] = {}
        table = {}
        for name, filename in weight_map.items():
            path = os.path.join(directory, filename)
            if filename not in files:
                if not os.path.isfile(path):
                    raise SafetensorsError(f"{index}: shard {filename} listed for {name} is missing")
                files[filename] = SafetensorsFile(path)
            if name not in files[filename].header:
                raise SafetensorsError(f"{path}: index lists {name} but the shard lacks it")
            table[name] = files[filename]
        return table
    if os.path.isfile(single):
        f = SafetensorsFile(single)
        return {name: f for name in f.names}
    raise FileNotFoundError(f"{directory}: neither model.safetensors nor "
                            "model.safetensors.index.json found")


def write_sharded(directory: str, tensors: Iterable[tuple[str, np.ndarray]],
                  max_shard_bytes: int) -> list[str]:
    """Streams tensors into shards of at most max_shard_bytes (a larger tensor gets a shard of
    its own); holds one shard in host memory at a time. Returns the file names written."""
    parts: list[tuple[str, list[str], int]] = []  # (temporary file, names, bytes)
    current: dict[str, np.ndarray] = {}
    current_bytes = 0

    def flush():
        nonlocal current, current_bytes
        if current:
            tmp_name = os.path.join(directory, f".part-{len(parts):05d}.safetensors")
            write_file(tmp_name, current)
            parts.append((tmp_name, list(current), current_bytes))
            current, current_bytes = {}, 0

    for name, array in tensors:
        if current_bytes and current_bytes + array.nbytes > max_shard_bytes:
            flush()
        current[name] = array
        current_bytes += array.nbytes
    flush()
    if len(parts) == 1:
        os.replace(parts[0][0], os.path.join(directory, "model.safetensors"))
        return ["model.safetensors"]
    names, weight_map = [], {}
    for i, (tmp_name, keys, _) in enumerate(parts):
        filename = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
        os.replace(tmp_name, os.path.join(directory, filename))
        names.append(filename)
        weight_map.update({k: filename for k in keys})
    index = {"metadata": {"total_size": int(sum(p[2] for p in parts))}, "weight_map": weight_map}
    tmp = os.path.join(directory, "model.safetensors.index.json.tmp")
    with open(tmp, "w") as f:
        json.dump(index, f, indent=2)
    os.replace(tmp, os.path.join(directory, "model.safetensors.index.json"))
    return names
