#!/usr/bin/env bash
# The main job on this machine. Builds .venv if needed, then runs
#   paravt-jax <command> --config=<config> [overrides...]
# Default: the main job on the built-in toy task (configs/paragrpo.py:toy). Examples:
#   bash launch/local.sh
#   bash launch/local.sh forward --config=configs/base.py:small125m --config.model.init=random --config.model.dtype=bfloat16
#   bash launch/local.sh report runs/ablations   # any command; run/sft/train/export/generate/plan default to the toy config
#   DRY_RUN=1 bash launch/local.sh      # print the command instead of running it
#   bash launch/local.sh --help         # this text
# Several hosts or GPUs: launch/gpu.sh; a Cloud TPU slice: launch/tpu_pod.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
COMMAND="${1:-run}"; shift || true
ARGS=("$@")
# the default config of the commands that read a run's config; the others (eval, sweep: configs of
# their own; report, view: a workdir; --help) get their arguments as given
if [[ ! " ${ARGS[*]-} " =~ " --config=" ]]; then
  case "$COMMAND" in
    forward) ARGS=("--config=configs/base.py:tiny" "${ARGS[@]}") ;;
    run|sft|train|export|generate|plan) ARGS=("--config=configs/paragrpo.py:toy" "${ARGS[@]}") ;;
  esac
fi
if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "python -m paravt_jax.cli $COMMAND ${ARGS[*]}"
  exit 0
fi
PY="$(PARAVT_EXTRAS="${PARAVT_EXTRAS-}" bash launch/env.sh)"  # the runtime alone unless asked
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# glibc's allocator on transparent huge pages where the kernel offers them (THP "madvise" or
# "always"): XLA:CPU's buffers fault in 2 MiB pages, not 4 KiB ones; same bits, faster steps
# (bench/host_pages.py)
export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1"
exec "$PY" -m paravt_jax.cli "$COMMAND" "${ARGS[@]}"
