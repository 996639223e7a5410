"""The `events` toy task: a task the built-in model can learn, and that needs the crop tool.

Each video is the same drifting dark background (so that a model cannot recognise a training
video by it and recall its answers) with two to four short (3 s) coloured-shape events,
each centred on a slot of a fixed grid (4, 12, 20, ... s: `SLOT_FIRST` + `SLOT_GAP` k). Every
question is a 4-option MCQ (options `TOY_COLORS`, always in that order) about events the
question locates by their windows ("at 10-14 seconds": the slot's centre +- 2 s), so

- sparse overview frames (K = 4 over 48 s) fall between the slots and miss every event;
- a 1 fps crop of a named window always shows its event (on two frames or more);
- `find2` and `find3` questions name two or three distant windows whose shapes differ and ask
  the colour of one shape kind, so one crop answers them only by luck and one turn with two or
  three parallel calls answers them.

The windows are in the question so that the calls' arguments are copied, not computed, and
they come from a small grid (six per 48 s) so that a small model learns the copy in minutes:
what the toy model must learn is the call format, the parallel calls, which windows to crop,
reading colour and shape off the crops, and looking the asked shape up in the tool responses.
Every video file is `video.mp4` in its own folder, so the `video_path` a call repeats is the
same text in every episode (the tool never opens it). Question kinds (`KINDS`): `colour` (one
window: its colour), `find2` and `find3` (two or three windows: the colour of the named shape).

SFT trajectories crop exactly the named windows; the tool responses are written in either
rollout mode (`frames`: the crop's timestamped frames, as `agent.rollout` lays them out;
`subagent`: the factual segment summary, plus sub-agent examples of its crops), and a share of
tool-free trajectories answer from the overview alone (the tool-free evaluation's prompt).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os

import numpy as np

from paravt_jax.data.synthetic import SHAPES, Event, SyntheticVideo, write_parquets, write_video

# of the generator: part of the built-in set's cache key (2: count answers balanced; 3: slot
# grid, one file name, 64 x 96 frames; 4: one background for every video; 5: kinds colour /
# find2 / find3, colour options in one fixed order, a final think that states the answer with
# a capitalised colour, shapes 0.4 of the frame's height; 6: the RL rows' extra_info names the
# question's windows, for the episode viewer)
VERSION = 6
KINDS = ("colour", "find2", "find3")
KIND_WEIGHTS = (0.2, 0.4, 0.4)  # 2.2 windows per question on average
WINDOWS = {"colour": 1, "find2": 2, "find3": 3}
EVENT_LENGTH = 3.0  # seconds; an event spans [centre - 1.5, centre + 1.5]
SLOT_FIRST, SLOT_GAP = 4, 8  # event centres sit on SLOT_FIRST + SLOT_GAP * k seconds
HALF_WINDOW = 2  # a crop window is [centre - 2, centre + 2]
TOY_COLORS = ("red", "green", "blue", "yellow")  # also the options, in this order
LETTERS = "ABCD"
# the answer's colour as the final think writes it: single tokens of the task's tokenizer
# (`apart`, data/builtin.py); a summary's lowercase "A red square" stays one merged token
ANSWER_WORDS = tuple(c.capitalize() for c in TOY_COLORS)
SFT_MODES = ("frames", "subagent")
BACKGROUND_SEED = 0  # one background for every video: a crop tells videos apart only by its event
SHAPE_SIZE = 0.4  # a shape's radius / the frame's height: 51 of 64 pixels across, so the kinds differ on every token
VIDEO_FILE = "video.mp4"  # every video's file name (in a folder of its own)
CROP_RESPONSE = "timestamped"  # the SFT content key that renders a crop as a frames-mode tool response


@dataclasses.dataclass(frozen=True)
class EventQuestion:
    video: SyntheticVideo
    kind: str  # colour | pair | count
    question: str
    answer: str  # the option letter
    centres: tuple[int, ...]  # seconds: the event centres the question names, in its order
    facts: tuple[str, ...]  # the colour of each named event, in the same order
    shapes: tuple[str, ...] = ()  # the shape of each named event, in the same order
    target: str = ""  # the shape whose colour is asked

    @property
    def windows(self) -> tuple[tuple[float, float], ...]:
        """The crop windows that answer the question: [c - 2, c + 2] per named centre."""
        return tuple(crop_window(c, self.video.duration) for c in self.centres)


def crop_window(centre: int, duration: float) -> tuple[float, float]:
    return float(max(0, centre - HALF_WINDOW)), float(min(duration, centre + HALF_WINDOW))


def slots(duration: float) -> np.ndarray:
    """The event centres a video of `duration` s can hold: SLOT_FIRST + SLOT_GAP k, windows inside."""
    return np.arange(SLOT_FIRST, int(duration) - HALF_WINDOW + 1, SLOT_GAP)


def make_events_video(seed: int, duration: float, num_events: int,
                      colours: tuple[str, ...] | None = None) -> SyntheticVideo:
    """`num_events` 3 s events on distinct slots (`slots`), with the given colours in time
    order (default: random)."""
    rng = np.random.default_rng(seed)
    grid = slots(duration)
    if num_events > len(grid):
        raise ValueError(f"make_events_video: {num_events} events, a {duration:g} s video has {len(grid)} slots")
    centres = np.sort(rng.choice(grid, size=num_events, replace=False))
    drawn = [TOY_COLORS[k] for k in rng.choice(len(TOY_COLORS), size=num_events)]
    if colours is not None and len(colours) != num_events:
        raise ValueError(f"make_events_video: {len(colours)} colours for {num_events} events")
    shapes = rng.choice(len(SHAPES), size=num_events)
    half = EVENT_LENGTH / 2
    events = tuple(Event(start=float(c) - half, end=float(c) + half, color=colour, shape=SHAPES[s])
                   for c, colour, s in zip(centres, colours or drawn, shapes))
    return SyntheticVideo(name=f"events_{seed:06d}/{VIDEO_FILE}", duration=float(duration), events=events, seed=seed)


def centre(event: Event) -> int:
    return int(round((event.start + event.end) / 2))


def _spans(windows) -> str:
    """'10-14 seconds', '10-14 and 38-42 seconds', '6-10, 22-26 and 38-42 seconds'."""
    spans = [f"{start:.0f}-{end:.0f}" for start, end in windows]
    joined = spans[0] if len(spans) == 1 else ", ".join(spans[:-1]) + " and " + spans[-1]
    return f"{joined} seconds"


def make_events_question(video: SyntheticVideo, kind: str, seed: int) -> EventQuestion:
    """A `kind` question about randomly picked events of `video`: colour (one window: its
    shape's colour) or find2 / find3 (two / three windows whose shapes are of different kinds:
    the colour of the one of a named kind). The options are TOY_COLORS in a fixed order."""
    rng = np.random.default_rng(seed + 104_729)
    if kind not in KINDS:
        raise ValueError(f"events question kind {kind!r}: expected one of {KINDS}")
    count = WINDOWS[kind]
    if len(video.events) < count:
        raise ValueError(f"{video.name}: a {kind} question needs {count} events, the video has {len(video.events)}")
    first = {}  # one event of each shape kind, in a random order of the video's events
    for i in rng.permutation(len(video.events)).tolist():
        first.setdefault(video.events[i].shape, i)
    if len(first) < count:
        raise ValueError(f"{video.name}: a {kind} question needs events of {count} shape kinds")
    picked = sorted(list(first.values())[:count])
    events = [video.events[i] for i in picked]
    centres = tuple(centre(e) for e in events)
    where = _spans(crop_window(c, video.duration) for c in centres)
    target = events[int(rng.integers(count))]
    if kind == "colour":
        text = f"What colour is the shape shown at {where}?"
    else:
        text = f"Shapes of different kinds are shown at {where}. What colour is the {target.shape}?"
    lines = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(TOY_COLORS))
    question = f"{text}\n{lines}\nAnswer with the option's letter."
    return EventQuestion(video=video, kind=kind, question=question, answer=LETTERS[TOY_COLORS.index(target.color)],
                         centres=centres, facts=tuple(e.color for e in events),
                         shapes=tuple(e.shape for e in events), target=target.shape)


# ----------------------------------------------------------------------------- trajectories
def tool_call_block(video_name: str, window: tuple[float, float]) -> str:
    """One crop_video call as the model writes it (whole-second times)."""
    arguments = {"video_path": video_name, "start_time": int(window[0]), "end_time": int(window[1])}
    return "<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": arguments}) + "\n</tool_call>"


def window_summary(q: EventQuestion, window: tuple[float, float]) -> str:
    """The factual sub-agent summary of one crop window."""
    seen = [e for e in q.video.events if e.start < window[1] and e.end > window[0]]
    if not seen:
        return f"From {window[0]:.0f} to {window[1]:.0f} seconds only a plain dark background is visible."
    return "; ".join(f"A {e.color} {e.shape} is visible from {e.start:.1f} to {e.end:.1f} seconds"
                     for e in seen) + "."


def first_turn(q: EventQuestion) -> str:
    return (f"<think>\nThe answer is in short events at {_spans(q.windows)}; I crop "
            f"{'that window' if len(q.centres) == 1 else 'those windows'}.\n</think>\n"
            + "\n".join(tool_call_block(os.path.basename(q.video.name), w) for w in q.windows))


def final_turn(q: EventQuestion) -> str:
    """A fixed first line (what sets the turn apart from a first turn and a tool-free answer),
    the asked shape and its colour as the tool responses state it, then the letter. The colour
    is capitalised (ANSWER_WORDS): a token of its own right after the subject's, so the answer
    is one look-up of the subject in the summaries' colour-and-shape tokens."""
    answer = ANSWER_WORDS[LETTERS.index(q.answer)]
    subject = "shape" if q.kind == "colour" else q.target
    return f"<think>\nFrom the crops:\nThe {subject}: {answer}.\n</think>\n<answer>{q.answer}</answer>"


