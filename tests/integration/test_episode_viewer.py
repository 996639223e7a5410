"""`paravt-jax view`: pages for logged RL steps and evaluation episodes, thumbnails decoded from
the row's video, and the pages checked in a real headless Chromium (skipped, with the reason,
where none is installed; CI installs one)."""
import os
import re
import shutil

import pytest

from conftest import in_ci
from paravt_jax import cli
from paravt_jax.episodes import episode_log as L
from paravt_jax.experiments import view
from support.chromium import Chromium, find_browser
from unit.test_episode_log import scripted_step


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A main-job-like workdir: two logged RL steps of scripted episodes (parallel calls, a
    refused call, a malformed block), the held-out evaluation log and a curves.png."""
    root = tmp_path_factory.mktemp("run")
    episodes = str(root / "rl" / "episodes")
    for step in (0, 1):
        rows, rollouts, _, _ = scripted_step(episodes, step=step)
    setting = {"tools": True, "nframes": 4}
    L.write_eval_episodes(str(root / "eval" / "episodes.jsonl"), "final", L.eval_records(rollouts[:2], rows, **setting),
                          setting)
    from PIL import Image

    Image.new("RGB", (40, 20), "white").save(root / "curves.png")
    return str(root)


def require_browser() -> str:
    """The Chromium to drive: skipped with the reason where none is installed, a failure in CI
    (.ci/run installs one)."""
    path = find_browser()
    if path is None:
        reason = "no Chromium installed (apt-get install chromium; set PARAVT_CHROMIUM to use another)"
        if in_ci():
            pytest.fail(f"the browser test must run under CI: {reason}")
        pytest.skip(reason)
    return path


def expected_thumbnails(records) -> int:
    return sum(len(r["overview_times"]) + sum(len(c["frame_times"]) for t in r["turns"] for c in t["calls"])
               for r in records)


def test_view_writes_a_page_per_step_the_evaluation_and_an_index(workdir, tmp_path):
    out = str(tmp_path / "view")
    assert cli.main(["paravt-jax", "view", workdir, f"--out={out}"]) == 0
    assert sorted(os.listdir(out)) == ["curves.png", "eval.html", "frames", "index.html", "step_000000.html",
                                       "step_000001.html"]
    step0 = open(os.path.join(out, "step_000000.html")).read()
    records = L.read_jsonl(os.path.join(workdir, "rl", "episodes", "step_000000.jsonl"))
    assert step0.count('<section class="episode"') == 4
    assert step0.count('class="thumb ') == expected_thumbnails(records) == 4 * 4 + 2 * 4 + 4
    assert step0.count('class="thumb crop"') == 12 and step0.count('class="box truth"') == 4
    # the first episode's turn 1 lane: its two calls side by side, at their windows (of 40 s)
    assert 'left:18.75%;width:10.00%;background:#1f77b4" title="call 1"' in step0
    assert 'left:48.75%;width:10.00%;background:#ff7f0e" title="call 2"' in step0
    assert "not valid JSON" in step0 and "a blue circle" in step0 and "call 3 was not executed" in step0
    # the model's text is escaped, never markup
    assert "&lt;tool_call&gt;" in step0 and "<tool_call>" not in step0
    # thumbnails are decoded once per (video, frame): 4 episodes share one overview of 4 frames
    frames = os.listdir(os.path.join(out, "frames"))
    assert len(frames) == len(set(re.findall(r'src="frames/([^"]+)"', step0))) == 4 + 12
    index = open(os.path.join(out, "index.html")).read()
    assert 'href="step_000000.html"' in index and 'href="step_000001.html"' in index and "eval.html#final" in index
    assert '<img src="curves.png"' in index
    assert open(os.path.join(out, "eval.html")).read().count('<section class="episode"') == 2


def test_view_one_step_a_missing_video_and_bad_requests(workdir, tmp_path, capsys):
    result = view.render(workdir, str(tmp_path / "one"), step=1)
    assert [os.path.basename(p) for p in result["pages"]] == ["step_000001.html"] and result["episodes"] == 4
    with pytest.raises(view.ViewError, match=r"no episode log for step 7 .* \[0, 1\]"):
        view.render(workdir, str(tmp_path / "x"), step=7)
    with pytest.raises(view.ViewError, match="has no episode log"):
        view.render(str(tmp_path / "empty"))
    assert cli.main(["paravt-jax", "view", workdir, "--step=x"]) == 2
    # a run moved away from its videos: the pages still render, without thumbnails, and say why
    moved = tmp_path / "moved"
    shutil.copytree(workdir, moved)
    (moved / "rl" / "episodes" / "step_000000.jsonl").write_text(
        (moved / "rl" / "episodes" / "step_000000.jsonl").read_text().replace("v.mp4", "gone.mp4"))
    result = view.render(str(moved), str(tmp_path / "moved_view"), step=0)
    page = open(result["pages"][0]).read()
    assert result["thumbnails"] == 0 and "gone.mp4: file not found" in page and 'class="thumb' not in page


def test_view_pages_load_in_headless_chromium(workdir, tmp_path):
    """The pages load in a real browser with no console error, failed load or exception; the
    episodes and every thumbnail are there and decoded; a screenshot is written."""
    browser_path = require_browser()
    out = str(tmp_path / "view")
    view.render(workdir, out)
    records = L.read_jsonl(os.path.join(workdir, "rl", "episodes", "step_000000.jsonl"))
    count = """JSON.stringify({episodes: document.querySelectorAll('section.episode').length,
        thumbs: document.querySelectorAll('img.thumb').length,
        decoded: [...document.querySelectorAll('img.thumb')].filter(i => i.complete && i.naturalWidth > 0).length,
        lanes: document.querySelectorAll('.lane').length, calls: document.querySelectorAll('.box.call').length,
        links: [...document.querySelectorAll('a')].map(a => a.getAttribute('href'))})"""
    import json

    with Chromium(browser_path) as browser:
        assert browser.load(f"file://{out}/index.html") == []
        index = json.loads(browser.evaluate(count))
        assert index["links"][:2] == ["step_000000.html", "step_000001.html"]
        assert browser.load(f"file://{out}/step_000000.html") == []
        page = json.loads(browser.evaluate(count))
        assert page["episodes"] == 4 and page["thumbs"] == page["decoded"] == expected_thumbnails(records)
        assert page["calls"] == 3  # two side by side in one turn, one alone
        shot = browser.screenshot(str(tmp_path / "step_000000.png"))
        assert browser.load(f"file://{out}/eval.html") == []
        assert json.loads(browser.evaluate(count))["episodes"] == 2
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(shot) as image:
        assert image.width >= 800 and image.height >= 1000
    if os.environ.get("PARAVT_SCREENSHOT_DIR"):  # to look at it
        shutil.copy(shot, os.environ["PARAVT_SCREENSHOT_DIR"])
