#!/usr/bin/env bash
# The test suite. Builds .venv if needed; extra arguments go to pytest.
#   bash launch/test.sh                 # default suite (slow tests excluded)
#   bash launch/test.sh -m slow         # only the slow tests
#   PARAVT_TEST_WORKERS  pytest-xdist worker processes (default: auto = one per core; 0 = none)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash launch/env.sh)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# glibc's allocator on transparent huge pages where the kernel offers them (THP "madvise" or
# "always"): XLA:CPU's buffers fault in 2 MiB pages, not 4 KiB ones; same bits, faster steps
# (bench/host_pages.py)
export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1"
exec "$PY" -m pytest -n "${PARAVT_TEST_WORKERS:-auto}" --dist worksteal "$@"
