"""Paths on local disk or on Cloud Storage (`gs://bucket/path`), with whole-file atomicity.

Every writer of a run directory (metrics, TensorBoard events, summaries, the cold start's
table, the exported model, evaluation records) goes through these functions, so a workdir may
be a local directory or a `gs://` prefix. Checkpoints go through orbax, which reads `gs://`
itself (etils epath and gcsfs for metadata, tensorstore for arrays).

Atomicity: a reader (a resumed run, a sweep polling `summary.json`, another host) sees either
the old file or the whole new one. A local write goes to a temporary file beside the target,
is fsynced and renamed over it; a `gs://` write is a single-object upload, which Cloud Storage
publishes whole or not at all. Cloud Storage cannot append: `Appender` rewrites the whole
object on each write (metrics and event files are small; each rewrite is one upload).

The interface, for local paths and `gs://` alike:
    is_remote(path)       whether path is a gs:// URL
    join(path, *parts)    path joined with '/' (local: os.path.join)
    absolute(path)        os.path.abspath for local paths; a URL unchanged
    exists / isfile / isdir(path)
    makedirs(path)        a no-op on gs:// (prefixes need no creation)
    listdir(path)         the names directly under path, sorted ([] when it does not exist)
    read_bytes / read_text(path)
    write_atomic(path, data)          bytes or str
    write_json_atomic(path, payload)
    remove(path)          one file; a missing one is fine
    rmtree(path)          everything under path; a missing one is fine
    Appender(path)        an append-only file (write, sync, close)
    staged_directory(path)  a local directory whose files are published to path on exit

Cloud Storage credentials are gcsfs's (application default credentials, a service account
from GOOGLE_APPLICATION_CREDENTIALS, or the VM's metadata server); nothing here reads or logs
them. With STORAGE_EMULATOR_HOST set (a GCS API emulator, e.g. in tests), every client here and
in orbax talks to the emulator without credentials (`_emulator`).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import posixpath
import shutil
import tempfile
from typing import Any

SCHEME = "gs://"


def is_remote(path: str) -> bool:
    path = os.fspath(path)
    if "://" in path and not path.startswith(SCHEME):
        raise ValueError(f"{path}: only local paths and {SCHEME} URLs are supported")
    return path.startswith(SCHEME)


def join(path: str, *parts: str) -> str:
    return posixpath.join(path, *parts) if is_remote(path) else os.path.join(path, *parts)


def absolute(path: str) -> str:
    return path if is_remote(path) else os.path.abspath(path)


def _emulator() -> str:
    """STORAGE_EMULATOR_HOST, after pointing orbax's clients at it: tensorstore reads its own
    variables (and takes a dummy token), and epath's gcsfs (protocols gs and gcs) gets the
    plain class without credentials (the default class asks the storage-control API, which an
    emulator lacks, for each bucket's layout)."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if host:
        import fsspec

        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", host)
        os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
        for protocol in ("gs", "gcs"):
            fsspec.register_implementation(protocol, _emulator_class(), clobber=True)
    return host


@functools.cache
def _emulator_class():
    import gcsfs.core

    class EmulatorFileSystem(gcsfs.core.GCSFileSystem):
        """gcsfs against an emulator: no credentials."""

        def __init__(self, *args, **kwargs):
            kwargs["token"] = "anon"
            super().__init__(*args, **kwargs)

    return EmulatorFileSystem


@functools.cache
def _filesystem(emulator: str):
    import gcsfs

    # No listing cache: other processes (orbax, other hosts) write the same bucket.
    if emulator:
        return _emulator_class()(use_listings_cache=False)
    return gcsfs.GCSFileSystem(use_listings_cache=False)


def filesystem():
    """The gcsfs file system for gs:// paths (one per process)."""
    try:
        return _filesystem(_emulator())
    except ImportError as e:
        raise RuntimeError(f"gs:// paths need gcsfs (pip install gcsfs): {e}") from e


def prepare(path: str) -> str:
    """Call before handing `path` to orbax: points orbax's clients at an emulator if one is
    set. Returns the path, made absolute when local."""
    if is_remote(path):
        _emulator()
    return absolute(path)


def _key(path: str) -> str:
    return path[len(SCHEME):].rstrip("/")


def exists(path: str) -> bool:
    return filesystem().exists(_key(path)) if is_remote(path) else os.path.exists(path)


def isfile(path: str) -> bool:
    return filesystem().isfile(_key(path)) if is_remote(path) else os.path.isfile(path)


def isdir(path: str) -> bool:
    return filesystem().isdir(_key(path)) if is_remote(path) else os.path.isdir(path)


def makedirs(path: str) -> None:
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def listdir(path: str) -> list[str]:
    if not is_remote(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    fs = filesystem()
    try:
        entries = fs.ls(_key(path), detail=False)
    except FileNotFoundError:
        return []
    return sorted({posixpath.basename(e.rstrip("/")) for e in entries} - {""})


def read_bytes(path: str) -> bytes:
    if is_remote(path):
        return filesystem().cat_file(_key(path))
    with open(path, "rb") as f:
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode()


def write_atomic(path: str, data: bytes | str) -> None:
    """Writes `data` so that readers see the old file or the whole new one: locally to a
    temporary file beside `path`, fsynced and renamed over it; on gs:// as one upload."""
    data = data.encode() if isinstance(data, str) else data
    if is_remote(path):
        filesystem().pipe_file(_key(path), data)
        return
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: str, payload: Any) -> None:
    """Writes `payload` as indented JSON (unknown types through `str`), atomically."""
    write_atomic(path, json.dumps(payload, indent=2, default=str))


def remove(path: str) -> None:
    try:
        if is_remote(path):
            filesystem().rm_file(_key(path))
        else:
            os.remove(path)
    except FileNotFoundError:
        pass


def rmtree(path: str) -> None:
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    fs = filesystem()
    if fs.exists(_key(path)):
        fs.rm(_key(path), recursive=True)


class Appender:
    """An append-only file. Local: opened for appending, each write flushed (`sync` fsyncs).
    gs://: the whole object (read once at the first write, then kept) is uploaded again on
    each write, since Cloud Storage objects cannot grow; a reader sees every whole write up
    to some point, as with a local file read between writes. One writer per file."""

    def __init__(self, path: str):
        self.path = path
        self.remote = is_remote(path)
        self._file = None
        self._data: bytes | None = None

    def write(self, data: bytes | str) -> None:
        data = data.encode() if isinstance(data, str) else data
        if self.remote:
            if self._data is None:
                self._data = read_bytes(self.path) if isfile(self.path) else b""
            self._data += data
            write_atomic(self.path, self._data)
            return
        if self._file is None:
            self._file = open(self.path, "ab")
        self._file.write(data)
        self._file.flush()

    def sync(self) -> None:
        if self._file is not None:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@contextlib.contextmanager
def staged_directory(path: str, last: tuple[str, ...] = ()):
    """A local directory whose files end up in `path`: `path` itself when it is local (the
    writer's own atomicity holds); for gs://, a temporary directory whose files are uploaded
    when the block exits without an error (each file one upload, the names in `last` after
    the others), after which files under `path` that the block did not write are removed.
    Subdirectories are uploaded too."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="paravt-stage-") as local:
        yield local
        written = []
        for root, _, names in os.walk(local):
            written += [os.path.relpath(os.path.join(root, n), local) for n in names]
        order = sorted(written, key=lambda name: (name in last, name))
        fs = filesystem()
        for name in order:
            fs.put_file(os.path.join(local, name), _key(join(path, *name.split(os.sep))))
        keep = {_key(join(path, *name.split(os.sep))) for name in written}
        for stale in fs.find(_key(path)):
            if stale not in keep:
                fs.rm_file(stale)
