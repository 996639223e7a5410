"""nFrames gating: uniform per-prompt K, constant for a prompt, stable across processes."""
import collections
import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from paravt_jax.data.gating import NFRAMES_CHOICES, nframes_for_prompt


def test_choices():
    assert NFRAMES_CHOICES == (4, 8, 16, 32, 64)


def test_same_key_same_k_and_in_choices():
    for i in range(50):
        key = f"videos/clip_{i}.mp4"
        ks = {nframes_for_prompt(key, seed=1, enabled=True) for _ in range(8)}  # G = 8 samples
        assert len(ks) == 1 and ks.pop() in NFRAMES_CHOICES


def test_disabled_gives_default():
    assert nframes_for_prompt("a", 0, enabled=False) == 64
    assert nframes_for_prompt("a", 0, enabled=False, default=32) == 32


def test_reproducible_across_processes():
    keys = [f"k{i}" for i in range(20)]
    here = [nframes_for_prompt(k, 7, True) for k in keys]
    code = ("from paravt_jax.data.gating import nframes_for_prompt as f;"
            f"print([f(k, 7, True) for k in {keys!r}])")
    # a different PYTHONHASHSEED would change Python's hash(): ours must not care
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "12345", "PATH": ""}).stdout
    assert eval(out) == here


def test_pinned_values():
    # sha256-based assignment is part of the contract (checkpoints/logs refer to it)
    got = [nframes_for_prompt(f"video_{i}.mp4", 0, True) for i in range(10)]
    assert got == [4, 4, 8, 8, 8, 4, 16, 32, 8, 32]


def test_roughly_uniform():
    n = 5000
    counts = collections.Counter(nframes_for_prompt(f"prompt-{i}", 3, True) for i in range(n))
    assert set(counts) == set(NFRAMES_CHOICES)
    expected = n / len(NFRAMES_CHOICES)
    chi2 = sum((counts[k] - expected) ** 2 / expected for k in NFRAMES_CHOICES)
    assert chi2 < 18.47  # 4 degrees of freedom, p = 0.001


def test_seed_changes_assignment():
    keys = [f"prompt-{i}" for i in range(200)]
    a = np.array([nframes_for_prompt(k, 0, True) for k in keys])
    b = np.array([nframes_for_prompt(k, 1, True) for k in keys])
    assert (a != b).mean() > 0.6  # independent draws differ 80% of the time


def test_custom_choices_and_keys():
    assert nframes_for_prompt("a", 0, True, choices=(16,)) == 16
    with pytest.raises(ValueError):
        nframes_for_prompt("a", 0, True, choices=())
    assert nframes_for_prompt("\ud800 lone surrogate", 0, True) in NFRAMES_CHOICES



def test_rl_episodes_draw_one_k_per_video():
    """The trainer keys K on the row's video (the reference's key): every question on a video
    sees the same overview; over videos, K is uniform over the choices; gating off samples the
    overview by fps (K = 0, rollout.prompt.overview_fps / overview_max_frames)."""
    from paravt_jax.data.paravt_parquet import RLRow
    from paravt_jax.rl.trainer import RLConfig, episode

    config = RLConfig(seed=3)
    rows = [RLRow(i, f"question {q} on video {v}?", f"/data/videos/v{v}.mp4", "A", "mcq", {})
            for i, (v, q) in enumerate((v, q) for v in range(2000) for q in range(3))]
    ks = [episode(r, config).nframes for r in rows]
    per_video = [set(ks[3 * v:3 * v + 3]) for v in range(2000)]
    assert all(len(k) == 1 for k in per_video)
    counts = collections.Counter(k.pop() for k in per_video)
    assert set(counts) == set(NFRAMES_CHOICES) and all(340 <= c <= 460 for c in counts.values()), counts
    assert ks[0] == nframes_for_prompt("/data/videos/v0.mp4", 3, True)
    # the table's path is the key when the loader kept it: the draw ignores where the data lives
    moved = [dataclasses.replace(r, video_path="/elsewhere" + r.video_path, video_key=f"videos/v{i // 3}.mp4")
             for i, r in enumerate(rows[:300])]
    ks_moved = [episode(r, config).nframes for r in moved]
    assert ks_moved == [nframes_for_prompt(f"videos/v{i // 3}.mp4", 3, True) for i in range(300)]
    assert ks_moved == [episode(dataclasses.replace(r, video_path="/x.mp4"), config).nframes for r in moved]
    off = RLConfig(seed=3, nframes_gating=False)
    assert {episode(r, off).nframes for r in rows[:30]} == {0}


def test_tool_free_prompts_take_their_share_independently_of_k():
    from paravt_jax.data.gating import nframes_for_prompt, tool_free_prompt

    keys = [f"videos/v{i}.mp4" for i in range(4000)]
    free = [tool_free_prompt(k, 0, 0.25) for k in keys]
    assert abs(sum(free) / len(keys) - 0.25) < 0.03
    assert free == [tool_free_prompt(k, 0, 0.25) for k in keys]  # stable
    assert free != [tool_free_prompt(k, 1, 0.25) for k in keys]  # seeded
    assert not any(tool_free_prompt(k, 0, 0.0) for k in keys) and all(tool_free_prompt(k, 0, 1.0) for k in keys)
    ks = np.array([nframes_for_prompt(k, 0, True, choices=(4, 64)) for k in keys])
    assert abs((ks[np.array(free)] == 64).mean() - 0.5) < 0.06  # not the K draw's
    with pytest.raises(ValueError, match="tool_free_share"):
        tool_free_prompt("v.mp4", 0, 1.5)


def test_rl_episodes_draw_tool_free_per_row_and_step():
    from paravt_jax.data.paravt_parquet import RLRow
    from paravt_jax.rl.trainer import RLConfig, episode

    rows = [RLRow(i, "q?", f"v{i}.mp4", "A", "mcq", {}) for i in range(200)]
    config = RLConfig(tool_free_share=0.5)
    first = [episode(r, config, 0).tools for r in rows]
    assert 60 < sum(first) < 140 and first != [episode(r, config, 1).tools for r in rows]
    assert all(episode(r, RLConfig(), 3).tools for r in rows)  # the reference: always offered
