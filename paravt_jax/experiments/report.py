"""`paravt-jax report DIR... [--out=PATH_PREFIX]`: one comparison table of sweep arms.

    paravt-jax report runs/ablations                    # a sweep root: arms are its subdirectories
    paravt-jax report runs/a runs/b --out=runs/compare  # or arm directories

Each arm directory holds a main-job run (`summary.json`, `rl/metrics.jsonl`,
`sft/metrics.jsonl`; `sweep_arm.json` when the sweep started it). Arms that differ only by
seed form a group; every number is given per group as mean and spread over its arms (the
Markdown shows mean ± sample std, the CSV mean, std, min and max). Written:
  PREFIX.md   held-out evaluation of the final model (accuracy with and without tools at each
              K, format compliance, kappa, calls per tool turn), RL training metrics at the
              last step and at the best step (reward and its parts, compliance, kappa, calls),
              and run facts (arms, RL/SFT steps, wall time);
  PREFIX.csv  the same, one row per group, one column per number and statistic;
  PREFIX_<metric>.png  the RL metric over steps, one line per group (mean over seeds, the
              band spans min to max): reward, accuracy reward, format compliance, kappa,
              calls per tool turn, and the periodic held-out accuracy with and without tools.
The training table also gives each RL metric's mean over the first and the last third of the
steps (early, late): the trend, less noisy than one step. An "Environment" section compares the
arms' manifests (summary.json or run_config.json; paravt_jax/infra/reproducibility.py) and names every
field in which they differ besides the seed (commit, packages, XLA:CPU threads, data, ...): arms
compared across environments are flagged, not silently averaged.
Default PREFIX: DIR/report for one DIR, else ./report.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
from collections.abc import Sequence

from paravt_jax.experiments import hypotheses
from paravt_jax.experiments.plots import read_jsonl, thirds
from paravt_jax.infra import reproducibility

# A sweep's layout (paravt_jax.experiments.sweep writes it, this module reads it): the shared
# cold-start runs are the arm directories whose names start so, listed first.
SHARED_SFT_DIR = "_sft"

# Per-step RL metrics (rl/metrics.jsonl keys without the "rl/" prefix): final and best.
TRAIN_METRICS = ("reward", "acc_reward", "format_reward", "tool_reward", "anchor_reward",
                 "format_compliance", "kappa", "calls_per_tool_turn")
# The trainer's periodic held-out evaluation (rl.eval_every), when it ran.
PERIODIC_METRICS = ("eval_notools/accuracy", "eval_tools/accuracy", "eval_tools/format_compliance",
                    "eval_tools/kappa", "eval_tools/calls_per_turn")
PLOT_METRICS = ("reward", "acc_reward", "format_compliance", "kappa", "calls_per_tool_turn",
                "eval_tools/accuracy", "eval_notools/accuracy")
_SEED_PART = re.compile(r"(^|,)seed=[^,]*")
_EVAL_KEY = re.compile(r"^eval_(tools|notools)_K(\d+)_(\w+)$")
# The periodic evaluation at its other K (rl.evals.eval.nframes beyond the first): curves only.
_PERIODIC_AT_K = re.compile(r"^rl/(eval_(?:tools|notools)_K\d+/(?:accuracy|format_compliance|kappa|calls_per_turn))$")


class ReportError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class ArmRun:
    """One arm's results. numbers: flat name -> value; curves: RL metric -> [(step, value)]."""
    name: str
    group: str
    directory: str
    finished: bool
    numbers: dict
    curves: dict
    manifest: dict = dataclasses.field(default_factory=dict)  # reproducibility.manifest ({} if none)


def is_arm_dir(directory: str) -> bool:
    return any(os.path.exists(os.path.join(directory, p))
               for p in ("summary.json", "sweep_arm.json", os.path.join("rl", "metrics.jsonl")))


def find_arm_dirs(directories: Sequence[str]) -> list[str]:
    """Arm directories, in sweep order where a sweep.json says it (the shared SFT first),
    else by name. A directory that is no arm is searched one level down."""
    out = []
    for directory in directories:
        if not os.path.isdir(directory):
            raise ReportError(f"report: {directory!r} is not a directory")
        if is_arm_dir(directory):
            out.append(directory)
            continue
        children = sorted(c for c in os.listdir(directory) if is_arm_dir(os.path.join(directory, c)))
        order = {}
        plan = os.path.join(directory, "sweep.json")
        if os.path.isfile(plan):
            with open(plan) as f:
                order.update({a["name"]: i for i, a in enumerate(json.load(f).get("arms", []))})
        # the shared SFT runs (`_sft`, `_sft,steps=200`) first, then the arms in sweep order
        children.sort(key=lambda c: (not c.startswith(SHARED_SFT_DIR), order.get(c, len(order)), c))
        if not children:
            raise ReportError(f"report: {directory!r} holds no arm (no summary.json, sweep_arm.json or "
                              "rl/metrics.jsonl in it or its subdirectories)")
        out += [os.path.join(directory, c) for c in children]
    return out


