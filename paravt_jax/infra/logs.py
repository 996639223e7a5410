"""Where log lines go and how they read: progress, notices and warnings, through absl logging.

Call sites write `from absl import logging` and `logging.info("[rl] resumed from ...")` or
`logging.warning(...)`, the job's tag in brackets first ([run], [sft], [rl], [data], [workdir],
[sweep], ...; the per-step metrics line is `[rl 3/10] loss=...`). This module formats them once,
on one line each, as

    I1203 05:21:52 [rl] resumed from runs/tiny/rl/checkpoints at step 2
    W1203 05:21:58 [rl] step 3 compiled 1 programs in 2.1 s: jit(grads) ...

(the level's letter as in absl/glog, month and day, local time, the message), and writes them to
stderr. Stdout is left to what a command outputs: result tables, JSON, help, generated text.

Multi-process runs log once: process 0 logs everything, every other process only its warnings
and errors (a video that process could not read concerns its own share of the step), marked
`[process i]`. The process index is asked of JAX only once its distributed runtime is up
(before, every process counts as process 0), so logging never starts a JAX backend.

`install()` runs when the package is imported (paravt_jax/__init__.py): it lets absl's logger
pass INFO and puts one handler on the root logger. That handler writes this package's lines and
every library's warnings and errors (what Python would print bare without a handler), never
other libraries' INFO (orbax's per-checkpoint chatter); and on the root logger it stops absl
from adding a second, unformatted handler there (`logging.basicConfig` on the first absl call).
Under an absl app (`absl.app.run` puts absl's own handler on the root logger, with its flags
--logtostderr, --log_dir, ...) that handler writes every line and this one stands aside.
"""
from __future__ import annotations

import logging as std_logging
import os
import sys
import time

from absl import logging

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # paravt_jax/ (this file: infra/)
LETTERS = {std_logging.DEBUG: "D", std_logging.INFO: "I", std_logging.WARNING: "W", std_logging.ERROR: "E",
           std_logging.CRITICAL: "F"}
_INDEX: int | None = None  # this process's index, once the distributed runtime is up


def process_index() -> int:
    """This process's index in a multi-process run, 0 before the distributed runtime starts
    (or in a single process); never starts a JAX backend."""
    global _INDEX
    if _INDEX is None:
        import jax

        if not jax.distributed.is_initialized():
            return 0
        _INDEX = jax.process_index()
    return _INDEX


def line(record: std_logging.LogRecord) -> str:
    """One record as the line this module writes (without the newline)."""
    letter = LETTERS.get(record.levelno, record.levelname[:1])
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
    index = process_index()
    where = f" [process {index}]" if index else ""
    text = record.getMessage()
    if record.exc_info:
        text += "\n" + std_logging.Formatter().formatException(record.exc_info)
    return f"{letter}{stamp}{where} {text}"


def shown(record: std_logging.LogRecord) -> bool:
    """Whether this module's handler writes the record (see the module docstring)."""
    if logging.get_absl_handler() in std_logging.root.handlers:
        return False  # an absl app: absl's handler writes it
    if record.levelno >= std_logging.WARNING:
        return True
    return record.pathname.startswith(PACKAGE) and process_index() == 0


class Handler(std_logging.Handler):
    """Writes shown records to the current sys.stderr (looked up per line, so a redirected or
    captured stderr gets them)."""

    def filter(self, record):
        return shown(record) and super().filter(record)

    def format(self, record):
        return line(record)

    def emit(self, record):
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


def install() -> None:
    """Puts one Handler on the root logger and lets absl's logger pass INFO unless its level is
    already set (absl's --verbosity, `logging.set_verbosity`). Idempotent."""
    if not any(isinstance(h, Handler) for h in std_logging.root.handlers):
        std_logging.root.addHandler(Handler())
    logger = logging.get_absl_logger()
    if logger.level == std_logging.NOTSET:
        logger.setLevel(std_logging.INFO)
