#!/usr/bin/env bash
# Runs `python -m paravt_jax.cli <command> [--config=...] [overrides...]` on every worker of a
# Cloud TPU VM slice: (create the slice) -> copy or pull the code -> build the environment ->
# run on all workers (JAX finds its peers on a TPU slice by itself) -> copy results back ->
# (delete the slice). Arguments after the script name go to the python command unchanged.
#
#   DATA="--config.model.checkpoint=/data/Qwen3-VL-8B-Instruct --config.data.sft=/data/paravt/sft.parquet
#     --config.data.rl_train=/data/paravt/rl.parquet --config.data.rl_eval=/data/paravt/rl_eval.parquet
#     --config.data.video_root=/data/paravt/videos"    # on every worker (or a mounted bucket)
#   DRY_RUN=1 bash launch/tpu_pod.sh run --config=configs/paragrpo.py:qwen3vl_8b $DATA --config.rl.steps=10
#   CREATE=1 DELETE=1 ACCELERATOR_TYPE=v5p-32 TPU_NAME=paravt-a bash launch/tpu_pod.sh train \
#     --config=configs/paragrpo.py:qwen3vl_8b $DATA
#   LOGS=1 RUN_NAME=train-paragrpo-qwen3vl_8b TPU_NAME=paravt-a bash launch/tpu_pod.sh
#   bash launch/tpu_pod.sh --help       # every setting and its current value
#
# The workdir is runs/RUN_NAME, and RUN_NAME defaults to the command and config (train-paragrpo-
# qwen3vl_8b): the same call again, a requeued job, resumes from that workdir's checkpoints. Give
# each experiment its own RUN_NAME (a workdir refuses a second run, and a rerun with other settings).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# ---------------------------------------------------------------------------- settings
TPU_NAME="${TPU_NAME:-paravt-${USER:-tpu}}"
ZONE="${ZONE:-us-east5-a}"
PROJECT="${PROJECT:-}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v5p-32}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE/#v5e-/v5litepod-}"  # gcloud's name for v5e slices
case "$ACCELERATOR_TYPE" in
  v5p-*) DEFAULT_RUNTIME=v2-alpha-tpuv5 ;;
  v5litepod-*) DEFAULT_RUNTIME=v2-alpha-tpuv5-lite ;;
  v6e-*) DEFAULT_RUNTIME=v2-alpha-tpuv6e ;;
  *) DEFAULT_RUNTIME=tpu-ubuntu2204-base ;;
esac
RUNTIME_VERSION="${RUNTIME_VERSION:-$DEFAULT_RUNTIME}"
SPOT="${SPOT:-0}"
RESERVED="${RESERVED:-0}"
CREATE="${CREATE:-0}"
DELETE="${DELETE:-0}"
GIT_URL="${GIT_URL:-}"
GIT_REF="${GIT_REF:-main}"
COPY_CODE="${COPY_CODE:-1}"
SETUP="${SETUP:-1}"
REMOTE_DIR="${REMOTE_DIR:-paravt_jax}"
VENV="${VENV:-.venv}"
RUN_NAME_GIVEN="${RUN_NAME:-}"
RUN_NAME="${RUN_NAME:-$(bash "$ROOT/launch/job_name.sh" "${CONFIG:-}" "$@")}"
RUN_NAME="${RUN_NAME//\//-}"
BUCKET="${BUCKET:-}"
BUCKET="${BUCKET%/}"
WORKDIR="${WORKDIR:-${BUCKET:+$BUCKET/$RUN_NAME}}"
WORKDIR="${WORKDIR:-runs/$RUN_NAME}"
HOSTS="${HOSTS:-}"
SHARED_FS="${SHARED_FS:-0}"
LOG_DIR="${LOG_DIR:-logs/$RUN_NAME}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/results/$RUN_NAME}"
CONFIG="${CONFIG:-}"
MESH_PRESET="${MESH_PRESET:-}"
WORKDIR_COMMANDS="${WORKDIR_COMMANDS:-run sft train export}"
PASS_ENV="${PASS_ENV:-}"
SECRET_ENV="${SECRET_ENV:-WANDB_API_KEY HF_TOKEN}"
DETACH="${DETACH:-0}"
FETCH="${FETCH:-1}"
LOGS="${LOGS:-0}"
LOGS_WORKER="${LOGS_WORKER:-0}"
FETCH_ONLY="${FETCH_ONLY:-0}"
DRY_RUN="${DRY_RUN:-0}"
PYTHON="${PYTHON:-python3}"

