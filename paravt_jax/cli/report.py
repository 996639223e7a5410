"""`paravt-jax report DIR...`: tables and plots of swept workdirs (paravt_jax/experiments/report.py)."""
from __future__ import annotations

import os
from collections.abc import Sequence

from absl import logging

from paravt_jax.cli.flags import HelpShown, UsageError, wants_help
from paravt_jax.experiments import report

REPORT_USAGE = "paravt-jax report DIR... [--out=PATH_PREFIX]"


def main(argv: Sequence[str]) -> dict:
    """argv = [prog, DIR..., --out=PREFIX]."""
    args = list(argv[1:])
    out = ""
    directories = []
    if wants_help(argv):
        print(f"usage: {REPORT_USAGE}\n\nTables (markdown, CSV) and plots comparing the arms of swept "
              "workdirs.", flush=True)
        raise HelpShown()
    for a in args:
        if a.startswith("--out="):
            out = a.split("=", 1)[1]
        elif a.startswith("-"):
            raise UsageError(f"report: unknown flag {a!r}; usage: {REPORT_USAGE}")
        else:
            directories.append(a)
    if not directories:
        raise SystemExit("report: give at least one sweep root or arm directory")
    prefix = out or (os.path.join(directories[0], "report") if len(directories) == 1 else "report")
    try:
        result = report.write_report(directories, prefix)
    except report.ReportError as e:
        raise SystemExit(str(e)) from None
    print(result["text"], flush=True)
    logging.info(f"[report] {result['markdown']} {result['csv']} " + " ".join(result["plots"]))
    return result
