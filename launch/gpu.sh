#!/usr/bin/env bash
# Runs `python -m paravt_jax.cli <command> [--config=...] [overrides...]` on one or several GPU
# hosts: one process per host, each seeing all of its GPUs. With HOSTS unset it runs here as a
# single process; with HOSTS="a b" it copies the code (rsync over ssh, unless SHARED_FS=1),
# builds the environment on each host, starts process i on host i with
# PARAVT_COORDINATOR / PARAVT_NUM_PROCESSES / PARAVT_PROCESS_ID (read by the
# jax.distributed.initialize call of paravt_jax), waits for all, and copies host 0's results.
#
#   DATA="--config.model.checkpoint=/data/Qwen3-VL-8B-Instruct --config.data.sft=/data/paravt/sft.parquet
#     --config.data.rl_train=/data/paravt/rl.parquet --config.data.rl_eval=/data/paravt/rl_eval.parquet
#     --config.data.video_root=/data/paravt/videos"
#   DRY_RUN=1 bash launch/gpu.sh run --config=configs/paragrpo.py:qwen3vl_8b $DATA
#   HOSTS="gpu-a gpu-b" MESH_PRESET=gpu16 bash launch/gpu.sh train --config=configs/paragrpo.py:qwen3vl_8b $DATA
#   bash launch/gpu.sh --help        # every setting and its current value
#
# The workdir is runs/RUN_NAME, and RUN_NAME defaults to the command and config (train-paragrpo-
# qwen3vl_8b): the same call again, a requeued job, resumes from that workdir's checkpoints. Give
# each experiment its own RUN_NAME (a workdir refuses a second run, and a rerun with other settings).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# ---------------------------------------------------------------------------- settings
HOSTS="${HOSTS:-}"
read -r -a HOST_LIST <<< "$HOSTS"
NUM_HOSTS="${#HOST_LIST[@]}"
DRY_RUN="${DRY_RUN:-0}"
SHARED_FS="${SHARED_FS:-0}"
COORDINATOR_PORT="${COORDINATOR_PORT:-12355}"
if [[ "$NUM_HOSTS" -gt 0 ]]; then
  COORDINATOR="${COORDINATOR:-${HOST_LIST[0]#*@}:$COORDINATOR_PORT}"
else
  COORDINATOR="${COORDINATOR:-}"
fi
if [[ "$SHARED_FS" == 1 ]]; then REMOTE_DIR="${REMOTE_DIR:-$ROOT}"; else REMOTE_DIR="${REMOTE_DIR:-paravt_jax}"; fi
VENV="${VENV:-.venv-gpu}"  # separate from the CPU test environment in .venv
SSH="${SSH:-ssh}"
SSH_OPTS="${SSH_OPTS:--o BatchMode=yes}"
read -r -a SSH_OPT_LIST <<< "$SSH_OPTS"
COPY_CODE="${COPY_CODE:-1}"
SETUP="${SETUP:-1}"
FETCH="${FETCH:-1}"
RUN_NAME="${RUN_NAME:-$(bash "$ROOT/launch/job_name.sh" "${CONFIG:-}" "$@")}"
RUN_NAME="${RUN_NAME//\//-}"
WORKDIR="${WORKDIR:-runs/$RUN_NAME}"
LOG_DIR="${LOG_DIR:-$ROOT/logs/$RUN_NAME}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/results/$RUN_NAME}"
CONFIG="${CONFIG:-}"
MESH_PRESET="${MESH_PRESET:-}"
WORKDIR_COMMANDS="${WORKDIR_COMMANDS:-run sft train export}"
# Overlap collectives with compute, and combine FSDP's many small all-gathers and
# reduce-scatters into fewer large ones. XLA rejects unknown flags, so keep them few.
GPU_XLA_FLAGS="${GPU_XLA_FLAGS:---xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_all_gather_combine_threshold_bytes=134217728 --xla_gpu_reduce_scatter_combine_threshold_bytes=134217728}"
XLA_FLAGS_EXTRA="${XLA_FLAGS_EXTRA:-}"
MEM_FRACTION="${MEM_FRACTION:-0.9}"
PASS_ENV="${PASS_ENV:-}"
SECRET_ENV="${SECRET_ENV:-WANDB_API_KEY HF_TOKEN}"
PYTHON="${PYTHON:-python3}"

