"""Benchmark loaders that read local copies of the evaluation sets (no hub, no `datasets`).

Source of truth for the prompts and fields: ``load_samples`` in the reference
``paravt/eval/utils.py`` (EvolvingLMMs-Lab/ParaVT), which pulls each set from the Hugging Face
hub. Here the annotations are a local parquet file, an HF ``.arrow`` file (IPC stream as written
by ``save_to_disk`` / the datasets cache, or IPC file), or a directory of such shards; videos
live under a local directory. Every sample becomes one frozen `EvalSample`.

Deliberate deviations from the reference (scores on well-formed data are unaffected):

* Samples whose video file is absent are skipped and listed in `LoadedBenchmark.missing_videos`
  (the reference keeps them and scores them as failures).
* Option texts that already carry their positional letter (Video-MME's ``"A. Apples."``) are
  not prefixed twice; the reference prints ``"A. A. Apples."``.
* Video-MME ids use ``question_id`` when present (``videoID`` repeats three times per video).
* Rows the reference would silently turn into unanswerable samples raise ``ValueError``
  instead: an MLVU answer that matches no candidate, a LongVideoBench row without
  ``correct_choice``.
* ``limit`` keeps the first ``limit`` annotation rows (the reference's ``samples[:limit]``),
  so a limited load may return fewer samples when some of those videos are missing.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from paravt_jax.data.paravt_parquet import question_text, resolve_path

log = logging.getLogger(__name__)
LETTERS = "ABCDEFGHIJ"


@dataclasses.dataclass(frozen=True)
class EvalSample:
    dataset: str
    sample_id: str
    video_path: str  # absolute
    question: str  # the full user text, instruction included
    answer: str  # option letter (MCQ); the span as text (grounding); free text (open-ended)
    is_mcq: bool
    question_type: str  # mcq | tvg | oe
    options: tuple[str, ...] = ()  # as displayed: "A. text"
    span: tuple[float, float] | None = None  # ground-truth seconds (grounding)
    duration: str = ""  # Video-MME short/medium/long; LongVideoBench duration group
    task: str = ""  # task type / question category / subject
    key: str = ""  # Charades "video>>>caption>>>timestamp"


@dataclasses.dataclass(frozen=True)
class LoadedBenchmark:
    name: str
    samples: tuple[EvalSample, ...]
    missing_videos: tuple[str, ...]  # absolute paths of skipped samples' videos
    annotation_files: tuple[str, ...]
    subtitles_found: int = 0  # videomme_wsub: kept samples that got a subtitle prefix


def mcq_instruction(prompt_mode: str) -> str:
    """The line closing every MCQ prompt; ``direct`` asks for reasoning and an answer tag."""
    if prompt_mode == "direct":
        return ("Reason through the question step by step, calling crop_video whenever a closer "
                "look helps, and finish with <answer>X</answer> where X is the option letter.")
    return "Answer with the option letter only."


def grounding_question(caption: str) -> str:
    return ("Find the moment in the video that the sentence below describes and report when it "
            "starts and ends. Use the format 'The event happens in the start time - end time'. "
            "For example, The event 'person turn a light on' happens in the 24.3 - 30.4 seconds. "
            f'The sentence is: "{caption}". Give its start time and end time.')


def mcq_question(question: str, options: tuple[str, ...], instruction: str) -> str:
    return f"Question: {question}\nOptions:\n" + "\n".join(options) + f"\n{instruction}"


def lettered(texts: list, letters: str = LETTERS) -> tuple[str, ...]:
    """["Apples.", "B. Candles."] -> ("A. Apples.", "B. Candles."): a leading "X. " that
    already names the option's own letter is kept rather than doubled."""
    out = []
    for letter, text in zip(letters, texts):
        text = str(text)
        out.append(text if re.match(rf"{letter}\.\s", text) else f"{letter}. {text}")
    return tuple(out)


def parse_srt(path: str) -> str:
    """Subtitle text of an .srt file, one line per caption line; "" if absent or empty.
    Each block's index and timing lines are dropped (blocks of fewer than three lines carry no
    text) and html-like tags such as <i> are removed."""
    if not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8", errors="ignore") as f:
        content = f.read().replace("\r\n", "\n").replace("\r", "\n")
    lines = []
    for block in re.split(r"\n\s*\n", content.strip()):
        for line in block.strip().split("\n")[2:]:
            line = re.sub(r"<[^>]+>", "", line).strip()
            if line:
                lines.append(line)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- row -> sample
