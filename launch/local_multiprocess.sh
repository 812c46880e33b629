#!/usr/bin/env bash
# Run N copies of a command as one multi-process JAX job on this machine (127.0.0.1): the same
# multi-controller runtime as a TPU pod or a GPU cluster, for tests and debugging.
#
#   launch/local_multiprocess.sh N CMD [ARG...]
#   launch/local_multiprocess.sh 2 clarifyjax train clarifyjax/presets/ppo_tiny.yaml run.steps=2
#
# Process i gets CLARIFYJAX_COORDINATOR=127.0.0.1:PORT, CLARIFYJAX_NUM_PROCESSES=N and
# CLARIFYJAX_PROCESS_ID=i (read by clarifyjax.core.distributed.initialize), and, unless told otherwise,
# DEVICES_PER_PROCESS fake CPU devices (XLA_FLAGS, JAX_PLATFORMS=cpu). Output lines are prefixed
# with "[i] ". Waits for all; if one fails, the others are stopped (TERM, then KILL) and the
# script exits with the failing status. Ctrl-C stops them all.
#
# Environment:
#   DEVICES_PER_PROCESS  fake CPU devices per process (default 4); 0 keeps XLA_FLAGS and
#                        JAX_PLATFORMS as they are (e.g. real GPUs with CLARIFYJAX_LOCAL_DEVICE_IDS)
#   PORT                 coordinator port (default: a free one)
#   KILL_GRACE           seconds between TERM and KILL when stopping the others (default 5)
set -euo pipefail

usage() {
  echo "usage: $0 N CMD [ARG...]   (N processes on 127.0.0.1; see the header of this file)" >&2
  exit 2
}

[[ $# -ge 2 ]] || usage
num_processes=$1
shift
[[ $num_processes =~ ^[1-9][0-9]*$ ]] || { echo "$0: N must be a positive integer, got '$num_processes'" >&2; exit 2; }

devices_per_process=${DEVICES_PER_PROCESS:-4}
[[ $devices_per_process =~ ^[0-9]+$ ]] || { echo "$0: DEVICES_PER_PROCESS must be an integer, got '$devices_per_process'" >&2; exit 2; }
kill_grace=${KILL_GRACE:-5}

free_port() {
  local python
  python=$(command -v python3 || command -v python) || { echo "$0: python3 is needed to find a free port (or set PORT)" >&2; exit 2; }
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=${PORT:-$(free_port)}

# Each process in its own process group (job control), so that stopping it stops its children too.
set -m
pids=()

stop_all() {
  local signal=$1 pid
  for pid in "${pids[@]}"; do
    kill -s "$signal" -- "-$pid" 2>/dev/null || kill -s "$signal" "$pid" 2>/dev/null || true
  done
}

stop_and_reap() {
  stop_all TERM
  local deadline=$((SECONDS + kill_grace)) pid alive
  while ((SECONDS < deadline)); do
    alive=0
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null && alive=1
    done
    ((alive)) || break
    sleep 0.2
  done
  stop_all KILL
  wait 2>/dev/null || true
}

on_signal() {
  echo "local_multiprocess: got SIG$1, stopping all processes" >&2
  trap - INT TERM
  stop_and_reap
  exit "$2"
}
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM

for ((i = 0; i < num_processes; i++)); do
  (
    export CLARIFYJAX_COORDINATOR="127.0.0.1:${port}"
    export CLARIFYJAX_NUM_PROCESSES="${num_processes}"
    export CLARIFYJAX_PROCESS_ID="${i}"
    if ((devices_per_process > 0)); then
      export XLA_FLAGS="--xla_force_host_platform_device_count=${devices_per_process}${XLA_FLAGS:+ ${XLA_FLAGS}}"
      export JAX_PLATFORMS=cpu
    fi
    # the prefixer must not die on SIGINT before the command has printed its last words
    exec "$@" > >(trap '' INT TERM; sed -u "s/^/[${i}] /") 2>&1
  ) &
  pids+=("$!")
done
set +m  # groups are assigned; no job-control chatter ("[1]+ Terminated ...") from here on

# Poll instead of `wait -n`: we need to know *which* process ended, and its status.
declare -A done_status=()
status=0
while ((${#done_status[@]} < num_processes)); do
  for i in "${!pids[@]}"; do
    pid=${pids[$i]}
    [[ -n ${done_status[$i]+x} ]] && continue
    kill -0 "$pid" 2>/dev/null && continue
    rc=0
    wait "$pid" || rc=$?
    done_status[$i]=$rc
    if ((rc != 0)); then
      echo "local_multiprocess: process ${i} (pid ${pid}) exited with status ${rc}; stopping the others" >&2
      status=$rc
      break 2
    fi
  done
  sleep 0.2
done

if ((status != 0)); then
  trap - INT TERM
  stop_and_reap
  exit "$status"
fi
echo "local_multiprocess: all ${num_processes} processes finished" >&2
