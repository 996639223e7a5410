"""One run per workdir: a lock file naming its holder (host, pid, command, start, heartbeat).

A second run in the same workdir is refused with the holder's host and pid (`WorkdirLocked`).
A lock whose holder is gone is taken over: on the same host when its pid no longer runs, from
another host when its heartbeat (rewritten every HEARTBEAT_S seconds while the run lives) is
older than STALE_AFTER_S seconds, so that a requeued job on another machine resumes after a
hard kill.

All of the lock's I/O goes through a `LockStore`: create-if-absent, read, and replace or delete
only if the file still holds what the caller read (compare and swap). `LocalStore` does that on a
POSIX filesystem (O_EXCL creation, an flock-guarded compare and swap); `BucketStore` on Cloud
Storage through its generation preconditions (`ifGenerationMatch=0` to create, the generation
read to replace or delete: each step one request that fails if another host got there first), so
two runs started at the same moment on two hosts cannot both take a gs:// workdir.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from typing import Protocol

LOCK_NAME = ".lock.json"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0  # ten missed heartbeats: the holder on another host is taken to be gone


class WorkdirLocked(RuntimeError):
    """Another live run holds the workdir; the message names its host and pid (the command line
    reports it as a usage error: paravt_jax/cli/workdirs.py)."""


class LockStore(Protocol):
    def create(self, path: str, data: bytes) -> bool:
        """Writes `data` at `path` if nothing is there; False if something is."""

    def read(self, path: str) -> bytes | None:
        """The bytes at `path`, None if absent."""

    def replace(self, path: str, data: bytes, expected: bytes) -> bool:
        """Writes `data` at `path` if it still holds `expected`; False otherwise."""

    def delete(self, path: str, expected: bytes) -> bool:
        """Removes `path` if it still holds `expected`; False otherwise."""


class LocalStore:
    """LockStore on a local or shared POSIX filesystem. Compare-and-swap steps hold an flock on a
    guard file beside the lock, so two processes taking over one stale lock cannot both win."""

    def create(self, path: str, data: bytes) -> bool:
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic, fails if present, and the lock is whole when it appears
            return True
        except FileExistsError:
            return False
        finally:
            os.remove(tmp)

    def read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def _guard(self, path: str):
        with open(f"{path}.guard", "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)

    def replace(self, path: str, data: bytes, expected: bytes) -> bool:
        from paravt_jax.infra import storage

        with self._guard(path):
            if self.read(path) != expected:
                return False
            storage.write_atomic(path, data)
            return True

    def delete(self, path: str, expected: bytes) -> bool:
        with self._guard(path):
            if self.read(path) != expected:
                return False
            os.remove(path)
            return True


class BucketStore:
    """LockStore on Cloud Storage (gs:// workdirs), through Cloud Storage's generation
    preconditions: each step is one request that takes effect only if the object is still the
    version the caller saw, so two hosts cannot both take the lock.

    create   one upload with ifGenerationMatch=0 (only if no object is there);
    read     one download, with the generation of the bytes it returns;
    replace  one upload with ifGenerationMatch=<the generation read or last written>;
    delete   one delete with ifGenerationMatch=<the same>.

    The store remembers, per path, the generation of the bytes it last read or wrote; `replace`
    and `delete` use it when `expected` is those bytes (else they read again). A failed
    precondition is a lost race (False), except when the object now holds exactly what this
    call wrote: gcsfs retries a request whose reply was lost, and a record (host, pid, token,
    heartbeat) is never written twice, so that is our own write."""

    def __init__(self):
        self._seen: dict[str, tuple[bytes, int]] = {}
        self._lock = threading.Lock()

    def _remember(self, path: str, data: bytes | None, generation: int | None) -> None:
        with self._lock:
            if data is None or generation is None:
                self._seen.pop(path, None)
            else:
                self._seen[path] = (data, generation)

    def _generation(self, path: str, expected: bytes) -> int | None:
        """The generation of `expected` at `path`, None when the object no longer holds it."""
        with self._lock:
            seen = self._seen.get(path)
        if seen is not None and seen[0] == expected:
            return seen[1]
        data, generation = self._read(path)
        return generation if data == expected else None

    def _read(self, path: str) -> tuple[bytes | None, int | None]:
        from paravt_jax.infra import storage

        try:
            data, generation = storage.read_versioned(path)
        except FileNotFoundError:
            data, generation = None, None
        self._remember(path, data, generation)
        return data, generation

    def _won(self, path: str, data: bytes, generation: int | None) -> bool:
        if generation is None:  # the precondition failed: ours only if it holds what we wrote
            return self._read(path)[0] == data
        self._remember(path, data, generation)
        return True

    def create(self, path: str, data: bytes) -> bool:
        from paravt_jax.infra import storage

        return self._won(path, data, storage.write_if_generation(path, data, 0))

    def read(self, path: str) -> bytes | None:
        return self._read(path)[0]

    def replace(self, path: str, data: bytes, expected: bytes) -> bool:
        from paravt_jax.infra import storage

        generation = self._generation(path, expected)
        if generation is None:
            return False
        return self._won(path, data, storage.write_if_generation(path, data, generation))

    def delete(self, path: str, expected: bytes) -> bool:
        from paravt_jax.infra import storage

        generation = self._generation(path, expected)
        if generation is None:
            return False
        removed = storage.remove_if_generation(path, generation)
        self._remember(path, None, None)
        return removed


def store_for(workdir: str) -> LockStore:
    """The lock store of a workdir: BucketStore for gs://, LocalStore otherwise."""
    from paravt_jax.infra import storage

    return BucketStore() if storage.is_remote(workdir) else LocalStore()


@dataclasses.dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    command: str
    started: float
    heartbeat: float
    token: str  # tells this holder's lock from a later one of the same host and pid

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @staticmethod
    def decode(data: bytes) -> Holder | None:
        try:
            return Holder(**json.loads(data))
        except (ValueError, TypeError):
            return None  # a torn or foreign file


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def is_stale(holder: Holder | None, now: float, host: str) -> bool:
    if holder is None:
        return True
    if holder.host == host:
        return not pid_alive(holder.pid)
    return now - holder.heartbeat > STALE_AFTER_S


def describe(holder: Holder) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.started))
    return f"pid {holder.pid} on host {holder.host} ({holder.command or 'a run'}, since {started})"


