"""The compile counter, the loop's per-step compile metrics and warning, and the shape
policy's pieces: frame padding to a floor, a fixed pack width, fixed prompt-prefill sizes."""
import json

import jax
import numpy as np

from paravt_jax.models.qwen3_vl.vision import pad_frames_to_buckets
from paravt_jax.text.inputs import encode_ids
from paravt_jax.train import compiles
from paravt_jax.train.batch import pack
from paravt_jax.train.loop import LoopConfig, run_loop


def test_counter_counts_new_shapes_only():
    f = jax.jit(lambda x: x * 3 + 1)
    before = compiles.snapshot()
    f(np.ones(7, np.float32))  # numpy inputs: no eager jnp operation compiles on the way
    first = before.since()
    assert first.count == 1 and first.seconds > 0 and any("lambda" in n for n in first.names)
    again = compiles.snapshot()
    f(np.full(7, 2, np.float32))
    assert again.since().count == 0
    f(np.ones(9, np.float32))  # a new shape is a new program
    assert again.since().count == 1
    assert "1 programs in" in again.since().summary()
    assert compiles.total().count >= 2


def test_loop_logs_compiles_and_warns_after_warmup(tmp_path, capsys):
    f = jax.jit(lambda x: x + 1)
    shapes = [4, 4, 4, 5, 5]  # step 3 brings a new shape after the two warm-up steps

    def step(state, index):
        return {"x": state["x"] + np.asarray(f(np.ones(shapes[index], np.float32)))[:2]}, {"loss": 0.0}

    run_loop("t", str(tmp_path), {"x": np.zeros(2, np.float32)}, step, LoopConfig(len(shapes), async_checkpoints=False))
    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    counts = [line["t/compiles"] for line in lines]
    assert counts[0] >= 1 and counts[1:3] == [0, 0] and counts[3] >= 1 and counts[4] == 0
    assert lines[-1]["t/compiles_total"] >= sum(counts)
    assert all("t/compile_s" in line for line in lines)
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("W")]
    assert len(warned) == 1 and "[t] step 3 compiled" in warned[0], warned  # not step 0's, nor a warm-up step's


def test_pad_frames_floor():
    grid = np.array([[3, 4, 6], [2, 4, 6], [1, 8, 8]])
    pixels = np.ones((3 * 24 + 2 * 24 + 64, 5), np.float32)
    padded, g = pad_frames_to_buckets(pixels, grid)  # 5 frames of 4x6 -> 8, 1 of 8x8 stays
    assert sorted(map(tuple, g[3:].tolist())) == [(1, 4, 6)] * 3
    padded, g = pad_frames_to_buckets(pixels, grid, min_frames=16)  # both sizes padded to 16 frames
    sizes = {}
    for t, h, w in g:
        sizes[(h, w)] = sizes.get((h, w), 0) + t
    assert sizes == {(4, 6): 16, (8, 8): 16}
    assert padded.shape[0] == 16 * 24 + 16 * 64 and not padded[len(pixels):].any()


def test_pack_fixed_width():
    seqs = [encode_ids(list(range(1, n + 1)), 0, trainable=True) for n in (40, 300)]
    assert pack(seqs).input_ids.shape == (2, 512)
    assert pack(seqs, width=1024).input_ids.shape == (2, 1024)
    assert pack(seqs, width=128).input_ids.shape == (2, 512)  # the longest does not fit: its own bucket
