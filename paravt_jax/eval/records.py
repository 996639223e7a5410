"""The evaluation driver's record store: one JSONL file per dataset shard of finished samples
(`<dataset>.shard-IIIII-of-NNNNN.jsonl`, one record per line, appended as samples finish, so a
killed evaluation resumes), the producers manifest (`<dataset>.producers.json`: which model and
settings wrote which records), the environments they were written in (`<dataset>.manifests.json`:
producer id -> the manifest of each process that wrote some, paravt_jax/infra/reproducibility.py) and
`summary_all.json`. Paths may be gs://."""
from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Sequence

from paravt_jax.config import ConfigValueError
from paravt_jax.eval import provenance
from paravt_jax.infra import reproducibility, storage


def shard_path(output_dir: str, dataset: str, shard_id: int, num_shards: int) -> str:
    return storage.join(output_dir, f"{dataset}.shard-{shard_id:05d}-of-{num_shards:05d}.jsonl")


def read_records(paths: Sequence[str]) -> dict[int, dict]:
    """Finished samples by index; a torn last line (an interrupted write) is ignored."""
    out: dict[int, dict] = {}
    for path in paths:
        if not storage.isfile(path):
            continue
        for line in storage.read_bytes(path).splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            out[int(record["index"])] = record
    return out


def ends_with_newline(path: str) -> bool:
    data = storage.read_bytes(path)
    return not data or data.endswith(b"\n")  # empty: nothing torn


class ForeignRecords(ConfigValueError):
    """The output directory holds records another checkpoint or other settings produced."""


def shard_files(output_dir: str, name: str) -> list[str]:
    return [storage.join(output_dir, n) for n in storage.listdir(output_dir)
            if fnmatch.fnmatch(n, f"{name}.shard-*-of-*.jsonl")]


def claim_output(output_dir: str, name: str, key: dict, overwrite: bool, log: Callable[[str], None]) -> str:
    """Registers `key` as a producer of `name` records in output_dir and returns its id. Records
    (and a finished `<name>.json`) of any other producer are refused with the fields that
    differ, or with `overwrite` dropped (this producer's own records are kept either way, so
    shards of one evaluation never drop each other's work)."""
    me = provenance.producer_id(key)
    manifest_path = storage.join(output_dir, f"{name}.producers.json")
    try:
        known = json.loads(storage.read_bytes(manifest_path))
    except (OSError, ValueError):
        known = {}
    foreign: dict[str | None, int] = {}
    for path in shard_files(output_dir, name):
        for record in read_records([path]).values():
            if record.get("producer") != me:
                foreign[record.get("producer")] = foreign.get(record.get("producer"), 0) + 1
    finished = storage.join(output_dir, f"{name}.json")
    if storage.exists(finished):
        try:
            other = json.loads(storage.read_bytes(finished)).get("summary", {}).get("producer_id")
        except (OSError, ValueError):
            other = None
        if other != me:
            foreign.setdefault(other, 0)
    if foreign and not overwrite:
        count = sum(foreign.values())
        stored = next(iter(foreign))
        changes = provenance.differences(known.get(stored) if stored else None, key)
        raise ForeignRecords(f"{output_dir} holds {count} {name} record(s) of another evaluation ("
                             + "; ".join(changes[:8]) + ("; ..." if len(changes) > 8 else "")
                             + "): evaluate into another --output_dir, or pass --overwrite to drop them")
    if foreign:
        for path in shard_files(output_dir, name):
            kept = read_records([path])
            kept = {i: r for i, r in kept.items() if r.get("producer") == me}
            storage.write_atomic(path, "".join(json.dumps(kept[i], default=str) + "\n" for i in sorted(kept)))
        if storage.exists(finished):
            storage.remove(finished)
        log(f"[eval] {name}: --overwrite dropped {sum(foreign.values())} record(s) of another evaluation")
    if known.get(me) != json.loads(json.dumps(key, default=str)):
        storage.write_json_atomic(manifest_path, {**known, me: key})
    return me


def record_manifest(output_dir: str, name: str, producer_id: str, manifest: dict,
                    log: Callable[[str], None]) -> list[str]:
    """Adds `manifest` to the environments that wrote producer_id's `name` records; when records
    of that producer were written under another environment (a resume on another machine, commit
    or package set), logs the fields that differ and returns them."""
    path = storage.join(output_dir, f"{name}.manifests.json")
    try:
        known = json.loads(storage.read_bytes(path))
    except (OSError, ValueError):
        known = {}
    earlier = known.get(producer_id, [])
    if manifest in earlier:
        return []
    changes = reproducibility.differences(earlier[-1], manifest) if earlier else []
    if changes:
        log(f"[eval] {name}: resuming records written under another environment: " + "; ".join(changes[:8])
            + ("; ..." if len(changes) > 8 else ""))
    storage.write_json_atomic(path, {**known, producer_id: [*earlier, manifest]})
    return changes


def write_summary_all(output_dir: str, summaries: dict[str, dict]) -> str:
    path = storage.join(output_dir, "summary_all.json")
    previous = json.loads(storage.read_bytes(path)) if storage.isfile(path) else {}
    previous.update(summaries)
    storage.write_json_atomic(path, previous)
    return path
