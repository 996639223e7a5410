import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from paravt_jax.data import synthetic as syn
from paravt_jax.video import read_frames
from paravt_jax.video.reader import sample_indices


def visible_fraction(k, duration=600.0, fps=4.0, n_videos=40):
    seen = total = 0
    for seed in range(n_videos):
        video = syn.make_video(seed, duration)
        times = sample_indices(0, int(duration * fps) - 1, k) / fps
        for e in video.events:
            total += 1
            seen += bool(((times >= e.start) & (times < e.end)).any())
    return seen / total


def test_frame_budget_decides_visibility():
    """The gating argument: with 4 overview frames most events are invisible, with 64 most
    are visible (10-minute videos, events of 2-5 s at one per 8 s slot)."""
    assert visible_fraction(4) < 0.1
    assert visible_fraction(64) > 0.3 > visible_fraction(16)
    assert visible_fraction(64, duration=120.0) > 0.9


def test_deterministic_and_answers_consistent():
    a, b = syn.make_video(5, 120.0), syn.make_video(5, 120.0)
    assert a == b and a != syn.make_video(6, 120.0)
    for e in a.events:
        assert 2.0 <= e.end - e.start <= 5.0 + 1e-6
    starts = [e.start for e in a.events]
    assert starts == sorted(starts)
    for e1, e2 in zip(a.events, a.events[1:]):
        assert e1.end <= e2.start
    q = syn.make_question(a, "tvg", 5)
    assert q.answer == f"[{q.target.start:.1f}, {q.target.end:.1f}]"
    mcq = syn.make_question(a, "mcq", 5)
    letter_line = [l for l in mcq.question.splitlines() if l.startswith(mcq.answer + ".")][0]
    assert letter_line.endswith(f"{mcq.target.color} {mcq.target.shape}")
    with pytest.raises(ValueError, match="question_type='xx'"):
        syn.make_question(a, "xx", 0)


def test_write_dataset_schemas_and_video_content(tmp_path):
    ds = syn.write_dataset(str(tmp_path), num_train=3, num_eval=1, durations=(30.0,), seed=1)
    rl = pq.read_table(ds.rl_train).to_pylist()
    assert len(rl) == 3 and len(pq.read_table(ds.rl_eval).to_pylist()) == 1
    row = rl[0]
    assert row["prompt"][0]["role"] == "user" and "<video>" in row["prompt"][0]["content"]
    info = json.loads(row["extra_info"])
    assert set(info) >= {"answer", "question_type"}
    path = os.path.join(str(tmp_path), row["videos"][0]["video"])
    q = ds.questions[0]
    e = q.target
    clip = read_frames(path, nframes=2, start=e.start + 0.3, end=e.end - 0.3)
    rgb = clip.frames[0, clip.frames.shape[1] // 2, clip.frames.shape[2] // 2].astype(int)
    assert np.abs(rgb - syn.COLORS[e.color]).max() < 40
    sft = pq.read_table(ds.sft).to_pylist()
    main = [json.loads(r["messages"]) for r in sft if r["kind"] == "main"]
    sub = [json.loads(r["messages"]) for r in sft if r["kind"] == "subagent"]
    assert len(main) == 3 and len(sub) >= 3
    first = main[0][2]["content"][0]["text"]
    assert first.count("<tool_call>") >= 2  # parallel calls in one turn
    assert main[0][-1]["content"][0]["text"].endswith(f"<answer>{q.answer}</answer>")
    assert sub[0][0]["content"][0]["type"] == "video_url" and "Summary:" in sub[0][0]["content"][1]["text"]
    with pytest.raises(ValueError, match="outside"):
        syn.write_dataset(str(tmp_path), durations=(5.0,))



SMALL = dict(num_train=1, num_eval=1, durations=(16.0,))


def _ensure_small(root: str, started) -> None:
    from paravt_jax.data.builtin import ensure_builtin

    started.set()
    ensure_builtin(root, **SMALL)


def test_builtin_set_waits_for_the_process_generating_it(tmp_path):
    """A sweep's arms or a benchmark's two arms start at once on a fresh machine: one writes
    the set while the others wait on its lock, then find it READY (two writers raced on the
    same temporary video files before)."""
    import fcntl
    import multiprocessing
    import shutil
    import time

    from paravt_jax.data.builtin import ensure_builtin

    assets = ensure_builtin(str(tmp_path), **SMALL)
    # as if another process were still writing it: no READY stamp, no data yet
    os.remove(os.path.join(assets.root, "READY"))
    shutil.rmtree(assets.data_dir)
    context = multiprocessing.get_context("spawn")
    started = context.Event()
    with open(assets.root + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        worker = context.Process(target=_ensure_small, args=(str(tmp_path), started))
        worker.start()
        assert started.wait(timeout=60)
        time.sleep(3)
        assert worker.is_alive() and not os.path.exists(assets.data_dir), \
            "ensure_builtin wrote the set while another process held its lock"
    worker.join(timeout=300)
    assert worker.exitcode == 0
    assert os.path.exists(os.path.join(assets.root, "READY"))