class _Row:
    """One annotation row plus where it came from, for error messages."""

    def __init__(self, values: dict, file: str, index: int, position: int):
        self.values, self.file, self.index, self.position = values, file, index, position

    def error(self, message: str) -> ValueError:
        return ValueError(f"{self.file}: row {self.index}: {message}")

    def __getitem__(self, field: str) -> Any:
        if self.values.get(field) is None:
            raise self.error(f"missing required field {field!r}")
        return self.values[field]

    def get(self, field: str, default: Any = "") -> Any:
        value = self.values.get(field)
        return default if value is None else value


def _videomme(row: _Row, instruction: str) -> EvalSample:
    options = row["options"]
    if not isinstance(options, list):
        raise row.error(f"options must be a list, got {options!r}")
    return EvalSample("videomme", str(row.get("question_id") or row["videoID"]),
                      f"{row['videoID']}.mp4", mcq_question(row["question"], lettered(options), instruction),
                      str(row["answer"]).strip(), True, "mcq", lettered(options),
                      duration=str(row.get("duration")), task=str(row.get("task_type")))


def _longvideobench(row: _Row, instruction: str) -> EvalSample:
    texts = [row.get(f"option{i}") for i in range(5)]
    options = lettered([t for t in texts if t not in ("", "N/A")])
    choice = int(row["correct_choice"])
    if not 0 <= choice < len(options):
        raise row.error(f"correct_choice={choice} outside the {len(options)} options")
    return EvalSample("longvideobench", str(row.get("id") or row["video_id"]), row["video_path"],
                      mcq_question(row["question"], options, instruction), LETTERS[choice], True,
                      "mcq", options, duration=str(row.get("duration_group")),
                      task=str(row.get("question_category")))


def _lvbench(row: _Row, instruction: str) -> EvalSample:
    # The question already lists its options as "(A) text" lines.
    options = tuple(f"{m[0]}. {m[1]}" for m in re.findall(r"^\(([A-J])\)\s*(.*)$", row["question"], re.M))
    kind = row.get("question_type")
    return EvalSample("lvbench", str(row["uid"]), row["video_path"], f"{row['question']}\n{instruction}",
                      str(row["answer"]).strip(), True, "mcq", options,
                      task=", ".join(kind) if isinstance(kind, list) else str(kind))


def _mlvu(row: _Row, instruction: str) -> EvalSample:
    candidates = row["candidates"]
    if not isinstance(candidates, list):
        raise row.error(f"candidates must be a list, got {candidates!r}")
    matches = [i for i, c in enumerate(candidates) if str(c).strip() == str(row["answer"]).strip()]
    if not matches:
        raise row.error(f"answer {row['answer']!r} matches none of the candidates {candidates}")
    task = str(row.get("task_type"))
    return EvalSample("mlvu", f"{task or 'mlvu'}-{row.position}", row["video_name"],
                      mcq_question(row["question"], lettered(candidates), instruction),
                      LETTERS[matches[0]], True, "mcq", lettered(candidates), task=task)


def _mmvu(row: _Row, instruction: str) -> EvalSample:
    video, choices = str(row["video"]), row["choices"]
    if isinstance(choices, str):
        choices = json.loads(choices)
    if not isinstance(choices, dict):
        raise row.error(f"choices must map letters to texts, got {choices!r}")
    if "/main/" in video:  # a hub URL: .../resolve/main/videos/<subject>/<n>.mp4
        video = video.split("/main/", 1)[1]
    elif video.startswith(("http://", "https://")):
        raise row.error(f"video URL {video!r} has no '/main/' marker to take a relative path from")
    options = tuple(f"{k}. {v}" for k, v in sorted(choices.items()) if v not in (None, ""))
    return EvalSample("mmvu", str(row["id"]), video, mcq_question(row["question"], options, instruction),
                      str(row["answer"]).strip(), True, "mcq", options, task=str(row.get("subject")))


def _charades(row: _Row, instruction: str) -> EvalSample:
    timestamp, caption = row["timestamp"], row["caption"]
    if not isinstance(timestamp, list) or len(timestamp) != 2:
        raise row.error(f"timestamp must be [start, end], got {timestamp!r}")
    return EvalSample("charades", str(row.position), row["video"], grounding_question(caption),
                      str(timestamp), False, "tvg", span=(float(timestamp[0]), float(timestamp[1])),
                      key=f"{row['video']}>>>{caption}>>>{timestamp}")


