import os
import threading

import numpy as np
import pytest

from paravt_jax.data.synthetic import COLORS, Event, write_video
from paravt_jax.run_config import build_run
from paravt_jax.video import VideoError, read_frames, smart_resize, video_metadata

FPS = 4.0
EVENTS = [Event(5.0, 9.0, "red", "square"), Event(20.0, 23.0, "blue", "circle")]


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("videos") / "v.mp4")
    return write_video(path, 30.0, EVENTS, fps=FPS, height=360, width=640, seed=3)


def centre(frames):
    return frames[:, frames.shape[1] // 2, frames.shape[2] // 2].astype(int)


def expected_colour(t):
    for e in EVENTS:
        if e.start <= t < e.end:
            return COLORS[e.color]
    return None


def test_metadata(video):
    meta = video_metadata(video)
    assert meta.num_frames == 120 and meta.fps == pytest.approx(FPS) and meta.duration == pytest.approx(30)
    assert (meta.height, meta.width) == (360, 640)


def test_uniform_frames_colours_and_timestamps(video):
    clip = read_frames(video, nframes=16)
    assert clip.frames.dtype == np.uint8 and clip.frames.shape[0] == 16
    np.testing.assert_allclose(clip.timestamps, np.round(np.linspace(0, 119, 16)) / FPS)
    for t, rgb in zip(clip.timestamps, centre(clip.frames)):
        want = expected_colour(t)
        if want is not None:
            assert np.abs(rgb - want).max() < 40, (t, rgb, want)
        else:
            assert rgb.max() < 130, (t, rgb)


def test_one_fps_window(video):
    clip = read_frames(video, fps=1, start=5.0, end=9.0, min_frames=1, max_frames=16)
    assert len(clip.frames) == 4
    assert clip.timestamps.min() >= 5.0 and clip.timestamps.max() <= 9.0
    for rgb in centre(clip.frames)[:-1]:
        assert np.abs(rgb - COLORS["red"]).max() < 40
    long = read_frames(video, fps=1, start=0, end=30, min_frames=1, max_frames=16)
    assert len(long.frames) == 16  # capped at max_frames


def test_clamping(video):
    clip = read_frames(video, nframes=4, start=-3, end=100)
    assert clip.timestamps[0] == 0 and clip.timestamps[-1] == pytest.approx(119 / FPS)
    assert len(read_frames(video, nframes=100, start=20, end=21).frames) == 5  # only 5 frames exist


def test_pixel_budgets(video):
    clip = read_frames(video, nframes=2, max_pixels=50176)
    h, w = clip.frames.shape[1:3]
    assert h * w <= 50176 and h % 32 == 0 and w % 32 == 0 and (h, w) == smart_resize(360, 640, 32, 784, 50176)
    big = read_frames(video, nframes=2, min_pixels=640 * 640, max_pixels=2000 * 2000)
    assert big.frames.shape[1] * big.frames.shape[2] >= 640 * 640


def test_smart_resize_reference_numbers():
    lo, hi = 65536, 16777216
    tokens = lambda h, w: (lambda r: (r[0] // 32) * (r[1] // 32))(smart_resize(h, w, 32, lo, hi))
    assert tokens(224, 224) == 64 and tokens(480, 640) == 300 and tokens(1080, 1920) == 2040
    assert smart_resize(100, 150, 32, lo, hi) == (224, 320) and tokens(32, 4000) == 125
    assert smart_resize(720, 1024, 32, 0, 10**9)[0] == 704  # 22.5 rounds half to even -> 22
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 4000)


def test_errors_name_the_path(tmp_path, video):
    with pytest.raises(VideoError, match="missing.mp4: file not found"):
        read_frames(str(tmp_path / "missing.mp4"), nframes=2)
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(VideoError, match="empty.mp4: empty file"):
        read_frames(str(tmp_path / "empty.mp4"), nframes=2)
    (tmp_path / "text.mp4").write_text("this is not a video\n" * 100)
    with pytest.raises(VideoError, match="text.mp4: not a readable video"):
        read_frames(str(tmp_path / "text.mp4"), nframes=2)
    data = open(video, "rb").read()
    (tmp_path / "truncated.mp4").write_bytes(data[: len(data) // 3])
    with pytest.raises(VideoError, match="truncated.mp4"):
        read_frames(str(tmp_path / "truncated.mp4"), nframes=8)
    with pytest.raises(ValueError, match="start=9.0 must be < end=5.0"):
        read_frames(video, nframes=2, start=9.0, end=5.0)
    with pytest.raises(ValueError, match="start=31 s is beyond the video duration 30.000"):
        read_frames(video, nframes=2, start=31, end=40)
    with pytest.raises(VideoError, match="is a directory"):
        read_frames(str(tmp_path), nframes=2)


def test_concurrent_reads_match_sequential(video):
    windows = [(float(s), float(s) + 4.0) for s in range(0, 24, 3)]
    sequential = [read_frames(video, fps=1, start=s, end=e, min_frames=1, max_frames=16) for s, e in windows]
    results = [None] * len(windows)

    def work(i):
        s, e = windows[i]
        results[i] = read_frames(video, fps=1, start=s, end=e, min_frames=1, max_frames=16)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(windows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(sequential, results):
        np.testing.assert_array_equal(a.frames, b.frames)
        np.testing.assert_array_equal(a.timestamps, b.timestamps)
    assert os.path.getsize(video) > 0


@pytest.mark.parametrize("start", [29.76, 29.8, 29.99])
def test_a_crop_starting_in_the_last_frame_interval_reads_the_final_frame(video, start):
    clip = read_frames(video, fps=1, start=start, end=30.0, min_frames=1, max_frames=4)
    assert clip.indices.tolist() == [119] and clip.frames.shape[0] == 1


@pytest.mark.parametrize("source,first,final,tokens", [((480, 854), (140, 280), (192, 384), 72),
                                                       ((720, 1280), (168, 280), (224, 352), 77)])
def test_two_stage_sizing_is_the_reference_rl_frames(source, first, final, tokens):
    """The reference's RL frames: qwen-vl-utils (factor 28, [784, 50,176] pixels), then the
    Qwen3-VL processor (factor 32, >= 65,536 pixels): 72 and 77 merged tokens where one resize
    to <= 50,176 pixels gives 45."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as processor_resize

    from paravt_jax.video.frames import frame_sizes, llm_tokens

    sizes = frame_sizes(*source, 784, 50176, "two_stage")
    assert sizes == [first, final]
    assert sizes[1] == processor_resize(*first, factor=32, min_pixels=65536, max_pixels=16777216)
    assert llm_tokens((1, final[0] // 16, final[1] // 16)) == tokens
    (single,) = frame_sizes(*source, 784, 50176, "single")
    assert llm_tokens((1, single[0] // 16, single[1] // 16)) == 45
    with pytest.raises(ValueError, match="frame sizing 'twice'"):
        frame_sizes(*source, 784, 50176, "twice")


def test_read_frames_resizes_through_both_stages(tmp_path):
    from paravt_jax.video.reader import blank_clip

    path = write_video(str(tmp_path / "wide.mp4"), 2.0, [], fps=2.0, height=480, width=854, seed=0)
    clip = read_frames(path, nframes=2, max_pixels=50176, sizing="two_stage")
    assert clip.frames.shape[1:3] == (192, 384)
    assert blank_clip(video_metadata(path), nframes=2, max_pixels=50176, sizing="two_stage").frames.shape[1:3] == (
        192, 384)
    assert read_frames(path, nframes=2, max_pixels=50176).frames.shape[1:3] == (160, 288)  # single


def test_the_8b_recipe_sizes_frames_and_runs_sft_as_the_reference():
    from paravt_jax.configs import paragrpo

    sft = build_run(paragrpo.get_config("qwen3vl_8b")).sft  # the released cold-start SFT script
    assert (sft.steps, sft.optimizer.learning_rate, sft.optimizer.schedule) == (1500, 2e-5, "cosine")
    assert (sft.optimizer.warmup_steps, sft.optimizer.total_steps) == (75, 1500)

    rl = build_run(paragrpo.get_config("qwen3vl_8b")).rl
    assert (rl.rollout.prompt.overview_sizing, rl.dispatch.sizing) == ("two_stage", "two_stage")
    assert (rl.rollout.prompt.overview_max_pixels, rl.dispatch.max_pixels) == (50176, 50176)
    tiny = build_run(paragrpo.get_config("tiny")).rl
    assert (tiny.rollout.prompt.overview_sizing, tiny.dispatch.sizing) == ("single", "single")
