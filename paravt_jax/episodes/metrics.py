"""Task accuracy metrics with the reference's semantics (ParaVT `rl/rewards/task_metrics.py`).

All three take two strings (model prediction, ground truth) and return a float in [0, 1]:

* `f1_score`: token F1 over *sets* of normalised tokens. Like the reference (and unlike
  SQuAD), the overlap is counted on sets but divided by the token-LIST lengths, so repeated
  tokens lower precision / recall: precision = |set(pred) & set(truth)| / len(pred tokens).
* `mcq_accuracy`: option-letter match (A-D), tolerant of "(B)", "Option B",
  "The answer is B", "B." and a bare letter word.
* `temporal_iou`: IoU of the first "s, e" decimal pair found in each string.

Deliberate difference: the reference raises `ValueError` when the first "s, e" pair it finds
is not a valid number (e.g. "1.2.3, 4" or "., 5"); here that scores 0. Nothing in this module
raises on any `str` input.
"""
from __future__ import annotations

import re

__all__ = ["normalize_text", "f1_score", "mcq_accuracy", "temporal_iou"]

_ARTICLE = re.compile(r"\b(?:a|an|the)\b")
_NOT_WORD_OR_SPACE = re.compile(r"[^\w\s]")


def normalize_text(text: str) -> str:
    """Strip, lower-case, replace whole-word a/an/the by a space, drop every character that
    is neither a word character nor whitespace, and collapse whitespace runs to one space
    (the steps and their order follow the reference)."""
    lowered = text.strip().lower()
    no_articles = _ARTICLE.sub(" ", lowered)
    no_punct = _NOT_WORD_OR_SPACE.sub("", no_articles)
    return " ".join(no_punct.split())


def f1_score(prediction: str, truth: str) -> float:
    """Token F1 with overlap measured on token sets (reference `compute_f1`).

    0 when either side has no tokens after normalisation or nothing is shared."""
    pred_tokens = normalize_text(prediction).split()
    true_tokens = normalize_text(truth).split()
    if not pred_tokens or not true_tokens:
        return 0.0
    n_common = len(set(pred_tokens).intersection(true_tokens))
    if n_common == 0:
        return 0.0
    precision = n_common / len(pred_tokens)
    recall = n_common / len(true_tokens)
    return 2 * precision * recall / (precision + recall)


# The first "s, e" pair of digit/dot runs, optionally inside square brackets.  Only the two
# groups matter; the brackets never change which pair is found.
_RANGE = re.compile(r"\[?\s*([\d.]+)\s*,\s*([\d.]+)\s*\]?")


def _first_range(text: str) -> tuple[float, float] | None:
    found = _RANGE.search(text)
    if found is None:
        return None
    try:
        return float(found.group(1)), float(found.group(2))
    except ValueError:  # "1.2.3" or "." : the reference raises here; we report no range
        return None


def temporal_iou(prediction: str, truth: str) -> float:
    """Temporal IoU of `[start, end]` intervals written as "s, e" (brackets optional, any
    surrounding text). 0 when either string has no parseable pair or an interval with
    end <= start (reference `compute_temporal_iou`)."""
    pred = _first_range(prediction)
    gold = _first_range(truth)
    if pred is None or gold is None:
        return 0.0
    (p0, p1), (g0, g1) = pred, gold
    if p1 <= p0 or g1 <= g0:
        return 0.0
    overlap = max(0.0, min(p1, g1) - max(p0, g0))
    union = (p1 - p0) + (g1 - g0) - overlap
    if union > 0:  # False for NaN (inf - inf), as in the reference
        return overlap / union
    return 0.0


# Tried in this order; the first pattern that matches decides (if its letter is wrong the
# next pattern is tried, exactly as the reference loops).
_MCQ_PATTERNS = (
    re.compile(r"^\(?([A-D])\)?$"),  # "B", "(B)"
    re.compile(r"[Tt]he answer is\s*\(?([A-D])\)?"),  # "The answer is B"
    re.compile(r"[Oo]ption\s*\(?([A-D])\)?"),  # "Option B", "option (B)"
    re.compile(r"^([A-D])[.):]"),  # "B.", "B)", "B: ..."
    re.compile(r"\b([A-D])\b"),  # first stand-alone capital A-D anywhere
)


def mcq_accuracy(prediction: str, truth: str) -> float:
    """1.0 if the prediction names the ground-truth option letter, else 0.0
    (reference `compute_mcq_acc`).

    The truth must be a single letter A-D after strip + upper-case (else 0). The prediction
    matches when, stripped and upper-cased, it equals the letter; otherwise each pattern
    above is searched once (first occurrence only) and wins if its letter is the truth.
    Note the patterns are case-sensitive on the letter, so a lower-case letter inside a
    sentence does not count, and the last pattern takes the FIRST stand-alone A-D, so
    "A is wrong, B" counts as A."""
    gold = truth.strip().upper()
    if len(gold) != 1 or gold not in "ABCD":
        return 0.0
    pred = prediction.strip()
    if pred.upper() == gold:
        return 1.0
    for pattern in _MCQ_PATTERNS:
        found = pattern.search(pred)
        if found is not None and found.group(1).upper() == gold:
            return 1.0
    return 0.0
