"""Atomic JSON writes: the whole new file replaces the old one and no temporary file is left."""
import json
import os

from paravt_jax.files import write_json_atomic


def test_write_json_atomic_replaces_and_cleans_up(tmp_path):
    path = str(tmp_path / "summary.json")
    write_json_atomic(path, {"eval": [1, 2]})
    write_json_atomic(path, {"eval": [3], "where": tmp_path})  # a Path goes through str()
    with open(path) as f:
        assert json.load(f) == {"eval": [3], "where": str(tmp_path)}
    assert os.listdir(tmp_path) == ["summary.json"]