def group_of(name: str) -> str:
    """An arm name without its seed part: `vanilla,seed=1` -> `vanilla`."""
    return _SEED_PART.sub("", name).strip(",") or "base"


def _by_step(records: list[dict]) -> list[dict]:
    """One record per step, the last written winning (a resumed run rewrites its steps)."""
    steps = {}
    for r in records:
        if "step" in r:
            steps[int(r["step"])] = r
    return [steps[s] for s in sorted(steps)]


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(float(value)) else None


def eval_numbers(rows: list[dict]) -> dict:
    """summary.json "eval" rows -> eval_{tools|notools}_K{k}_{metric}."""
    out = {}
    for row in rows:
        tag = f"eval_{'tools' if row['tools'] else 'notools'}_K{row['nframes']}"
        metrics = ("accuracy", "format_compliance") + (("kappa", "calls_per_turn") if row["tools"] else ())
        for m in metrics:
            if _number(row.get(m)) is not None:
                out[f"{tag}_{m}"] = float(row[m])
    return out


def load_arm(directory: str) -> ArmRun:
    name = os.path.basename(os.path.normpath(directory))
    group = group_of(name)
    record_path = os.path.join(directory, "sweep_arm.json")
    if os.path.isfile(record_path):
        with open(record_path) as f:
            group = json.load(f).get("group", group)
    summary = {}
    summary_path = os.path.join(directory, "summary.json")
    if os.path.isfile(summary_path):
        try:
            with open(summary_path) as f:
                summary = json.load(f)
        except ValueError:  # being written right now
            summary = {}
    rl = _by_step(read_jsonl(os.path.join(directory, "rl", "metrics.jsonl")))
    sft = _by_step(read_jsonl(os.path.join(directory, "sft", "metrics.jsonl")))
    numbers = eval_numbers(summary.get("eval", []))
    numbers["rl_steps"] = float(len(rl))
    numbers["sft_steps"] = float(len(sft))
    if _number(summary.get("minutes")) is not None:
        numbers["minutes"] = float(summary["minutes"])
    step_seconds = [_number(r.get("rl/step_s")) for r in rl]
    if rl and None not in step_seconds:
        numbers["rl_minutes"] = sum(step_seconds) / 60
    if sft and _number(sft[-1].get("sft/loss")) is not None:
        numbers["sft_loss_final"] = float(sft[-1]["sft/loss"])
    curves = {}
    at_k = sorted({m.group(1) for r in rl for m in map(_PERIODIC_AT_K.match, r) if m})
    for metric in TRAIN_METRICS + PERIODIC_METRICS + tuple(at_k):
        points = [(int(r["step"]), float(r[f"rl/{metric}"])) for r in rl
                  if _number(r.get(f"rl/{metric}")) is not None]
        if points:
            curves[metric] = points
            column = "rl_" + metric.replace("/", "_")
            numbers[f"{column}_final"] = points[-1][1]
            numbers[f"{column}_best"] = max(v for _, v in points)
            trend = thirds([v for _, v in points]) if metric in TRAIN_METRICS else None
            if trend is not None:
                numbers[f"{column}_early"], numbers[f"{column}_late"] = trend
    return ArmRun(name, group, directory, "eval" in summary, numbers, curves, arm_manifest(directory, summary))


def arm_manifest(directory: str, summary: dict) -> dict:
    """The arm's manifest: summary.json's, else run_config.json's (a run still going), else {}."""
    if summary.get("manifest"):
        return summary["manifest"]
    try:
        with open(os.path.join(directory, "run_config.json")) as f:
            return json.load(f).get("manifest") or {}
    except (OSError, ValueError):
        return {}


# Manifest fields that differ between arms by design, or that only describe the host.
UNCOMPARED = ("seed", "cpu.usable", "cpu.model", "lock.mismatched")


