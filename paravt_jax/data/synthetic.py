"""Synthetic long-video material: drifting solid backgrounds with short timed shape events."""
from __future__ import annotations

import dataclasses

import numpy as np

COLORS = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (40, 80, 230),
          "yellow": (235, 220, 40), "purple": (150, 60, 200), "white": (245, 245, 245)}
SHAPES = ("square", "circle", "triangle")


@dataclasses.dataclass(frozen=True)
class Event:
    start: float  # seconds
    end: float
    color: str
    shape: str


def background(t: np.ndarray, seed: int) -> np.ndarray:
    """A slowly drifting dark colour per time t (seconds) -> [len(t), 3] uint8."""
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * np.pi, 3)
    base = 40 + 30 * np.sin(np.asarray(t, np.float64)[:, None] / 37.0 + phase)
    return np.clip(base, 0, 110).astype(np.uint8)


def shape_mask(shape: str, height: int, width: int, cy: float, cx: float, radius: float) -> np.ndarray:
    yy, xx = np.mgrid[:height, :width]
    if shape == "square":
        return (np.abs(yy - cy) <= radius) & (np.abs(xx - cx) <= radius)
    if shape == "circle":
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= radius**2
    if shape == "triangle":
        return (yy >= cy - radius) & (yy <= cy + radius) & (np.abs(xx - cx) <= (yy - (cy - radius)) / 2)
    raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


# ----------------------------------------------------------------------------- video files
def write_video(path: str, duration: float, events: list[Event], fps: float = 4.0,
                height: int = 360, width: int = 640, seed: int = 0, size: float = 0.25) -> str:
    """Encodes an H.264 mp4 with PyAV: drifting background, events drawn while active, each
    shape centred with a radius of `size` times the frame's shorter side."""
    import os

    import av

    if duration <= 0 or fps <= 0:
        raise ValueError(f"write_video: duration={duration} and fps={fps} must be > 0")
    n = int(round(duration * fps))
    times = np.arange(n) / fps
    backgrounds = background(times, seed)
    masks = {(e.shape): shape_mask(e.shape, height, width, height / 2, width / 2, min(height, width) * size)
             for e in events}
    tmp = path + ".tmp.mp4"
    from fractions import Fraction

    with av.open(tmp, mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "23", "preset": "ultrafast", "g": str(max(1, int(fps * 2)))}
        frame = np.empty((height, width, 3), np.uint8)
        for i, t in enumerate(times):
            frame[:] = backgrounds[i]
            for e in events:
                if e.start <= t < e.end:
                    frame[masks[e.shape]] = COLORS[e.color]
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- the task
@dataclasses.dataclass(frozen=True)
class SyntheticVideo:
    name: str  # file name, relative to the video root
    duration: float
    events: tuple[Event, ...]
    seed: int


@dataclasses.dataclass(frozen=True)
class Question:
    video: SyntheticVideo
    question: str
    answer: str
    question_type: str  # mcq | tvg | oe
    target: Event  # the event the question is about


