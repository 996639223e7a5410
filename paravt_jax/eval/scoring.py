"""Scoring of benchmark answers, as done by the reference evaluation driver.

Source of truth: ``paravt/eval/utils.py`` (``extract_letter``, ``extract_time_from_response``,
``temporal_iou``, the summary block of ``run_dataset``) and ``paravt/eval/driver.py``
(``_score``, ``_make_result``) in EvolvingLMMs-Lab/ParaVT.

How the reference scores:

* MCQ (Video-MME, LongVideoBench, LVBench, MLVU, MMVU): one letter is pulled out of the final
  response and compared with ``==`` to the gold letter; score 1.0 / 0.0. Accuracy is the mean
  over every result whose ``correct`` is not ``None`` -- failed samples (missing video, API
  error) carry ``correct=False`` and therefore count as wrong.
* Charades-STA: a ``[start, end]`` span in seconds is parsed from the response; the score is its
  temporal IoU with the ground truth, 0.0 if nothing parses. mIoU and R@{0.3, 0.5, 0.7} are
  taken over results *without* an ``error`` field (failed samples are dropped, unlike MCQ).
  Recall uses ``iou >= threshold`` (inclusive).
* Every dataset summary carries ``avg_tool_calls`` (mean calls per result, errors included)
  and ``tool_usage_rate`` (share of results with at least one call).

Deliberate deviations (none changes a score on well-formed input):

* ``extract_option_letter`` only ever returns one of ``A``-``J`` or ``""``. The reference's
  last fallback returns the first character of the stripped text whatever it is (``"n"`` for
  ``"no idea"``, ``"b"`` for ``"b"``); we return that character only when it is an upper-case
  ``A``-``J`` and ``""`` otherwise. Against gold letters ``A``-``J`` the correctness verdict is
  identical. ``extract_letter_verbatim`` keeps the reference's raw output (used by
  ``score_sample`` so the stored ``pred`` field matches the reference).
* Nothing here raises on any ``str``. Where the reference could raise (a digit run too long
  to convert to float in the ``mm:ss`` branch) the candidate is treated as out of range and
  the next fallback is tried. Non-string inputs are treated as empty text.
* The span regexes use possessive quantifiers: same matches as the reference's, without its
  cubic backtracking on long digit runs (see the comment at ``_SECONDS_RANGE``).
* Spans are returned as tuples rather than lists; empty accuracy is ``0.0`` rather than ``0``.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

OPTION_LETTERS = "ABCDEFGHIJ"
RECALL_THRESHOLDS = (0.3, 0.5, 0.7)
DURATION_BUCKETS = ("short", "medium", "long")

# ─── MCQ letter extraction ──────────────────────────────────────────────────
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_LONE_LETTER = re.compile(r"\b([A-J])\b")
# "answer is X" / "Answer: X"; case-sensitive, and no boundary after the letter, so
# "The answer is Because ..." yields "B" in the reference.
_ANSWER_IS = re.compile(r"(?:answer|Answer)\s*(?:is|:)\s*([A-J])")


def extract_letter_verbatim(text: str) -> str:
    """The reference ``extract_letter`` output, unfiltered.

    Order of attempts on the stripped text:

    1. an ``<answer>...</answer>`` block: its stripped body if that is a single ``A``-``J``,
       otherwise the first stand-alone ``A``-``J`` inside it (if none, fall through);
    2. the whole text if it is a single ``A``-``J``;
    3. ``answer is X`` / ``Answer: X`` (upper-case letter, "answer" or "Answer" only);
    4. the first stand-alone upper-case ``A``-``J`` anywhere (so a pronoun "I" counts);
    5. the first character of the text (any character), or ``""`` for empty text.

    Matching is case-sensitive: a lower-case letter is never recognised as an option.
    """
    if not isinstance(text, str):
        return ""
    text = text.strip()
    tag = _ANSWER_TAG.search(text)
    if tag:
        inner = tag.group(1).strip()
        if len(inner) == 1 and inner in OPTION_LETTERS:
            return inner
        lone = _LONE_LETTER.search(inner)
        if lone:
            return lone.group(1)
    if len(text) == 1 and text in OPTION_LETTERS:
        return text
    said = _ANSWER_IS.search(text)
    if said:
        return said.group(1)
    lone = _LONE_LETTER.search(text)
    if lone:
        return lone.group(1)
    return text[:1]


def extract_option_letter(text: str) -> str:
    """The option letter (``A``-``J``) the reference extracts from ``text``, else ``""``.

    Same fallbacks in the same order as ``extract_letter_verbatim``; the reference's final
    "first character" fallback is kept only when that character is an option letter (e.g.
    ``"Because ..."`` -> ``"B"``, as in the reference), otherwise ``""`` is returned.
    """
    letter = extract_letter_verbatim(text)
    return letter if len(letter) == 1 and letter in OPTION_LETTERS else ""


# ─── Temporal-grounding span parsing ────────────────────────────────────────
_TIME_TAG = re.compile(r"<time>([^<]+)</time>")
_DASHES = "-\u2013\u2014"  # hyphen, en dash, em dash
# Same languages and captures as the reference regexes, but with possessive quantifiers: the
# reference's ``(\d+\.?\d*)\s*[-]`` backtracks cubically on long digit runs (1,600 digits take
# ~20 s, 4,800 several minutes). Giving back a digit or the "." can never let the next token
# (":", whitespace, dash) match, so the possessive forms find exactly the same matches.
_MMSS_RANGE = re.compile(
    rf"(\d++):(\d++(?:\.\d++)?+)\s*+[{_DASHES}]\s*+(\d++):(\d++(?:\.\d++)?+)")
_SECONDS_RANGE = re.compile(rf"(\d++\.?+\d*+)\s*+[{_DASHES}]\s*+(\d++\.?+\d*+)")
_START_WORD = re.compile(
    r"(?:start(?:ing)?|begin(?:ning)?)\s*+(?:time)?+[:\s]*+(\d++\.?+\d*+)", re.I)
_END_WORD = re.compile(
    r"(?:end(?:ing)?|finish(?:ing)?)\s*+(?:time)?+[:\s]*+(\d++\.?+\d*+)", re.I)
_NUMBER = re.compile(r"(\d+\.?\d*)")


def _num(digits: str) -> float:
    """float() of a regex digit run; never raises (too-long runs become inf)."""
    try:
        return float(digits)
    except (ValueError, OverflowError):  # pragma: no cover - \d runs always convert
        return math.nan


def parse_span(text: str) -> tuple[float, float] | None:
    """Predicted ``(start, end)`` in seconds from a grounding answer, as the reference parses it.

    Candidates are the body of the first ``<time>...</time>`` tag (if any), then the whole
    text. For each candidate, in order:

    1. the first ``m:ss[.f] - m:ss[.f]`` range (hyphen, en or em dash), accepted only if
       ``end > start`` and ``end < 3600`` s;
    2. the first bare ``a - b`` number range, accepted only if ``end > start`` (only the first
       such range is looked at; a reversed first range is not skipped over).

    If no candidate gives a range, on the whole text: the first number after
    ``start``/``starting``/``begin``/``beginning`` (optionally ``time``, ``:``) paired with the
    first number after ``end``/``ending``/``finish``/``finishing`` (case-insensitive), and
    finally the first two numbers in the text. These last two fallbacks do **not** check the
    order, so ``(30.0, 10.0)`` can come back (its IoU is 0). Returns ``None`` when nothing
    parses, including empty / whitespace-only / non-string input.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    tag = _TIME_TAG.search(text)
    candidates = ([tag.group(1)] if tag else []) + [text]
    for cand in candidates:
        m = _MMSS_RANGE.search(cand)
        if m:
            start = _num(m.group(1)) * 60 + _num(m.group(2))
            end = _num(m.group(3)) * 60 + _num(m.group(4))
            if end > start and end < 3600:
                return (start, end)
        m = _SECONDS_RANGE.search(cand)
        if m:
            start, end = _num(m.group(1)), _num(m.group(2))
            if end > start:
                return (start, end)
    starts = _START_WORD.findall(text)
    ends = _END_WORD.findall(text)
    if starts and ends:
        return (_num(starts[0]), _num(ends[0]))
    nums = _NUMBER.findall(text)
    if len(nums) >= 2:
        return (_num(nums[0]), _num(nums[1]))
    return None


