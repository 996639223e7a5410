"""A run's claim on its workdir: the lock (one run at a time, paravt_jax/infra/locking.py) and the
config it runs under (`run_config.json`). A rerun whose config differs from the stored one in
anything but run length and placement (RESUMABLE) is refused with the differing fields
(`ConfigChanged`), unless `config_changed="ok"`, which records the change and continues. The
stored record also holds the run's manifest (`record_manifest`: commit, packages, CPU, data;
paravt_jax/infra/reproducibility.py); a resume under another environment is allowed, logged and
appended to config_changes.jsonl with the fields that differ.

Multi-process: process 0 alone takes the lock and reads and writes the stored config; every
process gets its verdict, so all of them stop or none does.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import time

from absl import logging

from paravt_jax.cli.flags import UsageError
from paravt_jax.eval.held_out import HeldOutConfig
from paravt_jax.infra import distributed, reproducibility, storage
from paravt_jax.infra.locking import WorkdirLock, WorkdirLocked
from paravt_jax.run_config import RunConfig

CONFIG_NAME = "run_config.json"
CHANGES_NAME = "config_changes.jsonl"
# Fields a resumed run may change: its length, and where and how it is placed and compiled
# (another mesh on requeued hardware), the evaluations' speed settings (HeldOutConfig.SPEED_ONLY:
# how many settings run at once) and the micro-batch passes run at once; none of them changes
# what a step or an evaluation computes.
RESUMABLE = ("sft.steps", "rl.steps", "workdir", "mesh.*", "mesh_preset", "compilation_cache_dir",
             "sft.concurrent_micro_batches", "rl.concurrent_micro_batches",
             *(f"{section}.*.{name}" for section in ("evals", "rl.evals") for name in HeldOutConfig.SPEED_ONLY))
CONFIG_CHANGED = ("refuse", "ok")
MANIFEST = "manifest"  # the stored record's key for the run's manifest (not compared as config)


class ConfigChanged(UsageError):
    """The workdir holds a run of another config; the message lists the differing fields."""


def config_record(run: RunConfig, command: str) -> dict:
    """The stored form of a run's config: the config as given, JSON types only (tuples become
    lists; RunConfig.record)."""
    return {"command": command, "config": run.record}


def changed_fields(stored: dict, current: dict) -> list[str]:
    """`field: stored -> current` for every field that differs, RESUMABLE ones aside."""
    a, b = reproducibility.flatten(stored), reproducibility.flatten(current)
    out = []
    for key in sorted(set(a) | set(b)):
        name = key.removeprefix("config.")
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in RESUMABLE):
            continue
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            out.append(f"{name}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}")
    return out


def check_config(workdir: str, record: dict, config_changed: str = "refuse") -> list[str]:
    """Stores `record` in a new workdir; in one with a stored config, refuses (ConfigChanged) a
    record that differs in more than RESUMABLE fields, unless config_changed == "ok": then the
    change is appended to config_changes.jsonl and the new record stored. Returns the changes."""
    if config_changed not in CONFIG_CHANGED:
        raise UsageError(f"--config_changed={config_changed!r}: expected one of {CONFIG_CHANGED}")
    path = storage.join(workdir, CONFIG_NAME)
    try:
        stored = json.loads(storage.read_bytes(path))
    except FileNotFoundError:
        stored = None
    except ValueError as e:
        raise UsageError(f"{path} is not readable JSON ({e}); restore or delete it") from None
    manifest = stored.pop(MANIFEST, None) if isinstance(stored, dict) else None
    changes = changed_fields(stored, record) if stored is not None else []
    if changes and config_changed != "ok":
        shown = "; ".join(changes[:10]) + (f"; and {len(changes) - 10} more" if len(changes) > 10 else "")
        raise ConfigChanged(f"workdir {workdir} holds a run of another config ({shown}); only the run length "
                            f"(sft.steps, rl.steps) and placement may change on a rerun: use another --workdir, or "
                            f"--config_changed=ok to continue this run under the new config")
    if changes:
        log = storage.Appender(storage.join(workdir, CHANGES_NAME))
        log.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "changes": changes}) + "\n")
        log.close()
        logging.warning(f"[workdir] continuing {workdir} under a changed config (--config_changed=ok): "
                        + "; ".join(changes))
    if stored != record:
        storage.write_json_atomic(path, {**record, **({MANIFEST: manifest} if manifest else {})})
    return changes


def record_manifest(workdir: str, manifest: dict) -> list[str]:
    """Stores the run's manifest in run_config.json (process 0; after `check_config`). A stored
    manifest that differs (a resume on another machine or commit) is replaced, and the
    differences, numeric fields first (reproducibility.differences), are logged and appended to
    config_changes.jsonl. Returns them."""
    if not distributed.is_primary():
        return []
    path = storage.join(workdir, CONFIG_NAME)
    try:
        record = json.loads(storage.read_bytes(path))
    except (FileNotFoundError, ValueError):
        record = {}
    previous = record.get(MANIFEST)
    changes = reproducibility.differences(previous, manifest) if previous else []
    if changes:
        logging.warning(f"[workdir] {workdir} continues a run made under another environment: " + "; ".join(changes[:8])
                        + (f"; and {len(changes) - 8} more" if len(changes) > 8 else ""))
        log = storage.Appender(storage.join(workdir, CHANGES_NAME))
        log.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "manifest_changes": changes}) + "\n")
        log.close()
    if previous != manifest:
        storage.write_json_atomic(path, {**record, MANIFEST: manifest})
    return changes


@contextlib.contextmanager
def claim(run: RunConfig, workdir: str, command: str, config_changed: str = "refuse"):
    """Holds workdir for the body: its lock (process 0) and its config check. Collective."""
    lock, error = None, None
    if distributed.is_primary():
        try:
            lock = WorkdirLock(workdir, command=command).acquire()
            if lock.took_over is not None:
                logging.warning(f"[workdir] took over the lock of pid {lock.took_over.pid} on "
                                f"{lock.took_over.host}, which is gone")
            check_config(workdir, config_record(run, command), config_changed)
        except WorkdirLocked as e:  # the library's error, a usage error of the command line
            error = UsageError(str(e))
        except UsageError as e:
            error = e
    verdicts = distributed.allgather_objects(None if error is None else str(error))
    try:
        if error is not None:
            raise error
        if verdicts[0] is not None:
            raise UsageError(verdicts[0])
        yield workdir
    finally:
        if lock is not None:
            lock.release()


def resolve_workdir(run: RunConfig, flag_workdir: str = "") -> str:
    """--workdir, else the config's workdir, else runs/PRESET; created if missing."""
    workdir = flag_workdir or run.workdir or os.path.join("runs", run.preset)
    storage.makedirs(workdir)
    return workdir


def claims_workdir(command: str):
    """Decorates a job `f(run, workdir="", ...)` (run: the RunConfig): resolves the workdir (`resolve_workdir`),
    claims it for the call (`config_changed=` is the decorator's keyword) and passes it on."""
    def decorate(function):
        @functools.wraps(function)
        def wrapper(run: RunConfig, workdir: str = "", *args, config_changed: str = "refuse", **kwargs):
            resolved = resolve_workdir(run, workdir)
            with claim(run, resolved, command, config_changed):
                return function(run, resolved, *args, **kwargs)
        return wrapper
    return decorate