def _synthetic(row: _Row, instruction: str) -> EvalSample:
    """An RL-schema row of our synthetic set; the question keeps its own answer instruction."""
    info = row["extra_info"]
    info = json.loads(info) if isinstance(info, str) else info
    videos = row["videos"]
    if not isinstance(info, dict) or "answer" not in info or "question_type" not in info:
        raise row.error("extra_info must hold 'answer' and 'question_type'")
    if not videos or not isinstance(videos[0], dict) or "video" not in videos[0]:
        raise row.error("videos must be a list of {'video': path}")
    question = question_text(row["prompt"], row.file, row.index)
    kind, answer, video = str(info["question_type"]), str(info["answer"]), str(videos[0]["video"])
    sample_id = f"{os.path.splitext(os.path.basename(video))[0]}-{row.position}"
    options, span = (), None
    if kind == "mcq":
        options = tuple(f"{m[0]}. {m[1]}" for m in re.findall(r"^([A-J])\. (.+)$", question, re.M))
    elif kind == "tvg":
        found = re.fullmatch(r"\[\s*([\d.]+)\s*,\s*([\d.]+)\s*\]", answer.strip())
        if not found:
            raise row.error(f"tvg answer {answer!r} is not '[start, end]'")
        span = (float(found[1]), float(found[2]))
    elif kind != "oe":
        raise row.error(f"question_type {kind!r} is not one of mcq, tvg, oe")
    return EvalSample("synthetic", sample_id, video, question, answer, kind == "mcq", kind,
                      options, span, task=kind)


# ----------------------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
    source: str  # where the published annotations come from
    split: str  # preferred shards when a directory holds several splits
    annotations: str  # expected annotation layout, in words
    videos: str  # expected video layout, in words
    build: Callable[[_Row, str], EvalSample]


_TABLES = "a .parquet or HF .arrow file, or a directory of such shards"
_VIDEOMME = BenchmarkSpec(
    "lmms-lab/Video-MME (config videomme)", "test",
    f"{_TABLES} (e.g. videomme/test-00000-of-00001.parquet) with videoID, question, options "
    "(list), answer, duration, task_type", "<video_dir>/<videoID>.mp4", _videomme)
BENCHMARKS: dict[str, BenchmarkSpec] = {
    "videomme": _VIDEOMME,
    "videomme_wsub": dataclasses.replace(
        _VIDEOMME, videos=_VIDEOMME.videos + ", subtitles as <subtitle_dir>/<videoID>.srt"),
    "longvideobench": BenchmarkSpec(
        "longvideobench/LongVideoBench", "validation",
        f"{_TABLES} (validation split) with id, video_path, question, option0..option4, correct_choice",
        "<video_dir>/<video_path> (the extracted videos/ folder)", _longvideobench),
    "lvbench": BenchmarkSpec(
        "lmms-lab/LVBench", "train",
        f"{_TABLES} with uid, video_path, question (options included), answer",
        "<video_dir>/<video_path>", _lvbench),
    "mlvu": BenchmarkSpec(
        "sy1998/MLVU_dev", "test",
        f"{_TABLES} with video_name, question, candidates (list), answer (candidate text), task_type",
        "<video_dir>/<video_name> (the extracted video_part_*.zip files)", _mlvu),
    "mmvu": BenchmarkSpec(
        "yale-nlp/MMVU", "validation",
        f"{_TABLES} (validation split) with id, video (hub URL or relative path), question, "
        "choices (letter -> text), answer, subject",
        "<video_dir>/videos/<subject>/<n>.mp4 (the dataset snapshot root)", _mmvu),
    "charades": BenchmarkSpec(
        "lmms-lab/charades_sta", "test",
        f"{_TABLES} with video, caption, timestamp ([start, end] seconds)",
        "<video_dir>/<video> (Charades_v1_480)", _charades),
    "synthetic": BenchmarkSpec(
        "paravt_jax.data.synthetic (rl_eval.parquet from ensure_builtin)", "eval",
        "an RL-schema parquet (prompt, videos, extra_info with answer and question_type)",
        "<video_dir>/videos/synthetic_*.mp4 (the built-in data directory)", _synthetic),
}


