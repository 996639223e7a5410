#!/usr/bin/env bash
# Prints the default job name of a launch: COMMAND-CONFIGFILE-PRESET (run-paragrpo-toy), from the
# command word and the --config=FILE[:ARG] of the arguments (else DEFAULT_CONFIG, the first
# argument, which may be empty). The same call always gets the same name, so the launch scripts'
# default workdir runs/NAME is where a rerun or a requeued job resumes.
#   bash launch/job_name.sh "$CONFIG" "$@"
set -euo pipefail
default_config="${1:-}"; shift
command=run
if [[ $# -gt 0 && "$1" != -* ]]; then command="$1"; shift; fi
config="$default_config"
for arg in "$@"; do
  if [[ "$arg" == --config=* ]]; then config="${arg#--config=}"; fi
done
name="$command"
if [[ -n "$config" ]]; then
  file="${config%%:*}"
  name+="-$(basename "$file" .py)"
  if [[ "$config" == *:* && -n "${config#*:}" ]]; then name+="-${config#*:}"; fi
fi
printf '%s\n' "${name//[^A-Za-z0-9_.=,+-]/-}"