def environment(arms: Sequence[ArmRun]) -> list[str]:
    """Markdown lines: whether the arms ran under one environment, else each differing field
    with its value per arm (reproducibility.differences against the first arm)."""
    known = [arm for arm in arms if arm.manifest]
    lines = ["## Environment", ""]
    missing = [arm.name for arm in arms if not arm.manifest]
    if missing:
        lines.append(f"No manifest (run before runs recorded one): {', '.join(missing)}.")
    if not known:
        return lines
    first = known[0]
    fields = []
    for arm in known[1:]:
        for field in reproducibility.differing_fields(first.manifest, arm.manifest):
            if field not in fields and not any(field == u or field.startswith(u + ".") for u in UNCOMPARED):
                fields.append(field)
    if not fields:
        m = first.manifest
        lines.append(f"All {len(known)} arms with a manifest ran under one environment: commit "
                     f"{str(m.get('commit', '?'))[:12]}{' (dirty)' if m.get('dirty') else ''}, lock "
                     f"{m.get('lock', {}).get('sha256')}, {m.get('device', {}).get('kind')}, XLA:CPU threads "
                     f"{m.get('cpu', {}).get('xla_threads')}.")
        return lines
    lines += [f"**The arms ran under different environments** in {len(fields)} field(s); numbers may differ "
              "for that reason alone:", "", "| field | " + " | ".join(a.name for a in known) + " |",
              "|---|" + "---|" * len(known)]
    for field in fields:
        values = [reproducibility.flatten(a.manifest).get(field, "<absent>") for a in known]
        lines.append(f"| {field} | " + " | ".join(str(v) for v in values) + " |")
    return lines


@dataclasses.dataclass(frozen=True)
class GroupStats:
    """Arms of one group and, per number, (mean, std, min, max, count) over the arms that have it."""
    group: str
    arms: tuple[str, ...]
    finished: int
    stats: dict


def summarize_groups(arms: Sequence[ArmRun]) -> list[GroupStats]:
    order, members = [], {}
    for arm in arms:
        if arm.group not in members:
            order.append(arm.group)
        members.setdefault(arm.group, []).append(arm)
    out = []
    for group in order:
        runs = members[group]
        keys = sorted({k for r in runs for k in r.numbers})
        stats = {}
        for key in keys:
            values = [r.numbers[key] for r in runs if key in r.numbers]
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
            stats[key] = (mean, std, min(values), max(values), len(values))
        out.append(GroupStats(group, tuple(r.name for r in runs), sum(r.finished for r in runs), stats))
    return out


def _columns(groups: Sequence[GroupStats]) -> list[str]:
    """Number columns in a fixed, readable order: run facts, eval, training, periodic eval."""
    present = {k for g in groups for k in g.stats}

    def rank(key):
        for i, prefix in enumerate(("rl_steps", "sft_steps", "minutes", "rl_minutes", "sft_loss", "eval_",
                                    "rl_eval_", "rl_")):
            if key.startswith(prefix):
                return i, key
        return 99, key

    return sorted(present, key=rank)


def write_csv(groups: Sequence[GroupStats], path: str) -> str:
    columns = _columns(groups)
    header = ["group", "arms", "finished"] + [f"{c}.{s}" for c in columns for s in ("mean", "std", "min", "max")]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for g in groups:
            row = [g.group, " ".join(g.arms), g.finished]
            for c in columns:
                row += list(g.stats[c][:4]) if c in g.stats else ["", "", "", ""]
            writer.writerow([repr(v) if isinstance(v, float) else v for v in row])
    return path


def _cell(stats: tuple | None, digits: int = 3) -> str:
    if stats is None:
        return "–"
    mean, std, _, _, count = stats
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if count > 1 else f"{mean:.{digits}f}"


def _table(groups: Sequence[GroupStats], columns: Sequence[tuple], digits: int = 3) -> list[str]:
    """columns: (key, title) or (key, title, digits)."""
    lines = ["| group | " + " | ".join(c[1] for c in columns) + " |", "|---|" + "---|" * len(columns)]
    for g in groups:
        cells = [_cell(g.stats.get(c[0]), c[2] if len(c) > 2 else digits) for c in columns]
        lines.append(f"| {g.group} | " + " | ".join(cells) + " |")
    return lines