usage() {
  cat <<EOF
usage: [SETTING=value ...] bash launch/tpu_pod.sh [COMMAND] [--config=FILE[:ARG]] [--config.x=y ...]
COMMAND (default: run) and everything after it go to \`python -m paravt_jax.cli\` on every worker.

Settings (environment variable = current value):
  TPU_NAME=$TPU_NAME          the TPU VM slice
  ZONE=$ZONE   PROJECT=${PROJECT:-<gcloud default>}
  ACCELERATOR_TYPE=$ACCELERATOR_TYPE   (v5e-N is accepted for v5litepod-N)
  RUNTIME_VERSION=$RUNTIME_VERSION   (default depends on ACCELERATOR_TYPE)
  CREATE=$CREATE  create the slice first;  SPOT=$SPOT / RESERVED=$RESERVED  its capacity kind
  DELETE=$DELETE  delete the slice at the end (also when the run fails)
  COPY_CODE=$COPY_CODE  ship the code: a tarball of this checkout, or with GIT_URL set
  GIT_URL=${GIT_URL:-<unset>}  GIT_REF=$GIT_REF   clone/fetch + checkout on every worker
  SETUP=$SETUP  build the environment on every worker (PARAVT_EXTRAS=tpu bash launch/env.sh)
  REMOTE_DIR=$REMOTE_DIR  code directory on the workers (relative to the home directory)
  VENV=$VENV  virtual environment, relative to REMOTE_DIR
  RUN_NAME=$RUN_NAME  (default: the command and config; the same call resumes the same workdir)
  BUCKET=${BUCKET:-<unset>}  gs://bucket[/prefix]: the default WORKDIR is BUCKET/RUN_NAME
  WORKDIR=$WORKDIR  passed as --workdir to: $WORKDIR_COMMANDS
      (gs://bucket/path, or relative to REMOTE_DIR, or absolute); a slice of more than one host
      needs one workdir every host sees: gs:// (or SHARED_FS=1: a path every worker mounts)
  HOSTS=${HOSTS:-<from ACCELERATOR_TYPE>}  hosts in the slice;  SHARED_FS=$SHARED_FS
  LOG_DIR=$LOG_DIR  per-worker logs on the workers (<LOG_DIR>/<hostname>.log)
  RESULTS_DIR=$RESULTS_DIR  local copy of worker 0's WORKDIR and logs
  FETCH=$FETCH  copy results back after the run;  FETCH_ONLY=1: only do that (needs RUN_NAME)
  CONFIG=${CONFIG:-<default of the command>}  --config when the arguments have none
  MESH_PRESET=${MESH_PRESET:-<unset>}  append --config.mesh.* of paravt_jax/infra/meshes.py (python -m paravt_jax.infra.meshes --list)
  PASS_ENV=${PASS_ENV:-<none>}  extra variable names passed to the workers (values shown)
  SECRET_ENV=$SECRET_ENV  passed when set, through a mode-600 file, never printed
  DETACH=$DETACH  start the job under nohup and return (then LOGS=1 to follow it)
  LOGS=$LOGS  only tail the logs of RUN_NAME (latest run if unset) on worker LOGS_WORKER=$LOGS_WORKER
  DRY_RUN=$DRY_RUN  print every command ("+ ...") instead of running it; never calls gcloud
EOF
}

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then usage; exit 0; fi
if [[ "$SPOT" == 1 && "$RESERVED" == 1 ]]; then
  echo "tpu_pod.sh: SPOT=1 and RESERVED=1 exclude each other" >&2; exit 2
fi

# ---------------------------------------------------------------------------- helpers
# A word as the shell would need it: bare when safe, else single-quoted.
quote() {
  local word out=() sq="'"
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then out+=("$word")
    else out+=("'${word//$sq/$sq\\$sq$sq}'"); fi
  done
  printf '%s' "${out[*]}"
}
# Prints the command; runs it unless DRY_RUN=1.
run() {
  printf '+ %s\n' "$(quote "$@")"
  if [[ "$DRY_RUN" != 1 ]]; then "$@"; fi
}
# Like run, with the output also appended to a local log file; returns the command's status.
run_logged() {
  local log="$1"; shift
  printf '+ %s 2>&1 | tee -a %s\n' "$(quote "$@")" "$(quote "$log")"
  if [[ "$DRY_RUN" == 1 ]]; then return 0; fi
  mkdir -p "$(dirname "$log")"
  "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}
slice_hosts() {  # hosts of a slice type; 0: unknown
  local n="${1##*-}"
  [[ "$n" =~ ^[0-9]+$ ]] || { echo 0; return; }
  case "$1" in
    v2-*|v3-*|v4-*|v5p-*) echo $(( n <= 8 ? 1 : n / 8 )) ;;  # TensorCores: 8 per host
    v5litepod-*|v6e-*) echo $(( n <= 8 ? 1 : n / 4 )) ;;  # chips: up to 8 on one host, else 4 per host
    *) echo 0 ;;
  esac
}
remote_path() {  # paths on the workers: relative ones live under REMOTE_DIR
  if [[ "$1" == /* || "$1" == gs://* ]]; then printf '%s' "$1"; else printf '%s' "$REMOTE_DIR/$1"; fi
}

GCLOUD_FLAGS=(--zone="$ZONE")
if [[ -n "$PROJECT" ]]; then GCLOUD_FLAGS+=(--project="$PROJECT"); fi
TPU_VM=(gcloud compute tpus tpu-vm)
on_workers() {  # on_workers WORKER COMMAND_STRING
  run "${TPU_VM[@]}" ssh "$TPU_NAME" --worker="$1" "${GCLOUD_FLAGS[@]}" --command="$2"
}

fetch_results() {  # worker 0's --workdir (FETCH_ONLY=1: WORKDIR) and logs -> RESULTS_DIR
  local dir="${FETCH_DIR-$WORKDIR}"
  run mkdir -p "$RESULTS_DIR"
  if [[ -z "$dir" ]]; then
    echo "# the command has no --workdir: only logs to copy"
  elif [[ "$dir" == gs://* ]]; then
    echo "# results are in $dir (nothing to copy)"
  else
    run "${TPU_VM[@]}" scp --recurse "$TPU_NAME:$(remote_path "$dir")" "$RESULTS_DIR/" \
      --worker=0 "${GCLOUD_FLAGS[@]}"
  fi
  run "${TPU_VM[@]}" scp --recurse "$TPU_NAME:$(remote_path "$LOG_DIR")" "$RESULTS_DIR/" \
    --worker=0 "${GCLOUD_FLAGS[@]}"
}

# ---------------------------------------------------------------------------- modes
if [[ "$LOGS" == 1 ]]; then
  if [[ -n "$RUN_NAME_GIVEN" ]]; then logs="$(quote "$LOG_DIR")/*.log"
  else logs='"$(ls -td logs/*/ | head -n 1)"*.log'; fi
  on_workers "$LOGS_WORKER" "cd $(quote "$REMOTE_DIR") && tail -n 200 -F $logs"
  exit 0
fi
if [[ "$FETCH_ONLY" == 1 ]]; then
  if [[ -z "$RUN_NAME_GIVEN" ]]; then echo "tpu_pod.sh: FETCH_ONLY=1 needs RUN_NAME" >&2; exit 2; fi
  fetch_results
  exit 0
fi

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
# What to copy back: the --workdir the command got (none: nothing to copy).
FETCH_DIR=""
for arg in "${ARGS[@]+"${ARGS[@]}"}"; do [[ "$arg" != --workdir=* ]] || FETCH_DIR="${arg#--workdir=}"; done
# Every host of a multi-host slice writes checkpoints into the workdir and resumes from it: a
# directory on each worker's own disk would hold pieces of every checkpoint.
HOST_COUNT="${HOSTS:-$(slice_hosts "$ACCELERATOR_TYPE")}"
if [[ -n "$FETCH_DIR" && "$FETCH_DIR" != gs://* && "$SHARED_FS" != 1 && "$HOST_COUNT" != 1 ]]; then
  echo "tpu_pod.sh: --workdir=$FETCH_DIR is on each worker's own disk, but $ACCELERATOR_TYPE has" \
    "${HOST_COUNT/#0/an unknown number of} hosts: set BUCKET=gs://bucket[/prefix] (workdir BUCKET/RUN_NAME)" \
    "or WORKDIR=gs://..., or SHARED_FS=1 for a path every worker mounts (HOSTS=1 for a one-host slice)" >&2
  exit 2
fi
if [[ -n "$MESH_PRESET" ]]; then
  # Last on the line, so the preset wins over --config.mesh.* given above.
  mapfile -t mesh_args < <(meshes --overrides "$MESH_PRESET")
  [[ ${#mesh_args[@]} -gt 0 ]] || { echo "tpu_pod.sh: bad MESH_PRESET=$MESH_PRESET" >&2; exit 2; }
  ARGS+=("${mesh_args[@]}")
fi

EXPORTS=(JAX_PLATFORMS=tpu HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
         PARAVT_RUN_NAME="$RUN_NAME")
for name in $PASS_ENV; do
  if [[ -n "${!name:-}" ]]; then EXPORTS+=("$name=${!name}"); fi
done
SECRETS=()
for name in $SECRET_ENV; do
  if [[ -n "${!name:-}" ]]; then SECRETS+=("$name"); fi
done

PY_LINE="$(quote "$VENV/bin/python" -m paravt_jax.cli "$COMMAND" "${ARGS[@]+"${ARGS[@]}"}")"
WORKER_LOG="$(quote "$LOG_DIR")/\$(hostname).log"
SECRETS_REMOTE=".paravt-secrets-$RUN_NAME.sh"  # in the workers' home directory
RUN_LINE="set -o pipefail; "
if [[ ${#SECRETS[@]} -gt 0 ]]; then
  # Sourced then removed at once: secret values never appear on a command line.
  RUN_LINE+=". $(quote "./$SECRETS_REMOTE") && rm -f $(quote "./$SECRETS_REMOTE") && "
fi
RUN_LINE+="cd $(quote "$REMOTE_DIR") && mkdir -p $(quote "$LOG_DIR") && export $(quote "${EXPORTS[@]}") && "
if [[ "$DETACH" == 1 ]]; then
  inner="$PY_LINE >> $WORKER_LOG 2>&1"
  RUN_LINE+="nohup bash -c $(printf '%q' "$inner") > /dev/null 2>&1 < /dev/null &"
else
  RUN_LINE+="$PY_LINE 2>&1 | tee -a $WORKER_LOG"
fi

echo "# tpu_pod: $TPU_NAME ($ACCELERATOR_TYPE, $ZONE), run $RUN_NAME: $COMMAND ${ARGS[*]-}"

LOCAL_FILES=()
STAGE=start  # how far we got: decides what the exit handler may do
# On any exit (success or failure): remove local temporary files, copy back what the run
# wrote, and delete the slice if asked, but never one that CREATE=1 failed to create (the
# name may belong to someone else's slice).
finish() {
  local status=$?
  trap - EXIT
  set +e
  if [[ ${#LOCAL_FILES[@]} -gt 0 && "$DRY_RUN" != 1 ]]; then rm -f "${LOCAL_FILES[@]}"; fi
  if [[ "$STAGE" == ran ]]; then
    if [[ "$DETACH" == 1 ]]; then
      echo "# detached; follow with: LOGS=1 RUN_NAME=$RUN_NAME TPU_NAME=$TPU_NAME bash launch/tpu_pod.sh"
      echo "# copy results with:    FETCH_ONLY=1 RUN_NAME=$RUN_NAME TPU_NAME=$TPU_NAME bash launch/tpu_pod.sh"
    elif [[ "$FETCH" == 1 ]]; then
      if ! fetch_results; then
        echo "tpu_pod.sh: copying results back failed" >&2
        [[ $status -ne 0 ]] || status=1
      fi
    fi
  fi
  if [[ "$DELETE" == 1 && "$STAGE" != start ]]; then
    run "${TPU_VM[@]}" delete "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --quiet || { [[ $status -ne 0 ]] || status=1; }
  fi
  exit "$status"
}
trap finish EXIT

if [[ "$CREATE" == 1 ]]; then
  create=("${TPU_VM[@]}" create "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --accelerator-type="$ACCELERATOR_TYPE"
          --version="$RUNTIME_VERSION")
  if [[ "$SPOT" == 1 ]]; then create+=(--spot); fi
  if [[ "$RESERVED" == 1 ]]; then create+=(--reserved); fi
  run "${create[@]}"
fi
STAGE=slice

if [[ "$COPY_CODE" == 1 && -n "$GIT_URL" ]]; then
  dir="$(quote "$REMOTE_DIR")"
  on_workers all "{ [ -d $dir/.git ] || git clone --quiet $(quote "$GIT_URL") $dir; } && git -C $dir fetch --quiet origin $(quote "$GIT_REF") && git -C $dir checkout --quiet --force --detach FETCH_HEAD"
elif [[ "$COPY_CODE" == 1 ]]; then
  tarball="${TMPDIR:-/tmp}/paravt-code-$RUN_NAME.tar.gz"
  LOCAL_FILES+=("$tarball")
  run tar -czf "$tarball" --exclude=./.git --exclude=./.venv --exclude='./.venv-*' --exclude=./runs \
    --exclude=./results --exclude=./logs --exclude=./artifacts --exclude=__pycache__ \
    --exclude='*.egg-info' --exclude=.pytest_cache --exclude=.hypothesis -C "$ROOT" .
  run "${TPU_VM[@]}" scp "$tarball" "$TPU_NAME:paravt-code.tar.gz" --worker=all "${GCLOUD_FLAGS[@]}"
  on_workers all "mkdir -p $(quote "$REMOTE_DIR") && tar -xzf paravt-code.tar.gz -C $(quote "$REMOTE_DIR") && rm -f paravt-code.tar.gz"
fi
if [[ "$SETUP" == 1 ]]; then
  # Stock Ubuntu images lack ensurepip, which `python3 -m venv` needs.
  on_workers all "cd $(quote "$REMOTE_DIR") && { python3 -c 'import ensurepip' 2>/dev/null || { sudo apt-get update -qq && sudo apt-get install -y -qq python3-venv; }; } && PARAVT_EXTRAS=tpu PARAVT_VENV=$(quote "$VENV") bash launch/env.sh"
fi
if [[ ${#SECRETS[@]} -gt 0 ]]; then
  secrets_file="${TMPDIR:-/tmp}/paravt-secrets-$RUN_NAME.sh"
  LOCAL_FILES+=("$secrets_file")
  for name in "${SECRETS[@]}"; do
    # This literal text is what runs below; the value itself is never printed.
    printf '+ (umask 077; printf %s %s "$%s" >> %s)\n' "'export %s=%q\n'" "$name" "$name" "$(quote "$secrets_file")"
  done
  if [[ "$DRY_RUN" != 1 ]]; then
    (umask 077; : > "$secrets_file"
     for name in "${SECRETS[@]}"; do printf 'export %s=%q\n' "$name" "${!name}" >> "$secrets_file"; done)
  fi
  run "${TPU_VM[@]}" scp "$secrets_file" "$TPU_NAME:$SECRETS_REMOTE" --worker=all "${GCLOUD_FLAGS[@]}"
fi
STAGE=ran
# Streams the interleaved output of all workers here; each worker also keeps its own log.
run_logged "$RESULTS_DIR/launch.log" "${TPU_VM[@]}" ssh "$TPU_NAME" --worker=all "${GCLOUD_FLAGS[@]}" \
  --command="$RUN_LINE"