def _as_span(span: Any) -> tuple[float, float] | None:
    """A (start, end) float pair, or None when ``span`` is not one (text is parsed)."""
    if span is None:
        return None
    if isinstance(span, str):
        return parse_span(span)
    try:
        start, end = span[0], span[1]
        return (float(start), float(end))
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        return None


def temporal_iou(pred: Any, truth: Any) -> float:
    """IoU of two ``(start, end)`` spans in seconds, as the reference computes it.

    ``intersection / (max(ends) - min(starts))``; the hull equals the union whenever the spans
    overlap, and the result is 0.0 when they do not or when the hull is empty. A span with
    ``end <= start`` always yields 0.0 (the reference's formula gives a non-positive
    intersection for it; we check it explicitly). Unparseable or non-finite spans give 0.0
    where the reference would raise.
    """
    a, b = _as_span(pred), _as_span(truth)
    if a is None or b is None or not all(math.isfinite(v) for v in (*a, *b)):
        return 0.0
    if a[1] <= a[0] or b[1] <= b[0]:
        return 0.0
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


# ─── Per-sample scoring (driver._score) ─────────────────────────────────────
def score_sample(sample: Mapping[str, Any], final: str) -> tuple[Any, float, Any]:
    """``(correct, score, pred)`` for one sample, like the reference ``_score``.

    MCQ (``sample["is_mcq"]``): ``pred`` is the reference's raw letter,
    ``correct = pred == sample["answer"]``, score 1.0 / 0.0. Grounding: ``correct`` is
    ``None``; with a parsed span the score is its IoU against
    ``(sample["gt_start"], sample["gt_end"])`` and ``pred`` is ``"s.s-e.e"``, otherwise the
    score is 0.0 and ``pred`` is the first 200 characters of the response.
    """
    final = final if isinstance(final, str) else ""
    if sample["is_mcq"]:
        pred = extract_letter_verbatim(final)
        correct = pred == sample["answer"]
        return correct, 1.0 if correct else 0.0, pred
    span = parse_span(final)
    if span:
        truth = (sample["gt_start"], sample["gt_end"])
        return None, temporal_iou(span, truth), f"{span[0]:.1f}-{span[1]:.1f}"
    return None, 0.0, final[:200]