def markdown(groups: Sequence[GroupStats]) -> str:
    present = {k for g in groups for k in g.stats}
    short = {"accuracy": "acc", "format_compliance": "fmt", "kappa": "kappa", "calls_per_turn": "calls"}
    found = [m.groups() for m in map(_EVAL_KEY.match, present) if m and m.group(3) in short]
    ordered = sorted(found, key=lambda t: (list(short).index(t[2]), t[0] == "tools", int(t[1])))
    eval_columns = [(f"eval_{tools}_K{k}_{m}", f"{'tools' if tools == 'tools' else 'no tools'} K={k} {short[m]}")
                    for tools, k, m in ordered]
    train_columns = [(f"rl_{m}_{which}", f"{m} {which}") for m in TRAIN_METRICS for which in ("final", "best")
                     if f"rl_{m}_{which}" in present]
    trend_columns = [(f"rl_{m}_{which}", f"{m} {which}") for m in TRAIN_METRICS for which in ("early", "late")
                     if f"rl_{m}_{which}" in present]
    periodic = [(f"rl_{m.replace('/', '_')}_{which}", f"{m} {which}") for m in PERIODIC_METRICS
                for which in ("final", "best") if f"rl_{m.replace('/', '_')}_{which}" in present]
    run_columns = [c for c in (("rl_steps", "RL steps", 0), ("sft_steps", "SFT steps", 0),
                               ("minutes", "wall min", 2), ("rl_minutes", "RL min", 2),
                               ("sft_loss_final", "SFT loss", 3)) if c[0] in present]
    lines = ["# Sweep comparison", "",
             "Mean ± sample std over the arms of each group (arms that differ only by seed); one "
             "value when the group has one arm.", "", "## Runs", "",
             "| group | arms | finished |", "|---|---|---|"]
    lines += [f"| {g.group} | {' '.join(g.arms)} | {g.finished}/{len(g.arms)} |" for g in groups]
    if run_columns:
        lines += [""] + _table(groups, run_columns)
    if eval_columns:
        lines += ["", "## Held-out evaluation of the final model (greedy; acc = accuracy, fmt = format "
                  "compliance, kappa = tool-call rate, calls = calls per tool turn)", ""]
        lines += _table(groups, eval_columns)
    if train_columns:
        lines += ["", "## RL training: last step (final) and best step", ""] + _table(groups, train_columns)
    if trend_columns:
        lines += ["", "## RL training: mean over the first third of the steps (early) and the last third (late)",
                  ""] + _table(groups, trend_columns)
    if periodic:
        lines += ["", "## Periodic held-out evaluation during RL: last and best", ""] + _table(groups, periodic)
    return "\n".join(lines) + "\n"


def groups_in_order(arms: Sequence[ArmRun]) -> list[str]:
    out = []
    for arm in arms:
        if arm.group not in out:
            out.append(arm.group)
    return out


def draw_metric(ax, arms: Sequence[ArmRun], metric: str) -> bool:
    """Draws one RL metric on `ax`: per group, the mean over its arms at every step and a band
    from min to max. Returns whether any group had the metric (nothing is drawn otherwise)."""
    from matplotlib.ticker import MaxNLocator

    drawn = False
    for group in groups_in_order(arms):
        per_step = {}
        for arm in arms:
            if arm.group == group:
                for step, value in arm.curves.get(metric, []):
                    per_step.setdefault(step, []).append(value)
        if not per_step:
            continue
        steps = sorted(per_step)
        means = [sum(per_step[s]) / len(per_step[s]) for s in steps]
        line, = ax.plot([s + 1 for s in steps], means, marker="o", label=group)
        if any(len(per_step[s]) > 1 for s in steps):
            ax.fill_between([s + 1 for s in steps], [min(per_step[s]) for s in steps],
                            [max(per_step[s]) for s in steps], color=line.get_color(), alpha=0.2)
        drawn = True
    if drawn:
        ax.set_title(f"rl/{metric}")
        ax.set_xlabel("RL step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    return drawn


def plot_groups(arms: Sequence[ArmRun], prefix: str, metrics: Sequence[str] = PLOT_METRICS) -> list[str]:
    """One PNG per metric (draw_metric), written with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for metric in metrics:
        fig, ax = plt.subplots(figsize=(6, 4))
        if draw_metric(ax, arms, metric):
            fig.tight_layout()
            path = f"{prefix}_{metric.replace('/', '_')}.png"
            fig.savefig(path, dpi=80)
            paths.append(path)
        plt.close(fig)
    return paths


def write_report(directories: Sequence[str], prefix: str) -> dict:
    """Reads the arms under directories; writes PREFIX.md, PREFIX.csv and PREFIX_<metric>.png.
    A sweep whose config file defines hypotheses() gets their verdicts in PREFIX.md
    (experiments/hypotheses.py)."""
    arms = [load_arm(d) for d in find_arm_dirs(directories)]
    groups = summarize_groups(arms)
    if os.path.dirname(prefix):
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
    text = markdown(groups)
    at_k = sorted({m for arm in arms for m in arm.curves if "_K" in m and m.endswith("/accuracy")})
    claims = hypotheses.from_sweep_roots(directories)
    if claims:
        text += "\n" + hypotheses.markdown(hypotheses.verdicts(claims, arms))
    text += "\n" + "\n".join(environment(arms)) + "\n"
    with open(f"{prefix}.md", "w") as f:
        f.write(text)
    return {"markdown": f"{prefix}.md", "csv": write_csv(groups, f"{prefix}.csv"),
            "plots": plot_groups(arms, prefix, PLOT_METRICS + tuple(at_k)), "text": text, "groups": groups}