def make_video(seed: int, duration: float, num_events: int | None = None) -> SyntheticVideo:
    """Non-overlapping events of 2-5 s with distinct (colour, shape) pairs."""
    rng = np.random.default_rng(seed)
    slots_available = int(duration // 8)
    k = int(num_events if num_events is not None else rng.integers(2, 5))
    k = max(1, min(k, slots_available))
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    chosen = rng.choice(len(pairs), size=k, replace=False)
    slots = np.sort(rng.choice(np.arange(slots_available), size=k, replace=False)) * 8.0
    events = []
    for slot, pair in zip(slots, chosen):
        length = float(rng.uniform(2.0, 5.0))
        start = float(np.round(slot + rng.uniform(0.5, 8.0 - length - 0.5), 1))
        events.append(Event(start=start, end=float(np.round(start + length, 1)),
                            color=pairs[pair][0], shape=pairs[pair][1]))
    return SyntheticVideo(name=f"synthetic_{seed:06d}.mp4", duration=float(duration),
                          events=tuple(events), seed=seed)


def make_question(video: SyntheticVideo, question_type: str, seed: int) -> Question:
    rng = np.random.default_rng(seed + 7919)
    target = video.events[int(rng.integers(len(video.events)))]
    if question_type == "mcq":
        present = {(e.color, e.shape) for e in video.events}
        distractors = [(c, s) for c in COLORS for s in SHAPES if (c, s) not in present]
        picks = [distractors[i] for i in rng.choice(len(distractors), size=3, replace=False)]
        options = picks + [(target.color, target.shape)]
        order = rng.permutation(4)
        letters = "ABCD"
        lines = [f"{letters[i]}. {options[j][0]} {options[j][1]}" for i, j in enumerate(order)]
        answer = letters[int(np.nonzero(order == 3)[0][0])]
        text = ("Which of these coloured shapes appears at some point in the video?\n"
                + "\n".join(lines) + "\nAnswer with the option's letter.")
    elif question_type == "tvg":
        text = (f"When does the {target.color} {target.shape} appear in the video? "
                "Answer with the start and end time in seconds as [start, end].")
        answer = f"[{target.start:.1f}, {target.end:.1f}]"
    elif question_type == "oe":
        text = f"What colour is the {target.shape} that appears around {target.start:.0f} seconds?"
        answer = target.color
    else:
        raise ValueError(f"question_type={question_type!r}: expected mcq, tvg or oe")
    return Question(video=video, question=text, answer=answer, question_type=question_type,
                    target=target)


def segment_summary(video: SyntheticVideo, start: float, end: float) -> str:
    """The factual answer a sub-agent should give for [start, end]."""
    seen = [e for e in video.events if e.start < end and e.end > start]
    if not seen:
        return f"From {start:.1f} to {end:.1f} seconds only a plain drifting background is visible."
    parts = [f"a {e.color} {e.shape} is visible from {max(e.start, start):.1f} to "
             f"{min(e.end, end):.1f} seconds" for e in seen]
    return "In this segment " + "; ".join(parts) + "."


def corpus(questions: list[Question]) -> list[str]:
    """Text the built-in tokenizer is trained on."""
    from paravt_jax.text.chat import CROP_VIDEO_TOOL, tools_system_prompt

    texts = [tools_system_prompt([CROP_VIDEO_TOOL])]
    for q in questions:
        texts += [q.question, q.answer, segment_summary(q.video, 0, q.video.duration)]
        for e in q.video.events:
            texts.append(segment_summary(q.video, e.start - 1, e.end + 1))
            texts.append(f"<{e.start:.1f} seconds> <think>The {e.color} {e.shape} may be near "
                         f"{e.start:.0f} seconds.</think>")
    texts += [f"<{t / 2:.1f} seconds>" for t in range(0, 2400)]
    return texts


# ----------------------------------------------------------------------------- datasets
QUESTION_TYPES = ("mcq", "tvg", "oe")


def _windows(video: SyntheticVideo, target: Event, rng: np.random.Generator) -> list[tuple[float, float]]:
    """Candidate windows for one parallel turn: the target's plus one or two decoys."""
    pad = lambda a, b: (max(0.0, float(np.floor(a - 1))), min(video.duration, float(np.ceil(b + 1))))
    windows = [pad(target.start, target.end)]
    others = [e for e in video.events if e is not target]
    for e in others[: int(rng.integers(1, 3))]:
        windows.append(pad(e.start, e.end))
    order = rng.permutation(len(windows))
    return [windows[i] for i in order]


def sft_messages(q: Question, video_url: str, rng: np.random.Generator) -> list[dict]:
    """A cold-start trajectory: think, parallel crop calls, tool responses, think, answer."""
    import json

    from paravt_jax.text.chat import CROP_VIDEO_TOOL, tools_system_prompt

    windows = _windows(q.video, q.target, rng)
    calls = "\n".join(
        "<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": {
            "video_path": q.video.name, "start_time": s, "end_time": e}}) + "\n</tool_call>"
        for s, e in windows)
    first = ("<think>\nThe overview frames are sparse, so short events can fall between them. "
             f"I will inspect {len(windows)} candidate windows at once.\n</think>\n" + calls)
    text = lambda s: {"type": "text", "text": s}
    messages = [
        {"role": "system", "content": [text(tools_system_prompt([CROP_VIDEO_TOOL]))]},
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": video_url}},
                                     text(f"{q.question}\nThe video path for this video is: {q.video.name}")]},
        {"role": "assistant", "content": [text(first)]},
    ]
    for s, e in windows:
        messages.append({"role": "user", "content": [
            text(f"<tool_response>\n{segment_summary(q.video, s, e)}\n</tool_response>")]})
    t = q.target
    final = (f"<think>\nThe crops show the {t.color} {t.shape} from {t.start:.1f} to {t.end:.1f} "
             f"seconds, which answers the question.\n</think>\n<answer>{q.answer}</answer>")
    messages.append({"role": "assistant", "content": [text(final)]})
    return messages