def tool_free_turn(q: EventQuestion) -> str:
    return "<think>\nI answer from the overview frames.\n</think>\n" + f"<answer>{q.answer}</answer>"


def _text(s: str) -> dict:
    return {"type": "text", "text": s}


def main_messages(q: EventQuestion, video_url: str, mode: str) -> list[dict]:
    """System (the tool schema as rollouts inject it), user (overview + question + video path),
    the parallel calls, one tool response per call (`mode`), the answer."""
    from paravt_jax.text.chat import crop_video_tool, tools_system_prompt, with_video_path

    if mode not in SFT_MODES:
        raise ValueError(f"events SFT mode {mode!r}: expected one of {SFT_MODES}")
    messages = [
        {"role": "system", "content": [_text(tools_system_prompt([crop_video_tool(layout="flat")]))]},
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": video_url}},
                                     _text(with_video_path(q.question, os.path.basename(q.video.name)))]},
        {"role": "assistant", "content": [_text(first_turn(q))]},
    ]
    for window in q.windows:
        if mode == "frames":
            body = [{"type": "video_url", "video_url": {"url": video_url}, "video_start": window[0],
                     "video_end": window[1], "crop_response": CROP_RESPONSE}]
        else:
            body = [_text(f"<tool_response>\n{window_summary(q, window)}\n</tool_response>")]
        messages.append({"role": "user", "content": body})
    messages.append({"role": "assistant", "content": [_text(final_turn(q))]})
    return messages


