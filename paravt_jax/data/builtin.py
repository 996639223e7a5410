"""The built-in default: a tiny Qwen3-VL, a BPE tokenizer trained on the synthetic corpus and
the synthetic dataset, generated locally (no downloads) and cached under one directory."""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os

from absl import logging

VERSION = 1


@dataclasses.dataclass(frozen=True)
class BuiltinAssets:
    root: str
    model_dir: str  # config.json, model.safetensors, tokenizer.json
    data_dir: str


TASKS = ("shapes", "events")  # data/synthetic.py (the default) | data/events.py (the toy task)
BUILTIN_MODELS = ("tiny", "toy")  # model presets the built-in tokenizer's vocabulary fits


def ensure_builtin(root: str = "artifacts/builtin", seed: int = 0, num_train: int = 12,
                   num_eval: int = 4, durations: tuple[float, ...] = (30.0, 60.0, 120.0),
                   task: str = "shapes", model_preset: str = "tiny",
                   sft_modes: tuple[str, ...] = ("frames",)) -> BuiltinAssets:
    """The built-in assets under root/<hash of the arguments>, generated once. task "events"
    uses the first of `durations` for every video and writes SFT trajectories in `sft_modes`
    (data/events.py)."""
    if task not in TASKS:
        raise ValueError(f"data.task {task!r}: expected one of {TASKS}")
    if model_preset not in BUILTIN_MODELS:
        raise ValueError(f"built-in model preset {model_preset!r}: expected one of {BUILTIN_MODELS}")
    spec = dict(version=VERSION, seed=seed, num_train=num_train, num_eval=num_eval,
                durations=list(durations))
    if task != "shapes" or model_preset != "tiny":  # the default set keeps its cache key
        spec.update(task=task, model_preset=model_preset)
    if task == "events":
        from paravt_jax.data.events import VERSION as EVENTS_VERSION

        spec.update(sft_modes=list(sft_modes), events_version=EVENTS_VERSION)
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    root = os.path.abspath(os.path.join(root, key))
    assets = BuiltinAssets(root, os.path.join(root, "model"), os.path.join(root, "data"))
    stamp = os.path.join(root, "READY")
    if os.path.exists(stamp):
        return assets
    os.makedirs(os.path.dirname(root), exist_ok=True)
    # processes started together (a sweep's arms, a benchmark's) generate the set once: the
    # first holds the lock while it writes, the others wait and then find READY
    with open(root + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(stamp):
            _generate(assets, spec, task, num_train, num_eval, durations, seed, model_preset, sft_modes)
    return assets


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
    with open(stamp, "w") as f:
        json.dump(spec, f)
    logging.info(f"[data] built-in set ready: {assets.data_dir}")
