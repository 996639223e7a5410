#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv when it is missing or
# setup.py changed since it was built. Source it or run it; it prints the python to use.
#   PARAVT_VENV   where the environment lives (default: <repo>/.venv)
#   PARAVT_EXTRAS pip extras to install (default: test)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PARAVT_VENV:-$ROOT/.venv}"
EXTRAS="${PARAVT_EXTRAS:-test}"
STAMP="$VENV/.paravt-setup-$(sha256sum "$ROOT/setup.py" | cut -c1-16)-$EXTRAS"
if [[ ! -x "$VENV/bin/python" || ! -f "$STAMP" ]]; then
  echo "[env] building $VENV (extras: $EXTRAS)" >&2
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >&2
  # torch is pinned to the CPU wheel in the test extra; never let pip pick a CUDA build.
  "$VENV/bin/pip" install -q -e "$ROOT[$EXTRAS]" >&2
  rm -f "$VENV"/.paravt-setup-*
  touch "$STAMP"
fi
echo "$VENV/bin/python"
