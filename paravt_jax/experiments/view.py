"""`paravt-jax view WORKDIR [--step=S] [--out=DIR]`: static HTML pages of a run's episode logs
(paravt_jax/episodes/episode_log.py), readable from the file system with no server.

One page per logged RL step (`step_XXXXXX.html`), one for the held-out evaluation episodes
(`eval.html`) and `index.html` linking them with each step's numbers. For every episode: a
timeline of the video with the overview frames as ticks and thumbnails, the ground-truth
windows where the data names them, one lane per assistant turn with that turn's crop windows
(the calls of one turn side by side), each call's crop thumbnails and tool response (the
sub-agent summary), every turn's text and well-formedness, the answer against the truth and
the reward parts.

Thumbnails are decoded here from the episode's video (the dataset row's path, as the log
records it; never a path the model wrote) at the recorded timestamps, and written once each
under `frames/`.
"""
from __future__ import annotations

import hashlib
import html
import os
import shutil
from collections.abc import Sequence

from paravt_jax.episodes.episode_log import read_jsonl, step_files

VIEW_USAGE = "paravt-jax view WORKDIR [--step=S] [--out=DIR]"
THUMB_HEIGHT = 54  # pixels
CALL_COLOURS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#222;max-width:1400px}
h1{font-size:20px}h2{font-size:16px;margin:4px 0}a{color:#1f5fa8}
table.numbers{border-collapse:collapse;font-size:13px}
table.numbers td,table.numbers th{border:1px solid #ccc;padding:3px 8px;text-align:right}
section.episode{border:1px solid #bbb;border-radius:6px;padding:10px;margin:14px 0;background:#fafafa}
.meta{font-size:13px;color:#444}.question{font-size:14px;margin:6px 0;white-space:pre-wrap}
.timeline{position:relative;height:auto;margin:8px 0 4px 0;border-left:1px solid #999;border-right:1px solid #999}
.lane{position:relative;height:18px;margin:2px 0;background:#eee}
.lane .label{position:absolute;left:-70px;width:66px;text-align:right;font-size:11px;color:#555}
.box{position:absolute;top:1px;height:16px;border-radius:3px;opacity:.85;font-size:10px;color:#fff;overflow:hidden;white-space:nowrap}
.truth{background:#2ca02c}.tick{position:absolute;top:0;width:2px;height:18px;background:#555}
.axis{position:relative;height:14px;font-size:10px;color:#666}.axis span{position:absolute}
.strip{display:flex;flex-wrap:wrap;gap:2px;margin:4px 0}
.strip figure{margin:0;font-size:10px;color:#555;text-align:center}
img.thumb{height:54px;display:block;border:1px solid #999}
.turn{border-top:1px dashed #bbb;margin-top:8px;padding-top:6px}
.calls{display:flex;gap:8px;flex-wrap:wrap}
.call{border:2px solid;border-radius:5px;padding:5px;background:#fff;max-width:430px}
.call .response{font-size:12px;white-space:pre-wrap;margin-top:4px}
pre.text{white-space:pre-wrap;font-size:12px;background:#fff;border:1px solid #ddd;padding:6px;
max-height:260px;overflow:auto}
.ok{color:#1a7f1a;font-weight:600}.bad{color:#b00020;font-weight:600}
.wrap{margin-left:72px}
"""


class ViewError(ValueError):
    """The workdir has no episode log to show (the message names what was looked for)."""


def esc(value) -> str:
    return html.escape("" if value is None else str(value))


def log_directory(workdir: str) -> str:
    """The step logs of a main-job workdir (rl/episodes) or of an RL-only workdir (episodes)."""
    for candidate in (os.path.join(workdir, "rl", "episodes"), os.path.join(workdir, "episodes")):
        if os.path.isdir(candidate):
            return candidate
    return os.path.join(workdir, "rl", "episodes")


class Thumbnails:
    """Decodes and writes each (video, frame) thumbnail once, under `out/frames`; a video that
    cannot be read is named once in `missing` and its thumbnails are left out."""

    def __init__(self, out: str):
        self.out = out
        self.directory = os.path.join(out, "frames")
        os.makedirs(self.directory, exist_ok=True)
        self.readers: dict[str, object] = {}
        self.missing: dict[str, str] = {}
        self.written: dict[tuple[str, int], str] = {}

    def reader(self, video: str):
        from paravt_jax.video.reader import VideoError, VideoReader

        if video in self.missing:
            return None
        if video not in self.readers:
            try:
                self.readers[video] = VideoReader(video)
            except VideoError as e:
                self.missing[video] = str(e)
                return None
        return self.readers[video]

    def duration(self, video: str) -> float | None:
        reader = self.reader(video)
        return None if reader is None else reader.metadata.duration

    def paths(self, video: str, times: Sequence[float | None]) -> list[str | None]:
        """Page-relative paths of the thumbnails at `times` (seconds) of `video` (None where
        the video cannot be read)."""
        reader = self.reader(video)
        if reader is None:
            return [None] * len(times)
        meta = reader.metadata
        indices = [min(meta.num_frames - 1, max(0, round((t or 0.0) * meta.fps))) for t in times]
        todo = sorted({i for i in indices if (video, i) not in self.written})
        if todo:
            from PIL import Image

            frames = reader.get(todo)
            key = hashlib.sha256(os.path.abspath(video).encode()).hexdigest()[:12]
            for index, frame in zip(todo, frames):
                name = f"{key}_{index:07d}.jpg"
                image = Image.fromarray(frame)
                width = max(1, round(image.width * THUMB_HEIGHT / image.height))
                image.resize((width, THUMB_HEIGHT), Image.BILINEAR).save(os.path.join(self.directory, name),
                                                                          quality=85)
                self.written[(video, index)] = f"frames/{name}"
        return [self.written[(video, i)] for i in indices]


def percent(t: float | None, duration: float) -> float:
    return 100.0 * min(max((t or 0.0) / duration, 0.0), 1.0)


def box(start, end, duration: float, css: str, text: str = "", colour: str = "") -> str:
    left = percent(start, duration)
    width = max(percent(end, duration) - left, 0.4)
    style = f"left:{left:.2f}%;width:{width:.2f}%" + (f";background:{colour}" if colour else "")
    return f'<div class="box {css}" style="{style}" title="{esc(text)}">{esc(text)}</div>'


def episode_html(record: dict, thumbs: Thumbnails) -> str:
    video = record.get("video") or ""
    overview = record.get("overview_times") or []
    turns = record.get("turns") or []
    duration = thumbs.duration(video)
    ends = [t for t in overview if t] + [w[1] for w in record.get("truth_windows") or []] + [
        (c.get("window") or c.get("asked") or [0, 0])[1] or 0 for turn in turns for c in turn.get("calls", [])]
    duration = duration or max(ends + [1.0])
    rewards = record.get("rewards") or {}
    correct = rewards.get("acc_reward")
    verdict = "" if correct is None else (' <span class="ok">correct</span>' if correct > 0
                                          else ' <span class="bad">wrong</span>')
    setting = "".join(f" · {k} {esc(record[k])}" for k in ("stage", "tools") if k in record and record[k] != "rl")
    out = [f'<section class="episode" id="{esc(record.get("episode_id"))}-{esc(record.get("sample"))}">',
           f'<h2>{esc(record.get("episode_id"))} · sample {esc(record.get("sample"))} · '
           f'K = {esc(record.get("nframes"))}{setting}</h2>',
           f'<div class="meta">video {esc(os.path.basename(video))} ({duration:.1f} s) · '
           f'{len(turns)} turn{"" if len(turns) == 1 else "s"} · {esc(record.get("length"))} generated tokens'
           + (" · <b>truncated</b>" if record.get("truncated") else "") + "</div>"]
    if video in thumbs.missing:
        out.append(f'<div class="bad">no thumbnails: {esc(thumbs.missing[video])}</div>')
    out.append(f'<div class="question">{esc(record.get("question"))}</div>')
    out.append(f'<div>answer <b>{esc(record.get("predicted")) or "(none)"}</b> · truth '
               f'<b>{esc(record.get("answer"))}</b>{verdict}</div>')
    # the timeline: overview ticks, ground truth, one lane per turn with its calls side by side
    lanes = ['<div class="lane"><span class="label">overview</span>'
             + "".join(f'<div class="tick" style="left:{percent(t, duration):.2f}%" title="{t:.2f} s"></div>'
                       for t in overview) + "</div>"]
    truth = record.get("truth_windows") or []
    if truth:
        lanes.append('<div class="lane"><span class="label">truth</span>'
                     + "".join(box(s, e, duration, "truth", f"{s:g}-{e:g} s") for s, e in truth) + "</div>")
    for number, turn in enumerate(turns, 1):
        calls = turn.get("calls") or []
        if calls:
            lanes.append(f'<div class="lane"><span class="label">turn {number}</span>' + "".join(
                box(*(c.get("window") or c.get("asked")), duration, "call", f"call {k + 1}",
                    CALL_COLOURS[k % len(CALL_COLOURS)]) for k, c in enumerate(calls)) + "</div>")
    axis = "".join(f'<span style="left:{percent(t, duration):.2f}%">{t:g}s</span>'
                   for t in [round(duration * i / 4, 1) for i in range(4)])
    axis += f'<span style="right:0">{duration:.1f}s</span>'
    out.append(f'<div class="wrap"><div class="timeline">{"".join(lanes)}</div><div class="axis">{axis}</div></div>')
    strip = "".join(f'<figure>{thumb_img(path, "overview", t)}<figcaption>{t:g}s</figcaption></figure>'
                    for t, path in zip(overview, thumbs.paths(video, overview)))
    out.append(f'<div class="strip">{strip}</div>')
    for number, turn in enumerate(turns, 1):
        problems = turn.get("problems") or []
        status = ('<span class="ok">well formed</span>' if turn.get("well_formed")
                  else '<span class="bad">not well formed: ' + esc("; ".join(problems)) + "</span>")
        out.append(f'<div class="turn"><b>turn {number}</b> · {status}<pre class="text">{esc(turn.get("text"))}</pre>')
        cards = []
        for k, call in enumerate(turn.get("calls") or []):
            window = call.get("window")
            asked = call.get("asked") or [None, None]
            head = (f"{window[0]:g}-{window[1]:g} s" if window else
                    f'refused (asked {esc(asked[0])}-{esc(asked[1])} s)')
            times = call.get("frame_times") or []
            crops = "".join(f'<figure>{thumb_img(path, "crop", t)}<figcaption>{t:g}s</figcaption></figure>'
                            for t, path in zip(times, thumbs.paths(video, times)))
            colour = CALL_COLOURS[k % len(CALL_COLOURS)]
            cards.append(f'<div class="call" style="border-color:{colour}"><b>call {k + 1}</b> · {head}'
                         f'<div class="strip">{crops}</div>'
                         f'<div class="response">{esc(call.get("response"))}</div></div>')
        if cards:
            out.append(f'<div class="calls">{"".join(cards)}</div>')
        out.append("</div>")
    advantage = record.get("advantage") or {}
    parts = {**rewards, **{f"advantage {k}": v for k, v in advantage.items()},
             "format compliant": record.get("format_compliant")}
    out.append('<table class="numbers"><tr>' + "".join(f"<th>{esc(k)}</th>" for k in parts) + "</tr><tr>"
               + "".join(f"<td>{fmt(v)}</td>" for v in parts.values()) + "</tr></table>")
    errors = record.get("errors") or []
    if errors:
        out.append('<div class="meta">tool errors: ' + esc("; ".join(errors)) + "</div>")
    out.append("</section>")
    return "\n".join(out)


def thumb_img(path: str | None, kind: str, t: float) -> str:
    if path is None:
        return f'<div class="meta">{t:g}s</div>'
    return f'<img class="thumb {kind}" src="{esc(path)}" alt="{kind} frame at {t:g} s" loading="eager">'


def fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return esc(value)


def page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")


def step_numbers(records: Sequence[dict]) -> dict:
    """The numbers of one page's episodes for the index."""
    n = max(len(records), 1)
    tool_turns = [len(t.get("calls") or []) for r in records for t in r.get("turns") or [] if t.get("calls")]
    return {"episodes": len(records),
            "reward": sum((r.get("rewards") or {}).get("total") or 0.0 for r in records) / n,
            "accuracy": sum((r.get("rewards") or {}).get("acc_reward") or 0.0 for r in records) / n,
            "with tools": sum(any(t.get("calls") for t in r.get("turns") or []) for r in records) / n,
            "calls per tool turn": sum(tool_turns) / len(tool_turns) if tool_turns else 0.0,
            "well formed turns": (sum(t.get("well_formed", False) for r in records for t in r.get("turns") or [])
                                  / max(1, sum(len(r.get("turns") or []) for r in records)))}


def render(workdir: str, out: str = "", step: int | None = None) -> dict:
    """Writes the pages; returns {"index": path, "pages": [paths], "episodes": count,
    "thumbnails": count, "missing_videos": {path: reason}}. Raises ViewError when there is
    nothing to show."""
    directory = log_directory(workdir)
    steps = step_files(directory)
    eval_path = os.path.join(workdir, "eval", "episodes.jsonl")
    if step is not None:
        if step not in steps:
            raise ViewError(f"view: no episode log for step {step} in {directory} (logged steps: "
                            f"{sorted(steps) or 'none'})")
        steps = {step: steps[step]}
    if not steps and not os.path.isfile(eval_path):
        raise ViewError(f"view: {workdir} has no episode log ({directory}/step_XXXXXX.jsonl or {eval_path}); "
                        f"runs log them with rl.log_episodes > 0")
    out = out or os.path.join(workdir, "view")
    os.makedirs(out, exist_ok=True)
    thumbs = Thumbnails(out)
    pages, rows, episodes = [], [], 0
    for number, path in steps.items():
        records = read_jsonl(path)
        name = f"step_{number:06d}.html"
        body = [f'<p><a href="index.html">index</a></p><h1>RL step {number}: {len(records)} episodes</h1>']
        body += [episode_html(r, thumbs) for r in records]
        write_text(os.path.join(out, name), page(f"step {number}", "\n".join(body)))
        pages.append(os.path.join(out, name))
        rows.append((f'<a href="{name}">step {number}</a>', step_numbers(records)))
        episodes += len(records)
    if step is None and os.path.isfile(eval_path):
        records = read_jsonl(eval_path)
        groups: dict[tuple, list] = {}
        for r in records:
            groups.setdefault((r.get("stage"), r.get("tools"), r.get("nframes")), []).append(r)
        body = ['<p><a href="index.html">index</a></p><h1>Held-out evaluation episodes</h1>']
        for (stage, tools, k), group in groups.items():
            body.append(f'<h2 id="{esc(stage)}-{esc(tools)}-{esc(k)}">{esc(stage)} · '
                        f'tools {"yes" if tools else "no"} · K = {esc(k)} ({len(group)} episodes)</h2>')
            body += [episode_html(r, thumbs) for r in group]
            rows.append((f'<a href="eval.html#{esc(stage)}-{esc(tools)}-{esc(k)}">eval {esc(stage)}, tools '
                         f'{"yes" if tools else "no"}, K = {esc(k)}</a>', step_numbers(group)))
        write_text(os.path.join(out, "eval.html"), page("evaluation episodes", "\n".join(body)))
        pages.append(os.path.join(out, "eval.html"))
        episodes += len(records)
    index = [f"<h1>Episodes of {esc(os.path.abspath(workdir))}</h1>"]
    if rows:
        keys = list(rows[0][1])
        index.append('<table class="numbers"><tr><th>page</th>' + "".join(f"<th>{esc(k)}</th>" for k in keys)
                     + "</tr>" + "".join(f"<tr><td>{link}</td>" + "".join(f"<td>{fmt(v[k])}</td>" for k in keys)
                                         + "</tr>" for link, v in rows) + "</table>")
    curves = os.path.join(workdir, "curves.png")
    if os.path.isfile(curves):
        shutil.copyfile(curves, os.path.join(out, "curves.png"))
        index.append('<p><img src="curves.png" alt="training curves" style="max-width:100%"></p>')
    if thumbs.missing:
        index.append('<p class="bad">videos not readable here (no thumbnails): '
                     + esc("; ".join(thumbs.missing.values())) + "</p>")
    index_path = os.path.join(out, "index.html")
    write_text(index_path, page("episodes", "\n".join(index)))
    return {"index": index_path, "pages": pages, "episodes": episodes, "thumbnails": len(thumbs.written),
            "missing_videos": dict(thumbs.missing)}


def write_text(path: str, text: str) -> None:
    from paravt_jax.infra.storage import write_atomic

    write_atomic(path, text.encode())
