"""The built-in default: a tiny Qwen3-VL, a BPE tokenizer trained on the synthetic corpus and
the synthetic dataset, generated locally (no downloads) and cached under one directory."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os

VERSION = 1


@dataclasses.dataclass(frozen=True)
class BuiltinAssets:
    root: str
    model_dir: str  # config.json, model.safetensors, tokenizer.json
    data_dir: str


def ensure_builtin(root: str = "artifacts/builtin", seed: int = 0, num_train: int = 12,
                   num_eval: int = 4, durations: tuple[float, ...] = (30.0, 60.0, 120.0)) -> BuiltinAssets:
    from paravt_jax.data.synthetic import corpus, write_dataset
    from paravt_jax.models.qwen3_vl import init_model, preset, save_pretrained
    from paravt_jax.text.inputs import check_against_model
    from paravt_jax.text.tokenizer import Tokenizer, train_tokenizer

    spec = dict(version=VERSION, seed=seed, num_train=num_train, num_eval=num_eval,
                durations=list(durations))
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    root = os.path.abspath(os.path.join(root, key))
    assets = BuiltinAssets(root, os.path.join(root, "model"), os.path.join(root, "data"))
    stamp = os.path.join(root, "READY")
    if os.path.exists(stamp):
        return assets
    print(f"[data] generating the built-in synthetic set once ({num_train} + {num_eval} videos, tokenizer, "
          f"tiny model) in {root}", flush=True)
    dataset = write_dataset(assets.data_dir, num_train, num_eval, durations, seed)
    tokenizer = train_tokenizer(corpus(list(dataset.questions) + list(dataset.eval_questions)))
    tokenizer.save(assets.model_dir)
    tokenizer = Tokenizer.from_directory(assets.model_dir)
    model = init_model(preset("tiny"), seed=seed)
    check_against_model(tokenizer, model.config)
    save_pretrained(model, assets.model_dir)
    with open(stamp, "w") as f:
        json.dump(spec, f)
    print(f"[data] built-in set ready: {assets.data_dir}", flush=True)
    return assets