class WorkdirLock:
    """The lock of one workdir, held from `acquire` to `release` (or as a context manager)."""

    def __init__(self, workdir: str, command: str = "", store: LockStore | None = None,
                 heartbeat_s: float = HEARTBEAT_S):
        self.workdir = workdir
        self.path = workdir.rstrip("/") + "/" + LOCK_NAME
        self.command = command
        self.store = store or store_for(workdir)
        self.heartbeat_s = heartbeat_s
        self.held: bytes | None = None  # what the lock file holds while we hold it
        self.took_over: Holder | None = None  # the stale holder we replaced, if any
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def _record(self, started: float | None = None) -> bytes:
        now = time.time()
        return Holder(socket.gethostname(), os.getpid(), self.command, started or now, now,
                      self._token).encode()

    def acquire(self) -> WorkdirLock:
        self._token = uuid.uuid4().hex
        host = socket.gethostname()
        for _ in range(5):  # each round either wins, or sees a change another process made
            mine = self._record()
            if self.store.create(self.path, mine):
                return self._hold(mine)
            current = self.store.read(self.path)
            if current is None:
                continue  # released meanwhile
            holder = Holder.decode(current)
            if not is_stale(holder, time.time(), host):
                raise WorkdirLocked(f"workdir {self.workdir} is in use by {describe(holder)}; wait for it, or use "
                                    f"another --workdir (if that run is gone, delete {self.path})")
            if self.store.replace(self.path, mine, expected=current):
                self.took_over = holder
                return self._hold(mine)
        raise WorkdirLocked(f"workdir {self.workdir}: the lock {self.path} keeps changing hands; try again")

    def _hold(self, data: bytes) -> WorkdirLock:
        self.held = data
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="workdir-lock-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self):
        while not self._stop.wait(self.heartbeat_s):
            with self._mutex:
                if self.held is None:
                    return
                fresh = self._record(started=Holder.decode(self.held).started)
                if self.store.replace(self.path, fresh, expected=self.held):
                    self.held = fresh
                else:  # taken over (our heartbeat stalled past STALE_AFTER_S): stop claiming it
                    self.held = None
                    return

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._mutex:
            if self.held is not None:
                self.store.delete(self.path, expected=self.held)
                self.held = None

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
