"""The built-in default: a tiny Qwen3-VL, a BPE tokenizer trained on the synthetic corpus and
the synthetic dataset, generated locally (no downloads) and cached under one directory.

The directory is named by the generator's arguments and the generator itself (VERSION and a hash
of the source files that write the set, GENERATOR_SOURCES), so a set written by older code is
never found by newer code: it is generated anew beside it. When written, the set's content hash
(every file's path and bytes) goes into its READY stamp; every later use hashes the files again
(about 0.2 s for the toy set) and refuses a set whose files changed since (BuiltinDataError).
The content hash is the data's identity in a run's manifest (paravt_jax/infra/reproducibility.py)."""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os

from absl import logging

VERSION = 2  # 2: directories keyed by the generator's source, READY holds the content hash
# The modules whose code decides the set's bytes (relative to the package): the writers, the
# chat text of the SFT trajectories, the tokenizer trainer and the model's initialisation.
GENERATOR_SOURCES = ("data/builtin.py", "data/events.py", "data/synthetic.py", "text/chat.py",
                     "text/tokenizer.py", "models/qwen3_vl")
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BuiltinDataError(RuntimeError):
    """A built-in set on disk whose files no longer match the content hash it was written with."""


@dataclasses.dataclass(frozen=True)
class BuiltinAssets:
    root: str
    model_dir: str  # config.json, model.safetensors, tokenizer.json
    data_dir: str
    content: str = ""  # sha256 of every file's path and bytes (content_hash)
    generator: str = ""  # the generator's source hash (generator_hash)

    def identity(self) -> dict:
        """The set's identity in a run's manifest."""
        return {"builtin": os.path.basename(self.root), "content": self.content, "generator": self.generator}


def _source_files(package: str = PACKAGE) -> list[str]:
    files = []
    for name in GENERATOR_SOURCES:
        path = os.path.join(package, name)
        if os.path.isdir(path):
            files += sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".py"))
        else:
            files.append(path)
    return files


def generator_hash(package: str = PACKAGE) -> str:
    """sha256 (16 hex digits) of the generator's source files (GENERATOR_SOURCES)."""
    digest = hashlib.sha256()
    for path in _source_files(package):
        digest.update(os.path.relpath(path, package).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def content_hash(root: str) -> str:
    """sha256 of every file under root (its relative path and bytes, in sorted order), the
    READY stamp and lock files aside."""
    digest = hashlib.sha256()
    for directory, subdirectories, files in os.walk(root):
        subdirectories.sort()
        for name in sorted(files):
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if relative in ("READY", "READY.tmp") or name.endswith(".lock"):
                continue
            digest.update(relative.encode() + b"\0")
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


TASKS = ("shapes", "events")  # data/synthetic.py (the default) | data/events.py (the toy task)
BUILTIN_MODELS = ("tiny", "toy")  # model presets the built-in tokenizer's vocabulary fits


def ensure_builtin(root: str = "artifacts/builtin", seed: int = 0, num_train: int = 12,
                   num_eval: int = 4, durations: tuple[float, ...] = (30.0, 60.0, 120.0),
                   task: str = "shapes", model_preset: str = "tiny",
                   sft_modes: tuple[str, ...] = ("frames",)) -> BuiltinAssets:
    """The built-in assets under root/<hash of the arguments and the generator>, generated once
    and checked against their content hash at every use. task "events" uses the first of
    `durations` for every video and writes SFT trajectories in `sft_modes` (data/events.py)."""
    if task not in TASKS:
        raise ValueError(f"data.task {task!r}: expected one of {TASKS}")
    if model_preset not in BUILTIN_MODELS:
        raise ValueError(f"built-in model preset {model_preset!r}: expected one of {BUILTIN_MODELS}")
    spec = dict(version=VERSION, generator=generator_hash(), seed=seed, num_train=num_train, num_eval=num_eval,
                durations=list(durations), task=task, model_preset=model_preset)
    if task == "events":
        from paravt_jax.data.events import VERSION as EVENTS_VERSION

        spec.update(sft_modes=list(sft_modes), events_version=EVENTS_VERSION)
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    root = os.path.abspath(os.path.join(root, key))
    assets = BuiltinAssets(root, os.path.join(root, "model"), os.path.join(root, "data"))
    stamp = os.path.join(root, "READY")
    if not os.path.exists(stamp):
        os.makedirs(os.path.dirname(root), exist_ok=True)
        # processes started together (a sweep's arms, a benchmark's) generate the set once: the
        # first holds the lock while it writes, the others wait and then find READY
        with open(root + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(stamp):
                _generate(assets, spec, task, num_train, num_eval, durations, seed, model_preset, sft_modes)
    return verified(assets, stamp)


def verified(assets: BuiltinAssets, stamp: str) -> BuiltinAssets:
    """assets with their content and generator hashes, once the files are checked against the
    READY stamp's content hash."""
    try:
        with open(stamp) as f:
            written = json.load(f)
        expected = written["content"]
    except (OSError, ValueError, KeyError, TypeError):
        raise BuiltinDataError(f"{stamp}: not a readable stamp with the set's content hash; delete "
                               f"{assets.root} to generate the built-in set again") from None
    actual = content_hash(assets.root)
    if actual != expected:
        raise BuiltinDataError(f"the built-in set {assets.root} changed since it was written (content "
                               f"{actual[:16]}, written as {expected[:16]}); delete the directory to "
                               f"generate it again")
    return dataclasses.replace(assets, content=actual, generator=written["spec"]["generator"])


def _generate(assets: BuiltinAssets, spec: dict, task: str, num_train: int, num_eval: int,
              durations: tuple[float, ...], seed: int, model_preset: str, sft_modes: tuple[str, ...]) -> None:
    from paravt_jax.models.qwen3_vl import init_model, preset, save_pretrained
    from paravt_jax.text.inputs import check_against_model
    from paravt_jax.text.tokenizer import Tokenizer, train_tokenizer

    root, stamp = assets.root, os.path.join(assets.root, "READY")
    logging.info(f"[data] generating the built-in {task} set once ({num_train} + {num_eval} videos, tokenizer, "
                 f"{model_preset} model) in {root}")
    if task == "events":
        from paravt_jax.data.events import corpus, write_events_dataset

        dataset = write_events_dataset(assets.data_dir, num_train, num_eval, seed, duration=durations[0],
                                       sft_modes=tuple(sft_modes))
    else:
        from paravt_jax.data.synthetic import corpus, write_dataset

        dataset = write_dataset(assets.data_dir, num_train, num_eval, durations, seed)
    # the events task's tokenizer merges everything but digit runs, newlines and the answer's
    # capitalised colours (text/tokenizer.py): the system prompt and the tool-call JSON cost a
    # few tokens, a copied number one, and the answer's colour is a token of its own
    split = dict(split="words")
    if task == "events":
        from paravt_jax.data.events import ANSWER_WORDS

        split = dict(split="digits", apart=ANSWER_WORDS)
    tokenizer = train_tokenizer(corpus(list(dataset.questions) + list(dataset.eval_questions)), **split)
    tokenizer.save(assets.model_dir)
    tokenizer = Tokenizer.from_directory(assets.model_dir)
    model = init_model(preset(model_preset), seed=seed)
    check_against_model(tokenizer, model.config)
    save_pretrained(model, assets.model_dir)
    content = content_hash(root)
    with open(stamp + ".tmp", "w") as f:
        json.dump({"spec": spec, "content": content}, f)
    os.replace(stamp + ".tmp", stamp)
    logging.info(f"[data] built-in set ready: {assets.data_dir}")