# ----------------------------------------------------------------------------- reading
def annotation_files(path: str, split: str) -> list[str]:
    """The table files behind `path`: itself, or the .parquet/.arrow files below a directory,
    sorted, restricted to those naming `split` (as a folder or a name token) when any does."""
    if os.path.isfile(path):
        return [path]
    found = sorted(os.path.join(folder, name) for folder, _, names in os.walk(path)
                   for name in names if name.endswith((".parquet", ".arrow")))
    token = re.compile(rf"(^|[-_.]){re.escape(split)}([-_.]|$)")
    in_split = [f for f in found if split in os.path.relpath(f, path).split(os.sep)[:-1]
                or token.search(os.path.basename(f))]
    return in_split or found


def read_table(file: str) -> pa.Table:
    """A parquet file, or an Arrow IPC file / stream (HF datasets write streams)."""
    if file.endswith(".parquet"):
        return pq.read_table(file)
    if not file.endswith(".arrow"):
        raise ValueError(f"{file}: unsupported annotation file; expected .parquet or .arrow")
    with open(file, "rb") as f:
        is_ipc_file = f.read(6) == b"ARROW1"
    with pa.OSFile(file) as source:
        reader = pa.ipc.open_file(source) if is_ipc_file else pa.ipc.open_stream(source)
        return reader.read_all()


def _rows(files: list[str], limit: int) -> Iterator[_Row]:
    position = 0
    for file in files:
        for index, values in enumerate(read_table(file).to_pylist()):
            if limit and position >= limit:
                return
            yield _Row(values, file, index, position)
            position += 1


def load_benchmark(name: str, annotations: str, video_dir: str, *, prompt_mode: str = "agentic_general",
                   subtitle_dir: str = "", limit: int = 0) -> LoadedBenchmark:
    """All samples of benchmark `name` whose video exists under `video_dir`.

    `annotations`: a table file or shard directory (see `BENCHMARKS[name].annotations`);
    `subtitle_dir`: the .srt folder, required by (and only by) ``videomme_wsub``;
    `limit` > 0 keeps the first `limit` annotation rows.
    """
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    spec = BENCHMARKS[name]
    if not os.path.exists(annotations):
        raise FileNotFoundError(f"{name}: annotations not found at {annotations!r}; expected "
                                f"{spec.annotations}, from {spec.source}")
    if not os.path.isdir(video_dir):
        raise FileNotFoundError(f"{name}: video directory {video_dir!r} not found; expected videos "
                                f"as {spec.videos}")
    if (name == "videomme_wsub") != bool(subtitle_dir):
        raise ValueError(f"{name}: subtitle_dir={subtitle_dir!r}; it is required by videomme_wsub "
                         "and meaningless for any other benchmark")
    if subtitle_dir and not os.path.isdir(subtitle_dir):
        raise FileNotFoundError(f"{name}: subtitle directory {subtitle_dir!r} not found; expected "
                                f"{spec.videos}")
    files = annotation_files(annotations, spec.split)
    if not files:
        raise FileNotFoundError(f"{name}: no .parquet/.arrow files under {annotations!r}; expected "
                                f"{spec.annotations}, from {spec.source}")
    instruction = mcq_instruction(prompt_mode)
    samples, missing, subtitles_found = [], [], 0
    for row in _rows(files, limit):
        sample = spec.build(row, instruction)
        if name == "synthetic":  # paths may be file:// URIs or absolute
            video = os.path.abspath(resolve_path(sample.video_path, video_dir))
        else:
            video = os.path.abspath(os.path.join(video_dir, sample.video_path))
        if not os.path.isfile(video):
            missing.append(video)
            continue
        sample = dataclasses.replace(sample, dataset=name, video_path=video)
        if subtitle_dir:
            text = parse_srt(os.path.join(subtitle_dir, f"{row['videoID']}.srt"))
            if text:
                subtitles_found += 1
                prefix = f"This video's subtitles are listed below:\n{text}\n\n"
                sample = dataclasses.replace(sample, question=prefix + sample.question)
        samples.append(sample)
    if missing:
        log.warning("%s: skipped %d samples whose video is missing (first: %s)", name,
                    len(missing), ", ".join(missing[:3]))
    return LoadedBenchmark(name, tuple(samples), tuple(missing), tuple(files), subtitles_found)
