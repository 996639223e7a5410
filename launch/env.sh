#!/usr/bin/env bash
# Creates (or completes) the project's virtual environment in .venv when it is missing, when
# setup.py or requirements.lock changed since it was built, or when it lacks a requested extra.
# Source it or run it; it prints the python to use. Packages are installed at the exact
# versions of requirements.lock (pip constraints; launch/lock.sh writes it), so two fresh
# clones get the same packages; packages of extras the lock does not cover (gpu) resolve from
# setup.py's ranges.
#   PARAVT_VENV   where the environment lives (default: <repo>/.venv)
#   PARAVT_EXTRAS comma-separated pip extras to install (default: test; empty: the runtime
#                 alone, what launch/local.sh asks for)
#   PARAVT_LOCK   0: install from setup.py's version ranges, without the lock
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PARAVT_VENV:-$ROOT/.venv}"
EXTRAS="${PARAVT_EXTRAS-test}"
LOCK="$ROOT/requirements.lock"
CONSTRAINTS=()
if [[ "${PARAVT_LOCK:-1}" != 0 ]]; then CONSTRAINTS=(-c "$LOCK"); fi
HASH="$(cat "$ROOT/setup.py" "${CONSTRAINTS[@]:+$LOCK}" | sha256sum | cut -c1-16)"
# One stamp per completed install of this setup.py: .paravt-setup-<hash>-<extras or none>.
# A request is met when one stamp's extras include every requested extra.
satisfied() {
  local stamp have want
  [[ -x "$VENV/bin/python" ]] || return 1
  for stamp in "$VENV"/.paravt-setup-"$HASH"-*; do
    [[ -f "$stamp" ]] || continue
    have=",${stamp##*/.paravt-setup-"$HASH"-},"
    for want in ${EXTRAS//,/ }; do
      [[ "$have" == *",$want,"* ]] || continue 2
    done
    return 0
  done
  return 1
}
if ! satisfied; then
  echo "[env] building $VENV (extras: ${EXTRAS:-none})" >&2
  [[ -x "$VENV/bin/python" ]] || "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >&2
  # the test extra pins torch and torchvision exactly (CUDA builds that run on CPU; setup.py)
  "$VENV/bin/pip" install -q --no-compile -e "$ROOT${EXTRAS:+[$EXTRAS]}" "${CONSTRAINTS[@]}" >&2
  # Byte-compiled on every core for the extras (the test suite starts hundreds of processes),
  # not for the runtime alone: the main job's one process compiles what it imports (~2 s), where
  # pip's one-core pass over every installed file took ~26 s of a ~50 s build
  if [[ -n "$EXTRAS" ]]; then
    "$VENV/bin/python" -m compileall -qq -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >&2 || true
  fi
  find "$VENV" -maxdepth 1 -name '.paravt-setup-*' ! -name ".paravt-setup-$HASH-*" -delete
  touch "$VENV/.paravt-setup-$HASH-${EXTRAS:-none}"
fi
echo "$VENV/bin/python"