# GPUs per host: counted with nvidia-smi (here, or on the first host), 8 in a dry run.
count_gpus() {
  if [[ "$DRY_RUN" == 1 ]]; then echo 8; return; fi
  local listing
  if [[ "$NUM_HOSTS" -eq 0 ]]; then listing="$(nvidia-smi -L 2>/dev/null)" || listing=""
  else listing="$("$SSH" "${SSH_OPT_LIST[@]}" "${HOST_LIST[0]}" nvidia-smi -L)" || listing=""; fi
  grep -c '^GPU ' <<< "$listing" || true  # 0 GPUs is reported below
}

usage() {
  cat <<EOF
usage: [SETTING=value ...] bash launch/gpu.sh [COMMAND] [--config=FILE[:ARG]] [--config.x=y ...]
COMMAND (default: run) and everything after it go to \`python -m paravt_jax.cli\` on every host.

Settings (environment variable = current value):
  HOSTS=${HOSTS:-<unset: this machine, one process>}   ssh names, host 0 first
  GPUS_PER_HOST=${GPUS_PER_HOST:-<nvidia-smi count; 8 in a dry run>}  (sets CUDA_VISIBLE_DEVICES)
  COORDINATOR=${COORDINATOR:-<first host>:$COORDINATOR_PORT}  (COORDINATOR_PORT=$COORDINATOR_PORT)
  SHARED_FS=$SHARED_FS  1: the hosts share this checkout's filesystem; no copying
  COPY_CODE=$COPY_CODE  rsync this checkout to REMOTE_DIR on each host (not with SHARED_FS=1)
  REMOTE_DIR=$REMOTE_DIR  code directory on the hosts (relative to the home directory)
  SETUP=$SETUP  build VENV=$VENV with PARAVT_EXTRAS=gpu bash launch/env.sh (host 0 only with SHARED_FS=1)
  SSH=$SSH  SSH_OPTS=$SSH_OPTS
  RUN_NAME=$RUN_NAME  (default: the command and config; the same call resumes the same workdir)
  WORKDIR=$WORKDIR  passed as --workdir to: $WORKDIR_COMMANDS (relative to REMOTE_DIR, absolute or gs://)
      (several hosts write one checkpoint together: use SHARED_FS=1 or a gs:// WORKDIR)
  LOG_DIR=$LOG_DIR  local logs, host-<i>.log per host (appended: a resumed run adds to them)
  RESULTS_DIR=$RESULTS_DIR  local copy of host 0's WORKDIR (FETCH=$FETCH)
  CONFIG=${CONFIG:-<default of the command>}  --config when the arguments have none
  MESH_PRESET=${MESH_PRESET:-<unset>}  append --config.mesh.* of paravt_jax/infra/meshes.py (python -m paravt_jax.infra.meshes --list)
  GPU_XLA_FLAGS=$GPU_XLA_FLAGS
  XLA_FLAGS_EXTRA=${XLA_FLAGS_EXTRA:-<none>}  appended to GPU_XLA_FLAGS
  MEM_FRACTION=$MEM_FRACTION  XLA_PYTHON_CLIENT_MEM_FRACTION
  PASS_ENV=${PASS_ENV:-<none>}  extra variable names passed to the hosts (values shown)
  SECRET_ENV=$SECRET_ENV  passed when set, over ssh's stdin, never printed
  DRY_RUN=$DRY_RUN  print every command ("+ ...") instead of running it; never calls ssh/rsync/nvidia-smi
EOF
}

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then usage; exit 0; fi
GPUS_PER_HOST="${GPUS_PER_HOST:-$(count_gpus)}"
if ! [[ "$GPUS_PER_HOST" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu.sh: GPUS_PER_HOST=$GPUS_PER_HOST is not a positive count (set it explicitly)" >&2; exit 2
fi

# ---------------------------------------------------------------------------- helpers
quote() {  # words as the shell needs them: bare when safe, else single-quoted
  local word out=() sq="'"
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then out+=("$word")
    else out+=("'${word//$sq/$sq\\$sq$sq}'"); fi
  done
  printf '%s' "${out[*]}"
}
run() {  # prints the command; runs it unless DRY_RUN=1
  printf '+ %s\n' "$(quote "$@")"
  if [[ "$DRY_RUN" != 1 ]]; then "$@"; fi
}
remote_path() {
  if [[ "$1" == /* || "$1" == gs://* ]]; then printf '%s' "$1"; else printf '%s' "$REMOTE_DIR/$1"; fi
}

# ---------------------------------------------------------------------------- the command
COMMAND=run
if [[ $# -gt 0 && "$1" != -* ]]; then COMMAND="$1"; shift; fi
ARGS=("$@")
has_flag() { local a; for a in "${ARGS[@]+"${ARGS[@]}"}"; do [[ "$a" == "$1"* ]] && return 0; done; return 1; }
# The mesh preset table of this checkout (paravt_jax/infra/meshes.py needs only the standard library).
meshes() { PYTHONPATH="$ROOT" "$PYTHON" -m paravt_jax.infra.meshes "$@"; }
if [[ -n "$CONFIG" ]] && ! has_flag --config=; then ARGS=("--config=$CONFIG" "${ARGS[@]+"${ARGS[@]}"}"); fi
if [[ " $WORKDIR_COMMANDS " == *" $COMMAND "* ]] && ! has_flag --workdir=; then
  ARGS+=("--workdir=$WORKDIR")
fi
TOTAL_GPUS=$(( (NUM_HOSTS > 0 ? NUM_HOSTS : 1) * GPUS_PER_HOST ))
# What to copy back: the --workdir the command got (none: nothing to copy).
FETCH_DIR=""
for arg in "${ARGS[@]+"${ARGS[@]}"}"; do [[ "$arg" != --workdir=* ]] || FETCH_DIR="${arg#--workdir=}"; done
if [[ -n "$MESH_PRESET" ]]; then
  preset_json="$(meshes "$MESH_PRESET")"  # exits here if unknown
  preset_devices="$("$PYTHON" -c 'import json, sys; print(json.loads(sys.argv[1])["devices"])' "$preset_json")"
  if [[ "$preset_devices" != "$TOTAL_GPUS" ]]; then
    echo "gpu.sh: MESH_PRESET=$MESH_PRESET is for $preset_devices GPUs, but the hosts have $TOTAL_GPUS" >&2; exit 2
  fi
  mapfile -t mesh_args < <(meshes --overrides "$MESH_PRESET")
  ARGS+=("${mesh_args[@]}")  # last, so the preset wins over --config.mesh.* given above
fi

VISIBLE="$(seq -s, 0 $((GPUS_PER_HOST - 1)))"
ENV_VARS=(JAX_PLATFORMS=cuda "XLA_FLAGS=$GPU_XLA_FLAGS${XLA_FLAGS_EXTRA:+ $XLA_FLAGS_EXTRA}"
          XLA_PYTHON_CLIENT_MEM_FRACTION="$MEM_FRACTION" CUDA_VISIBLE_DEVICES="$VISIBLE"
          HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
          PARAVT_RUN_NAME="$RUN_NAME")
for name in $PASS_ENV; do
  if [[ -n "${!name:-}" ]]; then ENV_VARS+=("$name=${!name}"); fi
done
SECRETS=()
for name in $SECRET_ENV; do
  if [[ -n "${!name:-}" ]]; then SECRETS+=("$name"); fi
done
PY_ARGS=(-m paravt_jax.cli "$COMMAND" "${ARGS[@]+"${ARGS[@]}"}")

echo "# gpu: $(( NUM_HOSTS > 0 ? NUM_HOSTS : 1 )) host(s) x $GPUS_PER_HOST GPUs, run $RUN_NAME: $COMMAND ${ARGS[*]-}"
if [[ "$NUM_HOSTS" -gt 1 && "$SHARED_FS" != 1 && -n "$FETCH_DIR" && "$FETCH_DIR" != gs://* ]]; then
  echo "# note: hosts without a shared filesystem each keep only their own checkpoint shards" >&2
fi
run mkdir -p "$LOG_DIR"

# ---------------------------------------------------------------------------- one host: here
if [[ "$NUM_HOSTS" -eq 0 ]]; then
  cd "$ROOT"
  if [[ "$SETUP" == 1 ]]; then run env PARAVT_EXTRAS=gpu PARAVT_VENV="$VENV" bash launch/env.sh; fi
  # Secrets are already in this environment; `env` only adds the variables above.
  printf '+ %s 2>&1 | tee -a %s\n' "$(quote env "${ENV_VARS[@]}" "$VENV/bin/python" "${PY_ARGS[@]}")" \
    "$(quote "$LOG_DIR/host-0.log")"
  if [[ "$DRY_RUN" == 1 ]]; then exit 0; fi
  env "${ENV_VARS[@]}" "$VENV/bin/python" "${PY_ARGS[@]}" 2>&1 | tee -a "$LOG_DIR/host-0.log"
  exit "${PIPESTATUS[0]}"
fi

# ---------------------------------------------------------------------------- several hosts
ssh_to() { run "$SSH" "${SSH_OPT_LIST[@]}" -n "$@"; }
dir="$(quote "$REMOTE_DIR")"
for host in "${HOST_LIST[@]}"; do
  if [[ "$COPY_CODE" == 1 && "$SHARED_FS" != 1 ]]; then
    run rsync -az -e "$SSH $SSH_OPTS" --exclude=/.git --exclude=/.venv --exclude='/.venv-*' \
      --exclude=/runs --exclude=/results --exclude=/logs --exclude=/artifacts --exclude=__pycache__ \
      --exclude='*.egg-info' --exclude=.pytest_cache --exclude=.hypothesis "$ROOT/" "$host:$REMOTE_DIR/"
  fi
done
if [[ "$SETUP" == 1 ]]; then
  setup_hosts=("${HOST_LIST[@]}")
  # On a shared filesystem one build serves all (and concurrent builds would collide).
  if [[ "$SHARED_FS" == 1 ]]; then setup_hosts=("${HOST_LIST[0]}"); fi
  for host in "${setup_hosts[@]}"; do
    ssh_to "$host" "cd $dir && PARAVT_EXTRAS=gpu PARAVT_VENV=$(quote "$VENV") bash launch/env.sh"
  done
fi

PIDS=()
for i in "${!HOST_LIST[@]}"; do
  host="${HOST_LIST[$i]}"
  line="cd $dir && "
  if [[ ${#SECRETS[@]} -gt 0 ]]; then line+=". /dev/stdin && "; fi
  line+="export $(quote "${ENV_VARS[@]}" PARAVT_COORDINATOR="$COORDINATOR" \
    PARAVT_NUM_PROCESSES="$NUM_HOSTS" PARAVT_PROCESS_ID="$i") && exec $(quote "$VENV/bin/python" "${PY_ARGS[@]}")"
  log="$LOG_DIR/host-$i.log"
  ssh_words=("$SSH" "${SSH_OPT_LIST[@]}")
  if [[ ${#SECRETS[@]} -gt 0 ]]; then
    # The remote shell sources `export NAME=value` lines from stdin: no value on any command line.
    feed_words=()
    for name in "${SECRETS[@]}"; do feed_words+=("$name" "\"\$$name\""); done
    feed_display="printf 'export %s=%q\\n' ${feed_words[*]} | "
  else
    ssh_words+=(-n)
    feed_display=""
  fi
  printf '+ %s%s 2>&1 | tee -a %s | sed -u %s &\n' "$feed_display" "$(quote "${ssh_words[@]}" "$host" "$line")" \
    "$(quote "$log")" "$(quote "s/^/[host $i] /")"
  if [[ "$DRY_RUN" == 1 ]]; then continue; fi
  (
    if [[ ${#SECRETS[@]} -gt 0 ]]; then
      for name in "${SECRETS[@]}"; do printf 'export %s=%q\n' "$name" "${!name}"; done | "${ssh_words[@]}" "$host" "$line"
    else
      "${ssh_words[@]}" "$host" "$line"
    fi 2>&1 | tee -a "$log" | sed -u "s/^/[host $i] /"
    exit "${PIPESTATUS[0]}"
  ) &
  PIDS+=($!)
done

status=0
if [[ "$DRY_RUN" == 1 ]]; then
  echo "+ wait"
else
  for i in "${!PIDS[@]}"; do
    if ! wait "${PIDS[$i]}"; then echo "gpu.sh: host $i (${HOST_LIST[$i]}) failed; see $LOG_DIR/host-$i.log" >&2; status=1; fi
  done
fi

if [[ "$FETCH" == 1 ]]; then
  if [[ -z "$FETCH_DIR" ]]; then echo "# the command has no --workdir: nothing to copy back"
  elif [[ "$FETCH_DIR" == gs://* ]]; then echo "# results are in $FETCH_DIR"
  elif [[ "$SHARED_FS" == 1 ]]; then echo "# results are in $(remote_path "$FETCH_DIR") (shared filesystem)"
  else
    run mkdir -p "$RESULTS_DIR"
    run rsync -az -e "$SSH $SSH_OPTS" "${HOST_LIST[0]}:$(remote_path "$FETCH_DIR")/" "$RESULTS_DIR/" \
      || { echo "gpu.sh: copying results back from ${HOST_LIST[0]} failed" >&2; status=1; }
  fi
fi
exit "$status"