# ─── Aggregates ─────────────────────────────────────────────────────────────
def mcq_accuracy(records: Iterable[Any]) -> float:
    """Share of correct answers among records whose ``correct`` is not ``None``.

    ``records`` are result dicts (``correct`` read with ``.get``) or bare ``bool``/``None``
    values. Failed samples in the reference carry ``correct=False`` and so count as wrong.
    Returns 0.0 when no record qualifies.
    """
    flags = [r.get("correct") if isinstance(r, Mapping) else r for r in records]
    flags = [f for f in flags if f is not None]
    return sum(bool(f) for f in flags) / len(flags) if flags else 0.0


def _tool_counts(counts: Iterable[Any]) -> list[float]:
    out = []
    for c in counts:
        if isinstance(c, Mapping):
            c = c.get("tool_calls", 0)
        out.append(float(c or 0))
    return out


def avg_tool_calls(counts: Iterable[Any]) -> float:
    """Mean tool calls per sample (ints, or result dicts read via ``tool_calls``, default 0);
    every sample counts, failed ones included. 0.0 for no samples."""
    vals = _tool_counts(counts)
    return sum(vals) / max(len(vals), 1)


def tool_usage_rate(counts: Iterable[Any]) -> float:
    """Share of samples with at least one tool call (same inputs as ``avg_tool_calls``)."""
    vals = _tool_counts(counts)
    return sum(1 for v in vals if v > 0) / max(len(vals), 1)


def grounding_metrics_from_ious(ious: Iterable[float]) -> dict[str, float]:
    """``miou`` and ``r@0.3/0.5/0.7`` from per-sample IoUs; recall counts ``iou >= t``
    (inclusive, as the reference). All zeros for no IoUs."""
    vals = [float(v) for v in ious]
    n = max(len(vals), 1)
    out = {"miou": sum(vals) / n}
    for t in RECALL_THRESHOLDS:
        out[f"r@{t}"] = sum(1 for v in vals if v >= t) / n
    return out


def grounding_metrics(pairs: Iterable[tuple[Any, Any]]) -> dict[str, float]:
    """Charades-STA metrics over ``(predicted, truth)`` span pairs in seconds.

    Returns ``{"miou", "r@0.3", "r@0.5", "r@0.7"}``. A prediction that is ``None``, not a
    pair of numbers, degenerate (``end <= start``) or non-finite scores IoU 0 and still counts
    in the denominator (the reference scores an unparseable answer 0.0). A string prediction
    is parsed with ``parse_span`` first. Recall is inclusive (``iou >= t``). Empty -> zeros.
    """
    return grounding_metrics_from_ious(temporal_iou(p, t) for p, t in pairs)


