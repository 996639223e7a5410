"""Paths on local disk or on Cloud Storage (`gs://bucket/path`), with whole-file atomicity.

Every writer of a run directory (metrics, TensorBoard events, summaries, the cold start's
table, the exported model, evaluation records) goes through these functions, so a workdir may
be a local directory or a `gs://` prefix. Checkpoints go through orbax, which reads `gs://`
itself (etils epath and gcsfs for metadata, tensorstore for arrays).

Atomicity: a reader (a resumed run, a sweep polling `summary.json`, another host) sees either
the old file or the whole new one. A local write goes to a temporary file beside the target,
is fsynced and renamed over it; a `gs://` write is a single-object upload, which Cloud Storage
publishes whole or not at all. Cloud Storage cannot append: `Appender` uploads each write as a
part object beside the file and composes the file with it (the Cloud Storage compose
operation, which publishes the concatenation whole), so a run's appends cost bytes and
requests linear in what it writes (three requests per write), not a re-upload of the file.

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
    read_versioned(path)  (bytes, generation): what write_if_generation / remove_if_generation
                          take to change exactly that version (gs:// only; the workdir lock)
    write_if_generation(path, data, generation) / remove_if_generation(path, generation)
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
import uuid
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


# ----------------------------------------------------------------------------- generations
# Every version of a Cloud Storage object has a generation number; a request that carries
# ifGenerationMatch=G takes effect only while the object's generation is G (0: while it does not
# exist), else it fails with 412 (gcsfs: FileExistsError) and changes nothing. The workdir lock's
# compare-and-swap and the Appender's compose go through these.

def _bucket_object(path: str) -> tuple[str, str]:
    if not is_remote(path):
        raise ValueError(f"{path}: object generations are a Cloud Storage thing; expected a {SCHEME} path")
    bucket, _, name = _key(path).partition("/")
    if not bucket or not name:
        raise ValueError(f"{path}: expected gs://BUCKET/OBJECT")
    return bucket, name


def _upload_url(fs, bucket: str) -> str:
    from gcsfs.core import quote

    # fs.base is LOCATION/storage/v1/ (the JSON API); uploads go to LOCATION/upload/storage/v1/
    return fs.base[:-len("storage/v1/")] + f"upload/storage/v1/b/{quote(bucket)}/o"


def _upload(path: str, data: bytes, if_generation_match: int | None = None) -> dict:
    """One upload of `data` to `path` (multipart: the object's name, then its bytes, as gcsfs
    uploads); the new object's resource (its generation, size, CRC32C)."""
    fs = filesystem()
    bucket, name = _bucket_object(path)
    conditions = {} if if_generation_match is None else {"ifGenerationMatch": str(if_generation_match)}
    boundary = f"paravt-{uuid.uuid4().hex}".encode()  # a random boundary: no write holds it
    body = (b"--" + boundary + b"\nContent-Type: application/json; charset=UTF-8\n\n"
            + json.dumps({"name": name}).encode() + b"\n--" + boundary
            + b"\nContent-Type: application/octet-stream\n\n" + data + b"\n--" + boundary + b"--")
    return fs.call("POST", _upload_url(fs, bucket), uploadType="multipart", data=body, json_out=True,
                   headers={"Content-Type": f'multipart/related; boundary="{boundary.decode()}"'}, **conditions)


def read_versioned(path: str) -> tuple[bytes, int]:
    """The bytes of the gs:// object at `path` and their generation, from one download (Cloud
    Storage names the generation it sent in x-goog-generation). FileNotFoundError if absent."""
    _bucket_object(path)
    fs = filesystem()
    headers, data = fs.call("GET", fs.url(_key(path)))
    generation = headers.get("x-goog-generation")
    if generation is None:  # a store that leaves the header out: ask, then download that version only
        generation = filesystem().info(_key(path))["generation"]
        _, data = fs.call("GET", fs.url(_key(path), generation=generation))
    return data, int(generation)


def write_if_generation(path: str, data: bytes | str, generation: int) -> int | None:
    """Uploads `data` to the gs:// object at `path` if its generation is still `generation` (0:
    if it does not exist), in one request; the new generation, or None if the object changed
    meanwhile (nothing is written then)."""
    data = data.encode() if isinstance(data, str) else data
    try:
        return int(_upload(path, data, if_generation_match=generation)["generation"])
    except FileExistsError:  # 412: the precondition failed
        return None


def remove_if_generation(path: str, generation: int) -> bool:
    """Deletes the gs:// object at `path` if its generation is still `generation`; False if it
    changed or is gone."""
    bucket, name = _bucket_object(path)
    try:
        filesystem().call("DELETE", "b/{}/o/{}", bucket, name, ifGenerationMatch=str(generation))
        return True
    except (FileExistsError, FileNotFoundError):
        return False


