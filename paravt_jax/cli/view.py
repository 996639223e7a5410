"""`paravt-jax view WORKDIR`: static HTML pages of a run's episode logs (paravt_jax/experiments/view.py)."""
from __future__ import annotations

from collections.abc import Sequence

from absl import logging

from paravt_jax.cli.flags import HelpShown, UsageError, wants_help
from paravt_jax.experiments import view


def main(argv: Sequence[str]) -> dict:
    """argv = [prog, WORKDIR, --step=S, --out=DIR]."""
    if wants_help(argv):
        print(f"usage: {view.VIEW_USAGE}\n\nStatic HTML pages of a run's episode logs (rl/episodes/step_XXXXXX.jsonl, "
              "eval/episodes.jsonl): index.html, one page per RL step, eval.html. --step renders one step; "
              "--out is the output directory (default WORKDIR/view).", flush=True)
        raise HelpShown()
    workdirs, out, step = [], "", None
    for a in argv[1:]:
        if a.startswith("--out="):
            out = a.split("=", 1)[1]
        elif a.startswith("--step="):
            try:
                step = int(a.split("=", 1)[1])
            except ValueError:
                raise UsageError(f"view: --step must be an integer, got {a.split('=', 1)[1]!r}") from None
        elif a.startswith("-"):
            raise UsageError(f"view: unknown flag {a!r}; usage: {view.VIEW_USAGE}")
        else:
            workdirs.append(a)
    if len(workdirs) != 1:
        raise UsageError(f"view: give one WORKDIR; usage: {view.VIEW_USAGE}")
    try:
        result = view.render(workdirs[0], out, step)
    except view.ViewError as e:
        raise SystemExit(str(e)) from None
    logging.info(f"[view] {result['episodes']} episodes, {result['thumbnails']} thumbnails: {result['index']}")
    for video, reason in result["missing_videos"].items():
        logging.warning(f"[view] no thumbnails from {video}: {reason}")
    return result