# ─── Breakdowns ─────────────────────────────────────────────────────────────
def _first_present(record: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for k in keys:
        if k in record and record[k] not in (None, ""):
            return record[k]
    return None


def breakdown(records: Iterable[Mapping[str, Any]], key: str | Sequence[str],
              *, score_key: str = "score") -> dict[Any, dict[str, float]]:
    """``{bucket: {"accuracy": mean score, "count": n}}`` grouped by ``record[key]``.

    ``key`` may be a list of field names, the first one present (non-empty) is used. Records
    without a bucket or with a ``None`` score are skipped. Booleans count as 1/0, so
    ``score_key="correct"`` gives the reference's per-duration accuracy. Buckets appear in
    first-seen order.
    """
    keys = [key] if isinstance(key, str) else list(key)
    groups: dict[Any, list[float]] = {}
    for r in records:
        bucket = _first_present(r, keys)
        score = r.get(score_key)
        if bucket is None or score is None:
            continue
        groups.setdefault(bucket, []).append(float(score))
    return {b: {"accuracy": sum(v) / len(v), "count": len(v)} for b, v in groups.items()}


def per_duration(records: Iterable[Mapping[str, Any]], *, score_key: str = "score"):
    """Breakdown by ``duration_bucket`` (falling back to the reference field ``duration``,
    Video-MME's short / medium / long)."""
    return breakdown(records, ("duration_bucket", "duration"), score_key=score_key)


def per_task(records: Iterable[Mapping[str, Any]], *, score_key: str = "score"):
    """Breakdown by ``task`` (falling back to the reference field ``config``: MLVU task type,
    MMVU subject). The reference stores ``config`` per result but never summarises it."""
    return breakdown(records, ("task", "config"), score_key=score_key)


def duration_summary(results: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The reference's flat Video-MME keys: ``acc_<d>`` and ``n_<d>`` for d in short, medium,
    long, over results with that ``duration`` and a non-``None`` ``correct``; a bucket with
    no results is omitted."""
    results = list(results)
    out: dict[str, float] = {}
    for dur in DURATION_BUCKETS:
        hits = [r for r in results if r.get("duration") == dur and r.get("correct") is not None]
        if hits:
            out[f"acc_{dur}"] = sum(bool(r["correct"]) for r in hits) / len(hits)
            out[f"n_{dur}"] = len(hits)
    return out


def submission(results: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Charades submission map ``key -> pred_text`` over results that have both (non-empty)."""
    return {r["key"]: r["pred_text"] for r in results if "key" in r and r.get("pred_text")}


def dataset_summary(dataset: str, results: Sequence[Mapping[str, Any]], *, is_mcq: bool,
                    nframes: int, elapsed: float = 0.0) -> dict[str, Any]:
    """The ``summary`` block of the reference's per-dataset JSON, same keys and key order.

    Always: ``dataset, total, errors, avg_tool_calls, tool_usage_rate, elapsed, nframes``.
    MCQ adds ``accuracy, mcq_total`` and, for the dataset named exactly ``"videomme"`` (not
    ``videomme_wsub``), ``acc_/n_`` per duration. Grounding adds ``mIoU, R@0.3, R@0.5, R@0.7``
    over error-free results and ``submission_count``.
    """
    results = list(results)
    summary: dict[str, Any] = {
        "dataset": dataset,
        "total": len(results),
        "errors": sum(1 for r in results if "error" in r),
        "avg_tool_calls": avg_tool_calls(results),
        "tool_usage_rate": tool_usage_rate(results),
        "elapsed": elapsed,
        "nframes": nframes,
    }
    if is_mcq:
        summary["accuracy"] = mcq_accuracy(results)
        summary["mcq_total"] = sum(1 for r in results if r.get("correct") is not None)
        if dataset == "videomme":
            summary.update(duration_summary(results))
    else:
        ious = [r["score"] for r in results if "error" not in r]
        m = grounding_metrics_from_ious(ious)
        summary.update({"mIoU": m["miou"], "R@0.3": m["r@0.3"], "R@0.5": m["r@0.5"],
                        "R@0.7": m["r@0.7"]})
        summary["submission_count"] = len(submission(results))
    return summary


def dataset_output(dataset: str, results: Sequence[Mapping[str, Any]], *, is_mcq: bool,
                   nframes: int, elapsed: float = 0.0) -> dict[str, Any]:
    """The whole per-dataset JSON: ``{"summary", "results"}`` plus ``"submission"`` for
    grounding datasets."""
    results = list(results)
    out: dict[str, Any] = {
        "summary": dataset_summary(dataset, results, is_mcq=is_mcq, nframes=nframes,
                                   elapsed=elapsed),
        "results": results,
    }
    if not is_mcq:
        out["submission"] = submission(results)
    return out
