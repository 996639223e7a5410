"""Hypotheses about a sweep, written down before its runs, and their verdicts after.

A sweep's config file may define `hypotheses(arg)` beside `sweep(arg)`: a list of
`Hypothesis` (or dicts of its fields). `paravt-jax report` then adds a section that judges each
one on the finished arms by one rule: per seed, the difference between the arm's number and
what it is compared with (the same seed's arm of another group, a group of one run such as the
shared cold start, the arm's own other number, or a fixed threshold); over the seeds, its mean
and sample standard deviation. The verdict *holds* when the mean lies in the predicted direction
by more than one standard deviation, *fails* when it lies against it by more than one, and is
*inconclusive* otherwise (a mean of exactly 0 included); with fewer than two seeds there is no
spread to judge against and the verdict is *one seed*. Numbers are the report's (`ArmRun.numbers`:
`eval_tools_K4_accuracy`, `rl_format_compliance_late`, ...).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Protocol

from paravt_jax.config import config_file

DIRECTIONS = ("above", "below")
_SEED = re.compile(r"(?:^|,)seed=([^,]+)")


class HypothesisError(ValueError):
    pass


class Arm(Protocol):
    """What a verdict reads of one arm (the report's ArmRun: experiments/report.py)."""

    @property
    def name(self) -> str: ...

    @property
    def group(self) -> str: ...

    @property
    def finished(self) -> bool: ...

    @property
    def numbers(self) -> Mapping[str, float]: ...


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    name: str  # e.g. "H1 strong K=4"
    claim: str  # the prediction in words
    group: str  # the arms judged (a report group: the arm name without its seed)
    metric: str  # their number (ArmRun.numbers key)
    direction: str = "above"  # the predicted sign of (number - comparison): above | below
    against_group: str = ""  # compared with this group's arm of the same seed (or its only arm)
    against_metric: str = ""  # ... its number of this name (default: metric); alone: the arm's own
    threshold: float | None = None  # compared with a fixed value instead

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise HypothesisError(f"hypothesis {self.name!r}: direction {self.direction!r} is not one of {DIRECTIONS}")
        if self.threshold is not None and (self.against_group or self.against_metric):
            raise HypothesisError(f"hypothesis {self.name!r}: a threshold or a comparison, not both")
        if self.threshold is None and not (self.against_group or self.against_metric):
            raise HypothesisError(f"hypothesis {self.name!r}: give against_group, against_metric or threshold")

    def comparison(self) -> str:
        if self.threshold is not None:
            return f"{self.metric} vs {self.threshold:g}"
        other = self.against_metric or self.metric
        return f"{self.metric} vs {self.against_group + ' ' if self.against_group else 'its own '}{other}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    hypothesis: Hypothesis
    differences: tuple[float, ...]  # one per seed, in seed order
    mean: float | None
    std: float | None
    verdict: str  # holds | fails | inconclusive | one seed | not run


def seed_of(name: str) -> str:
    match = _SEED.search(name)
    return match.group(1) if match else ""


def judge(differences: Sequence[float], direction: str) -> tuple[float, float, str]:
    """(mean, sample std, verdict) of per-seed differences (std 0 and "one seed" for one)."""
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return mean, 0.0, "one seed"
    std = statistics.stdev(differences)
    signed = mean if direction == "above" else -mean
    if signed > std and signed != 0:
        return mean, std, "holds"
    if -signed > std and signed != 0:
        return mean, std, "fails"
    return mean, std, "inconclusive"


def _value(arm: Arm, metric: str) -> float | None:
    value = arm.numbers.get(metric)
    return None if value is None or not math.isfinite(value) else float(value)


def differences(h: Hypothesis, arms: Sequence[Arm]) -> list[float]:
    """Per seed of h.group's finished arms (seed order): number - comparison; arms without the
    number, or without a partner of their seed, are left out."""
    mine = sorted((a for a in arms if a.group == h.group and a.finished), key=lambda a: seed_of(a.name))
    others = [a for a in arms if a.group == h.against_group] if h.against_group else []
    # a group of one run (the shared cold start) stands for every seed; else the same seed's
    # finished arm (an unfinished one is no partner: its seed is left out)
    single = others[0] if len(others) == 1 else None
    by_seed = {seed_of(a.name): a for a in others if a.finished}
    out = []
    for arm in mine:
        value = _value(arm, h.metric)
        if h.threshold is not None:
            other = h.threshold
        else:
            partner = arm if not h.against_group else single or by_seed.get(seed_of(arm.name))
            partner = partner if partner is not None and partner.finished else None
            other = None if partner is None else _value(partner, h.against_metric or h.metric)
        if value is not None and other is not None:
            out.append(value - other)
    return out


def verdicts(hypotheses: Sequence[Hypothesis], arms: Sequence[Arm]) -> list[Verdict]:
    out = []
    for h in hypotheses:
        values = differences(h, arms)
        if not values:
            out.append(Verdict(h, (), None, None, "not run"))
            continue
        mean, std, verdict = judge(values, h.direction)
        out.append(Verdict(h, tuple(values), mean, std, verdict))
    return out


def as_hypotheses(entries: Sequence) -> list[Hypothesis]:
    """A config file's hypotheses(): Hypothesis objects or dicts of their fields."""
    out = []
    for entry in entries:
        if isinstance(entry, Hypothesis):
            out.append(entry)
        elif isinstance(entry, dict):
            try:
                out.append(Hypothesis(**entry))
            except TypeError as e:
                raise HypothesisError(f"hypothesis {entry.get('name', entry)!r}: {e}") from None
        else:
            raise HypothesisError(f"hypotheses() returned {type(entry).__name__}, not a Hypothesis or a dict")
    return out


def from_sweep_roots(directories: Sequence[str]) -> list[Hypothesis]:
    """The hypotheses of the sweeps whose roots are among `directories`: their sweep.json names
    the config file (`FILE:ARG`, relative to where the sweep ran, else to the root's parent
    directories) and the file's `hypotheses(arg)`, if it defines one."""
    out = []
    for root in directories:
        plan = os.path.join(root, "sweep.json")
        if not os.path.isfile(plan):
            continue
        with open(plan) as f:
            argument = json.load(f).get("config", "")
        path, _, arg = argument.partition(":")
        candidates = [path] if os.path.isabs(path) else [path] + [
            os.path.join(parent, path) for parent in _parents(os.path.abspath(root))]
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if found is None:
            continue  # the config file is not here (a copied sweep): no hypotheses section
        function = getattr(config_file(found), "hypotheses", None)
        if callable(function):
            out += as_hypotheses(function(arg or None))
    return out


def _parents(directory: str) -> list[str]:
    out = []
    while os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
        out.append(directory)
    return out


def markdown(results: Sequence[Verdict]) -> str:
    lines = ["## Hypotheses (written before the runs; verdict: the mean per-seed difference against one "
             "sample std)", "",
             "| hypothesis | claim | comparison | per seed | mean ± std | verdict |", "|---|---|---|---|---|---|"]
    for r in results:
        h = r.hypothesis
        seeds = " / ".join(f"{d:+.3f}" for d in r.differences) or "–"
        stats = "–" if r.mean is None else f"{r.mean:+.3f} ± {r.std:.3f}"
        lines.append(f"| {h.name} | {h.claim} | {h.group}: {h.comparison()} ({h.direction}) | {seeds} | {stats} | "
                     f"**{r.verdict}** |")
    return "\n".join(lines) + "\n"
