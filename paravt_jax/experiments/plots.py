"""PNG curves of a run from its metrics.jsonl files (matplotlib, Agg backend)."""
from __future__ import annotations

import io
import json

from paravt_jax import storage

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


def plot_run(metrics_files: dict[str, str], out_png: str, curves=CURVES) -> str | None:
    """One panel per metric found; one line per phase (e.g. {"sft": ..., "rl": ...})."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for phase, path in metrics_files.items():
        for record in read_jsonl(path):
            for name in curves:
                key = f"{phase}/{name}"
                if key in record and isinstance(record[key], (int, float)):
                    series.setdefault(name, {}).setdefault(phase, []).append((record["step"], record[key]))
    if not series:
        return None
    names = [n for n in curves if n in series]
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for phase, points in series[name].items():
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker=".", label=phase)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=80)
    plt.close(fig)
    storage.write_atomic(out_png, png.getvalue())
    return out_png
