"""PNG curves of a run from its metrics.jsonl files (matplotlib, Agg backend)."""
from __future__ import annotations

import io
import json

from paravt_jax.infra import storage

CURVES = ("loss", "reward", "acc_reward", "format_compliance", "kappa", "calls_per_tool_turn",
          "grad_norm", "response_length")


def thirds(values) -> tuple[float, float] | None:
    """The mean over the first and over the last third of a curve's values (None under 3
    values): its trend, steadier than any one point."""
    third = len(values) // 3
    if not third:
        return None
    return sum(values[:third]) / third, sum(values[-third:]) / third


def read_jsonl(path: str) -> list[dict]:
    if not storage.isfile(path):
        return []
    return [json.loads(line) for line in storage.read_text(path).splitlines() if line.strip()]


# the held-out accuracy a run with rl.eval_every > 0 logs over RL steps: (metric, label)
HELD_OUT = (("eval_tools/accuracy", "with tools"), ("eval_notools/accuracy", "without tools"))


def phase_series(metrics_files: dict[str, str], curves=CURVES) -> dict[str, dict[str, list]]:
    """{phase: {metric: [(step, value), ...]}} of every curve (and held-out accuracy) logged."""
    out: dict[str, dict[str, list]] = {}
    names = tuple(curves) + tuple(name for name, _ in HELD_OUT)
    for phase, path in metrics_files.items():
        for record in read_jsonl(path):
            for name in names:
                value = record.get(f"{phase}/{name}")
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out.setdefault(phase, {}).setdefault(name, []).append((record["step"], value))
    return out


HELD_OUT_PANEL = "held-out accuracy"


def panel_rows(series: dict, phases: list[str], curves=CURVES, cols: int = 4) -> list[tuple[str, list[str]]]:
    """The figure's rows: (phase, up to `cols` panel names), each phase on rows of its own:
    its curves, then `HELD_OUT_PANEL` where it evaluated periodically."""
    rows = []
    for phase in phases:
        found = series.get(phase, {})
        names = [n for n in curves if n in found]
        if any(name in found for name, _ in HELD_OUT):
            names.append(HELD_OUT_PANEL)
        rows += [(phase, names[i:i + cols]) for i in range(0, len(names), cols)]
    return rows


def plot_run(metrics_files: dict[str, str], out_png: str, curves=CURVES) -> str | None:
    """Each phase (e.g. {"sft": ..., "rl": ...}) on rows of its own, on its own step axis: one
    panel per metric it logged, and where it evaluated periodically a panel of its held-out
    accuracy with and without tools over its steps. None when nothing was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    series = phase_series(metrics_files, curves)
    layout = panel_rows(series, list(metrics_files), curves)
    if not layout:
        return None
    cols = max(len(names) for _, names in layout)
    fig, axes = plt.subplots(len(layout), cols, figsize=(4 * cols, 3 * len(layout)), squeeze=False)
    for row, (phase, names) in zip(axes, layout):
        found = series[phase]
        for ax, name in zip(row, names):
            if name == HELD_OUT_PANEL:
                for metric, label in HELD_OUT:
                    if metric in found:
                        xs, ys = zip(*found[metric])
                        ax.plot(xs, ys, marker="o", label=label)
                ax.set_ylim(-0.02, 1.02)
                ax.legend(fontsize=7)
            else:
                xs, ys = zip(*found[name])
                ax.plot(xs, ys, marker=".")
            ax.set_title(f"{phase}: {name}")
            ax.set_xlabel(f"{phase} step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, not fractions of one
        for ax in row[len(names):]:
            ax.axis("off")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=80)
    plt.close(fig)
    storage.write_atomic(out_png, png.getvalue())
    return out_png