def tool_free_messages(q: EventQuestion, video_url: str) -> list[dict]:
    """The tool-free evaluation's prompt (no system message, no video path) and a direct answer."""
    return [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video_url}}, _text(q.question)]},
            {"role": "assistant", "content": [_text(tool_free_turn(q))]}]


def subagent_rows(q: EventQuestion, video_url: str) -> list[list[dict]]:
    """One sub-agent example per crop: the crop's bare frames and its task, then the summary."""
    from paravt_jax.text.chat import segment_instruction

    return [[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video_url},
                                            "video_start": start, "video_end": end},
                                           _text(segment_instruction(start, end))]},
             {"role": "assistant", "content": [_text(window_summary(q, (start, end)))]}]
            for start, end in q.windows]


def rl_row(q: EventQuestion) -> dict:
    return {"prompt": [{"role": "user", "content": f"<video>\n{q.question}"}],
            "videos": [{"video": f"videos/{q.video.name}"}],
            "extra_info": json.dumps({"answer": q.answer, "question_type": "mcq",
                                      "video_duration": q.video.duration,
                                      "windows": [list(w) for w in q.windows]}),
            "data_source": "paravt_events"}


def corpus(questions) -> list[str]:
    """Text for the tokenizer: every trajectory's words, calls and answers, so the BPE merges
    cover the tool-call JSON."""
    from paravt_jax.text.chat import crop_video_tool, tools_system_prompt

    # the system prompt once per trajectory, as often as the trajectories repeat it
    texts = [tools_system_prompt([crop_video_tool(layout="flat")])] * max(1, len(questions))
    for q in questions:
        texts += [q.question, first_turn(q), final_turn(q), tool_free_turn(q)]
        texts += [window_summary(q, w) for w in q.windows]
    texts += [f"<{t / 2:.1f} seconds>" for t in range(0, 400)]
    return texts


