"""What produced an evaluation record: the checkpoint's identity and the evaluation settings.

Every record the driver writes carries `producer`, a short id of that pair; the pair itself is
kept beside the records in `<dataset>.producers.json` (id -> pair). A rerun into the same
output directory resumes only the records its own pair produced, and refuses records of
another pair with the fields that differ (driver.ForeignRecords), so one directory never
mixes two checkpoints, prompt modes, frame counts or protocols.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from paravt_jax.config import ConfigValueError
from paravt_jax.infra.reproducibility import flatten

# Files of an HF checkpoint directory whose bytes decide the model's outputs.
WEIGHT_PATTERNS = ("*.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json")
UNKEYED = "unknown (written before records named their producer)"


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_identity(directory: str | None, preset: str, seed: int) -> dict[str, Any]:
    """The identity of a local HF checkpoint by its content: a hash of its weight, config and
    tokenizer files' names and bytes (WEIGHT_PATTERNS; about 10 s per 16 GB here), so a copy
    elsewhere is the same model and a rewrite with other weights is another, whatever the
    paths and modification times. Without a directory: the randomly initialised preset and its
    seed."""
    if not directory:
        return {"random_init": preset, "seed": int(seed)}
    directory = os.path.abspath(directory)
    files = sorted({p for pattern in WEIGHT_PATTERNS for p in glob.glob(os.path.join(directory, pattern))})
    if not files:
        raise ConfigValueError(f"model.checkpoint={directory!r}: no checkpoint files there "
                               f"({', '.join(WEIGHT_PATTERNS)})")
    listing = [(os.path.relpath(p, directory), file_sha256(p)) for p in files]
    return {"content": hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]}


def model_identity(run, default_dir: str | None) -> dict[str, Any]:
    """The checkpoint identity and numerics of the model a run builds (the typed config's
    `model`, as cli/assembly.py's build_model builds it): `model.checkpoint`, else the built-in
    checkpoint of a toy preset, else a random init."""
    from paravt_jax.data.builtin import BUILTIN_MODELS

    m = run.model
    random_init = m.init == "random"
    directory = None if random_init else m.checkpoint or (default_dir if m.preset in BUILTIN_MODELS else None)
    return {"checkpoint": checkpoint_identity(directory, m.preset, run.seed),
            "model": {"preset": m.preset, "param_dtype": m.param_dtype, "dtype": m.dtype}}


def producer(identity: Mapping[str, Any], driver_config) -> dict[str, Any]:
    """What keys a record: the model's identity (model_identity) and the evaluation settings."""
    return {**{k: dict(v) for k, v in identity.items()}, "settings": driver_config.record_settings()}


def producer_id(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def differences(stored: Mapping[str, Any] | None, mine: Mapping[str, Any]) -> list[str]:
    """`field: stored -> mine` for each differing field (one entry when `stored` is unknown)."""
    if stored is None:
        return [UNKEYED]
    a, b = flatten(stored), flatten(mine)
    return [f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}" for k in sorted(set(a) | set(b))
            if a.get(k, "<absent>") != b.get(k, "<absent>")]