def subagent_messages(q: Question, video_url: str, start: float, end: float) -> list[dict]:
    from paravt_jax.text.chat import segment_instruction

    return [
        {"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": video_url}, "video_start": start, "video_end": end},
            {"type": "text", "text": segment_instruction(start, end)}]},
        {"role": "assistant", "content": [{"type": "text", "text": segment_summary(q.video, start, end)}]},
    ]


def rl_row(q: Question) -> dict:
    import json

    return {"prompt": [{"role": "user", "content": f"<video>\n{q.question}"}],
            "videos": [{"video": f"videos/{q.video.name}"}],
            "extra_info": json.dumps({"answer": q.answer, "question_type": q.question_type,
                                      "video_duration": q.video.duration}),
            "data_source": "paravt_synthetic"}


@dataclasses.dataclass(frozen=True)
class SyntheticDataset:
    root: str
    rl_train: str
    rl_eval: str
    sft: str
    questions: tuple[Question, ...]
    eval_questions: tuple[Question, ...]


def write_dataset(root: str, num_train: int = 12, num_eval: int = 4,
                  durations: tuple[float, ...] = (30.0, 60.0, 120.0), seed: int = 0,
                  fps: float = 4.0, height: int = 180, width: int = 320) -> SyntheticDataset:
    """Videos under root/videos plus RL (train/eval) and SFT parquets in the reference schemas.
    Deterministic from `seed`. Durations may range from 30 s to 20 min."""
    import os

    for d in durations:
        if not 16.0 <= d <= 1200.0:
            raise ValueError(f"synthetic duration {d} s outside [16, 1200]")
    os.makedirs(os.path.join(root, "videos"), exist_ok=True)
    questions = []
    for i in range(num_train + num_eval):
        video = make_video(seed * 100_003 + i, durations[i % len(durations)])
        path = os.path.join(root, "videos", video.name)
        if not os.path.exists(path):
            write_video(path, video.duration, list(video.events), fps, height, width, video.seed)
        questions.append(make_question(video, QUESTION_TYPES[i % 3], seed * 100_003 + i))
    train, held_out = questions[:num_train], questions[num_train:]
    rng = np.random.default_rng(seed)
    sft_rows = []
    for q in train:
        url = f"videos/{q.video.name}"
        sft_rows.append({"messages": _json(sft_messages(q, url, rng)), "kind": "main"})
        for s, e in _windows(q.video, q.target, rng):
            sft_rows.append({"messages": _json(subagent_messages(q, url, s, e)), "kind": "subagent"})
    paths = write_parquets(root, {"rl_train": [rl_row(q) for q in train],
                                  "rl_eval": [rl_row(q) for q in held_out], "sft": sft_rows})
    return SyntheticDataset(root=root, rl_train=paths["rl_train"], rl_eval=paths["rl_eval"],
                            sft=paths["sft"], questions=tuple(train), eval_questions=tuple(held_out))


def write_parquets(root: str, tables: dict[str, list[dict]]) -> dict[str, str]:
    """Each table's rows -> root/<name>.parquet, written atomically; name -> path."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {}
    for name, rows in tables.items():
        paths[name] = os.path.join(root, f"{name}.parquet")
        tmp = paths[name] + ".tmp"
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, paths[name])
    return paths


def _json(obj) -> str:
    import json

    return json.dumps(obj, ensure_ascii=False)
