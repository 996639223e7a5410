#!/usr/bin/env bash
# Writes requirements.lock: the exact version of every package that setup.py's runtime and the
# test extra resolve to today, from a fresh virtual environment built without the lock.
# launch/env.sh installs through it (pip constraints), so two fresh clones get the same packages.
#   bash launch/lock.sh            # rewrite requirements.lock (then commit it)
# A local build label is dropped (2.13.0+cpu -> ==2.13.0, which the local build satisfies).
# Versions only, no hashes: a local wheel's hash is not the index's.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TMP="$(mktemp -d)"
# a non-editable install builds in the checkout's build/: removed afterwards unless it was there
KEEP_BUILD=0; [[ -e "$ROOT/build" ]] && KEEP_BUILD=1
trap 'rm -rf "$TMP"; [[ $KEEP_BUILD == 1 ]] || rm -rf "$ROOT/build"' EXIT
"${PYTHON:-python3}" -m venv "$TMP/venv"
"$TMP/venv/bin/pip" install -q --upgrade pip >&2
"$TMP/venv/bin/pip" install -q "$ROOT[test]" >&2
{
  echo "# Exact versions of the runtime and the test extra (x86_64 Linux, Python $("$TMP/venv/bin/python" -c 'import platform; print(platform.python_version())')),"
  echo "# written by launch/lock.sh; launch/env.sh installs through it (pip -c). Regenerate, do not edit."
  "$TMP/venv/bin/pip" freeze --exclude-editable | grep -iv '^paravt[-_]jax' | sed -E 's/^([^=]+==[^+]+)\+.*$/\1/' | LC_ALL=C sort -f
} > "$ROOT/requirements.lock"
echo "wrote $ROOT/requirements.lock ($(grep -c '==' "$ROOT/requirements.lock") packages)"