# ----------------------------------------------------------------------------- appending
class Appender:
    """An append-only file; one writer per file. Local: opened for appending, each write
    flushed (`sync` fsyncs).

    gs://: Cloud Storage objects cannot grow, so each write is uploaded as a part object
    (`.NAME.append-TOKEN` beside the file, holding that write only) and the file is replaced by
    the composition of itself and the part (one compose request, published whole), after which
    the part is deleted: three requests and the write's own bytes per write, linear in the
    run's length (re-uploading the file at each write, as before, is quadratic). A reader sees
    every whole write up to some point, and the same bytes as the local file would hold.

    The compose carries the file's generation as a precondition, so a compose that gcsfs
    retries after a lost reply cannot append the part twice: on a failed precondition the file
    is taken to hold our write when its size and CRC32C are those of the file with it, and
    anything else is an error naming the path. The first write of an Appender reads the file's
    generation, size and CRC32C (a later writer continues the file) and removes the parts a
    writer killed mid-write left behind."""

    def __init__(self, path: str):
        self.path = path
        self.remote = is_remote(path)
        self._file = None
        # gs://: the file as our last write left it (generation 0: no file yet)
        self._generation: int | None = None
        self._size = 0
        self._crc32c: int | None = 0  # None: the store gives no CRC32C
        if self.remote:
            directory, name = posixpath.split(path)
            self._part_prefix = f"{directory}/.{name}.append-"
            self._part = f"{self._part_prefix}{uuid.uuid4().hex[:12]}"

    def write(self, data: bytes | str) -> None:
        data = data.encode() if isinstance(data, str) else data
        if self.remote:
            self._append_remote(data)
            return
        if self._file is None:
            self._file = open(self.path, "ab")
        self._file.write(data)
        self._file.flush()

    def _append_remote(self, data: bytes) -> None:
        fs = filesystem()
        if self._generation is None:
            self._open_remote(fs)
        if self._generation == 0:  # no file yet: the first write creates it whole
            self._guarded(lambda: _upload(self.path, data, if_generation_match=0), data)
            return
        if not data:
            return
        _upload(self._part, data)
        bucket, name = _bucket_object(self.path)
        _, part = _bucket_object(self._part)
        compose = {"kind": "storage#composeRequest", "sourceObjects": [{"name": name}, {"name": part}],
                   "destination": {"name": name, "bucket": bucket}}
        try:
            self._guarded(lambda: fs.call("POST", "b/{}/o/{}/compose", bucket, name,
                                          ifGenerationMatch=str(self._generation), json=compose,
                                          headers={"Content-Type": "application/json"}, json_out=True), data)
        finally:
            _remove_key(fs, _key(self._part))

    def _open_remote(self, fs) -> None:
        try:
            info = fs.info(_key(self.path))
        except FileNotFoundError:
            self._generation, self._size, self._crc32c = 0, 0, 0
        else:
            if info.get("type") != "file":
                raise IsADirectoryError(f"{self.path}: is a directory, not a file to append to")
            self._generation, self._size, self._crc32c = int(info["generation"]), int(info["size"]), _crc(info)
        try:
            entries = fs.ls(posixpath.dirname(_key(self.path)), detail=False)
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if entry.rstrip("/").startswith(_key(self._part_prefix)):
                _remove_key(fs, entry)

    def _guarded(self, request, data: bytes) -> None:
        """Runs a request conditioned on the file's generation and records the file it leaves.
        On 412 (the generation is not the one our last write left): fine when the file is
        exactly the old one with `data` appended (gcsfs retried a request whose reply was
        lost), else an error naming the path."""
        import google_crc32c

        size = self._size + len(data)
        crc = None if self._crc32c is None else google_crc32c.extend(self._crc32c, data)
        try:
            resource = request()
        except FileExistsError:
            resource = filesystem().info(_key(self.path))
            if int(resource["size"]) != size or (crc is not None and _crc(resource) != crc):
                raise RuntimeError(f"{self.path}: changed under its appender: it holds {resource['size']} bytes, not "
                                   f"the {self._size} bytes of its last write plus this write's {len(data)} (one "
                                   f"writer per file)") from None
        self._generation, self._size, self._crc32c = int(resource["generation"]), size, crc

    def sync(self) -> None:
        if self._file is not None:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _crc(resource: dict) -> int | None:
    """An object's CRC32C as an integer (Cloud Storage gives it base64-encoded, big-endian)."""
    import base64

    value = resource.get("crc32c")
    return int.from_bytes(base64.b64decode(value), "big") if value else None


def _remove_key(fs, key: str) -> None:
    try:
        fs.rm_file(key)
    except FileNotFoundError:
        pass


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