# ----------------------------------------------------------------------------- the dataset
@dataclasses.dataclass(frozen=True)
class EventsDataset:
    root: str
    rl_train: str
    rl_eval: str
    sft: str
    questions: tuple[EventQuestion, ...]
    eval_questions: tuple[EventQuestion, ...]


def make_questions(count: int, seed: int, duration: float = 48.0) -> list[EventQuestion]:
    """`count` questions on `count` videos, deterministic from `seed`; kinds by KIND_WEIGHTS.
    Every video has two to four events (at least a question's windows) with uniform colours,
    and shapes of at least as many kinds as the question has windows, so the answer's colour
    is uniform before looking."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(len(KINDS), size=count, p=KIND_WEIGHTS)
    out = []
    room = len(slots(duration))
    for i, k in enumerate(kinds):
        kind = KINDS[int(k)]
        video_seed = seed * 100_003 + i
        draw = np.random.default_rng(video_seed + 1)
        num_events = min(max(int(draw.integers(WINDOWS[kind], 5)), 2), room)
        while True:  # redraw until the video has shapes of enough kinds
            video = make_events_video(video_seed, duration, num_events)
            if len({e.shape for e in video.events}) >= WINDOWS[kind]:
                break
            video_seed += 7_919 * count
        out.append(make_events_question(video, kind, video_seed))
    return out


def write_events_dataset(root: str, num_train: int = 384, num_eval: int = 48, seed: int = 0,
                         duration: float = 48.0, fps: float = 2.0, height: int = 64, width: int = 96,
                         sft_modes: tuple[str, ...] = SFT_MODES, tool_free_share: float = 0.2,
                         subagent_examples: int = 1) -> EventsDataset:
    """Videos under root/videos plus RL (train/eval) and SFT parquets in the reference schemas.
    Every training question gives one main trajectory per mode in `sft_modes` (and, in
    subagent mode, sub-agent examples of `subagent_examples` of its crops, drawn at random; 0:
    every crop); `tool_free_share` of them also a tool-free
    one. Deterministic from `seed`."""
    if num_eval < 1 or num_train < 1:
        raise ValueError(f"events dataset: num_train={num_train} and num_eval={num_eval} must be >= 1")
    if not 24.0 <= duration <= 600.0:
        raise ValueError(f"events dataset: duration {duration} s outside [24, 600]")
    os.makedirs(os.path.join(root, "videos"), exist_ok=True)
    questions = make_questions(num_train + num_eval, seed, duration)

    def write(q: EventQuestion):
        path = os.path.join(root, "videos", q.video.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            write_video(path, q.video.duration, list(q.video.events), fps, height, width, BACKGROUND_SEED,
                        SHAPE_SIZE)

    # the encoder releases the GIL: every core writes videos (each file's bytes are its own:
    # the same set, content hash and all, as one at a time; 2.6 against 4.8-6.6 s for 48 on 2 cores)
    with concurrent.futures.ThreadPoolExecutor(max(os.cpu_count() or 1, 1)) as pool:
        list(pool.map(write, questions))
    train, held_out = questions[:num_train], questions[num_train:]
    rng = np.random.default_rng(seed + 1)
    sft_rows = []
    for q in train:
        url = f"videos/{q.video.name}"
        for mode in sft_modes:
            sft_rows.append({"messages": json.dumps(main_messages(q, url, mode)), "kind": f"main_{mode}"})
            if mode == "subagent":  # `subagent_examples` of its crops, at random (0: every crop)
                crops = subagent_rows(q, url)
                chosen = sorted(rng.permutation(len(crops))[:subagent_examples or len(crops)].tolist())
                sft_rows += [{"messages": json.dumps(crops[i]), "kind": "subagent"} for i in chosen]
        if rng.random() < tool_free_share:
            sft_rows.append({"messages": json.dumps(tool_free_messages(q, url)), "kind": "tool_free"})
    paths = write_parquets(root, {"rl_train": [rl_row(q) for q in train],
                                  "rl_eval": [rl_row(q) for q in held_out], "sft": sft_rows})
    return EventsDataset(root=root, rl_train=paths["rl_train"], rl_eval=paths["rl_eval"], sft=paths["sft"],
                         questions=tuple(train), eval_questions=tuple(held_out))

