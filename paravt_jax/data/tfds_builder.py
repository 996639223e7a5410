"""TensorFlow-Datasets builders for the reference RL and SFT rows, written as ArrayRecord
(no TensorFlow needed), read with `tfds.data_source` and iterated with grain: deterministic
shuffling, per-process sharding and a checkpointable iterator state.

    build("rl", {"train": "rl_train.parquet", "eval": "rl_eval.parquet"}, data_dir, video_root)
    source = data_source("rl", data_dir)["train"]
    loader = grain_loader(source, seed=0, shard_index=jax.process_index(), shard_count=jax.process_count())
"""
from __future__ import annotations

import json

import numpy as np
import tensorflow_datasets as tfds

from paravt_jax.data.paravt_parquet import RLRow, load_rl_rows, load_sft_rows

NAMES = {"rl": "paravt_rl", "sft": "paravt_sft"}


def _features(kind: str):
    text = tfds.features.Text()
    if kind == "rl":
        return tfds.features.FeaturesDict({
            "index": tfds.features.Scalar(dtype=np.int64), "question": text, "answer": text,
            "question_type": text, "video": text, "video_key": text, "extra": text})
    return tfds.features.FeaturesDict({"index": tfds.features.Scalar(dtype=np.int64), "messages": text})


def _builder_class(kind: str, sources: dict[str, str], video_root: str):
    if kind not in NAMES:
        raise ValueError(f"dataset kind {kind!r}: expected one of {sorted(NAMES)}")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=_features(kind),
                                     description=f"ParaVT {kind} rows (reference parquet schema)")

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(path) for split, path in sources.items()}

    def _generate_examples(self, path):
        if kind == "rl":
            rows, _ = load_rl_rows(path, video_root)
            for r in rows:
                yield r.index, {"index": r.index, "question": r.question, "answer": r.answer,
                                "question_type": r.question_type, "video": r.video_path,
                                "video_key": r.video_key, "extra": json.dumps(r.extra)}
        else:
            rows, _ = load_sft_rows(path, video_root)
            for i, messages in enumerate(rows):
                yield i, {"index": i, "messages": json.dumps(messages)}

    name = "ParavtRl" if kind == "rl" else "ParavtSft"
    return type(name, (tfds.core.GeneratorBasedBuilder,), {
        "VERSION": tfds.core.Version("1.0.0"), "_info": _info,
        "_split_generators": _split_generators, "_generate_examples": _generate_examples,
        "__module__": __name__})


def build(kind: str, sources: dict[str, str], data_dir: str, video_root: str) -> dict:
    """Prepares the ArrayRecord dataset (once; re-running reuses it) and returns its sources."""
    builder = _builder_class(kind, sources, video_root)(data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare()
    return builder.as_data_source()


def data_source(kind: str, data_dir: str) -> dict:
    return tfds.data_source(NAMES[kind], data_dir=data_dir)


def grain_loader(source, *, seed: int, shuffle: bool = True, num_epochs: int | None = None,
                 shard_index: int = 0, shard_count: int = 1):
    """A grain DataLoader: seeded shuffling, this process's shard; `iter(loader)` has
    `get_state()` / `set_state()` for checkpoints."""
    import grain.python as grain

    sampler = grain.IndexSampler(len(source), shard_options=grain.ShardOptions(shard_index, shard_count,
                                                                               drop_remainder=False),
                                 shuffle=shuffle, seed=seed, num_epochs=num_epochs)
    return grain.DataLoader(data_source=source, sampler=sampler, worker_count=0)


def rl_row(example: dict) -> RLRow:
    text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
    return RLRow(int(example["index"]), text(example["question"]), text(example["video"]),
                 text(example["answer"]), text(example["question_type"]), json.loads(text(example["extra"])),
                 video_key=text(example.get("video_key", b"")))  # a table built without it: the path
