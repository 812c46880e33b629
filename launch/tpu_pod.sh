#!/usr/bin/env bash
# Train on a Cloud TPU pod slice: create (or reuse) the TPU VM, install this project on every
# worker, and start `clarifyjax train CONFIG key=value...` on all workers at once. Each worker runs
# one JAX process; clarifyjax.core.distributed.initialize() finds the others through the TPU metadata.
#
#   launch/tpu_pod.sh [options] CONFIG [key=value...]
#   launch/tpu_pod.sh --name my-v4 --zone us-central2-b --type v4-32 \
#       clarifyjax/presets/ppo_t5_large.yaml run.output_dir=gs://my-bucket/ppo_t5_large
#
# Options (each also an environment variable):
#   --name NAME         TPU_NAME       TPU VM name                     (clarifyjax-v4-32)
#   --zone ZONE         TPU_ZONE       zone                            (us-central2-b)
#   --type TYPE         TPU_TYPE       accelerator type                (v4-32: 16 chips, 4 hosts)
#   --version VERSION   TPU_VERSION    TPU VM runtime image            (tpu-ubuntu2204-base)
#   --project PROJECT   TPU_PROJECT    GCP project                     (gcloud's default)
#   --python PYTHON     TPU_PYTHON     interpreter on the workers      (python3.11; apt-installed)
#   --data-dir DIR      TPU_DATA_DIR   local folder copied to ~/shared/data on every worker: the
#                                      data folder of the checkout ~/clarifyjax (the presets' data paths)
#   --spot                             create the VM as a Spot VM (preemptible)
#   --skip-install                     reuse the project already installed on the workers
#   --install-only                     create and install, do not train
#   --detach                           start training under nohup (log: ~/clarifyjax/train.log
#                                      on each worker) and return
#   --dry-run                          print the gcloud commands instead of running them
#
# Checkpoints of a multi-host run must go to storage that every worker sees: set
# run.output_dir=gs://bucket/run (orbax writes GCS directly); metrics are written by worker 0.
# The installed JAX is the version pyproject.toml pins, with the matching libtpu (jax[tpu]).
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

name=${TPU_NAME:-clarifyjax-v4-32}
zone=${TPU_ZONE:-us-central2-b}
accelerator=${TPU_TYPE:-v4-32}
version=${TPU_VERSION:-tpu-ubuntu2204-base}
project=${TPU_PROJECT:-}
python=${TPU_PYTHON:-python3.11}
data_dir=${TPU_DATA_DIR:-}
spot=0 install=1 train=1 detach=0 dry_run=0

need_value() { [[ $# -ge 2 && -n $2 ]] || { echo "$0: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --name) need_value "$@"; name=$2; shift 2 ;;
    --zone) need_value "$@"; zone=$2; shift 2 ;;
    --type) need_value "$@"; accelerator=$2; shift 2 ;;
    --version) need_value "$@"; version=$2; shift 2 ;;
    --project) need_value "$@"; project=$2; shift 2 ;;
    --python) need_value "$@"; python=$2; shift 2 ;;
    --data-dir) need_value "$@"; data_dir=$2; shift 2 ;;
    --spot) spot=1; shift ;;
    --skip-install) install=0; shift ;;
    --install-only) train=0; shift ;;
    --detach) detach=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "$0: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done

if ((train)); then
  [[ $# -ge 1 ]] || { echo "$0: missing CONFIG (a YAML file under clarifyjax/presets/)" >&2; usage; }
  config=$1
  shift
  for override in "$@"; do
    [[ $override == *=* && $override != =* ]] || { echo "$0: overrides must look like key=value, got '$override'" >&2; exit 2; }
  done
fi
if [[ -n $data_dir && ! -d $data_dir ]]; then
  echo "$0: --data-dir $data_dir is not a folder" >&2
  exit 2
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
presets="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../clarifyjax/presets"
# a file, or a preset's name (`clarifyjax presets`)
if ((train)) && [[ ! -f $repo/$config && ! -f $config && ! -f $presets/$config.yaml ]] &&
    [[ ! -f $presets/evaluate/$config.yaml ]]; then
  echo "$0: config file not found: $config (nor a preset: clarifyjax presets lists them)" >&2
  exit 2
fi

common=(--zone "$zone")
[[ -n $project ]] && common+=(--project "$project")

# Run (or, with --dry-run, print) one gcloud command.
gc() {
  if ((dry_run)); then
    printf 'gcloud'
    printf ' %q' "$@"
    printf '\n'
  else
    gcloud "$@"
  fi
}

on_all_workers() {  # on_all_workers COMMAND: one shell command line, run by every worker
  gc compute tpus tpu-vm ssh "$name" "${common[@]}" --worker=all --command "$1"
}

# 1. the TPU VM: reuse it when it exists, start it when stopped, create it otherwise
state=
if ((!dry_run)); then
  state=$(gcloud compute tpus tpu-vm describe "$name" "${common[@]}" --format='value(state)' 2>/dev/null) || state=
fi
case $state in
  READY) echo "tpu_pod: reusing TPU VM $name ($zone)" >&2 ;;
  STOPPED) echo "tpu_pod: starting stopped TPU VM $name" >&2
           gc compute tpus tpu-vm start "$name" "${common[@]}" ;;
  "") echo "tpu_pod: creating TPU VM $name: $accelerator, $version, $zone" >&2
      create=(compute tpus tpu-vm create "$name" "${common[@]}" --accelerator-type "$accelerator" --version "$version")
      ((spot)) && create+=(--spot)
      gc "${create[@]}" ;;
  *) echo "$0: TPU VM $name is in state $state; wait, or delete it with" \
          "'gcloud compute tpus tpu-vm delete $name --zone $zone'" >&2
     exit 1 ;;
esac

# 2. the project on every worker: the working tree (tracked and untracked, not ignored files)
if ((install)); then
  tarball=$(mktemp "${TMPDIR:-/tmp}/clarifyjax.XXXXXX.tgz")
  trap 'rm -f "$tarball"' EXIT
  if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$repo" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -czf "$tarball")
  else
    tar -C "$repo" --exclude=.venv --exclude=runs --exclude=.git -czf "$tarball" .
  fi
  gc compute tpus tpu-vm scp "$tarball" "$name:~/clarifyjax.tgz" "${common[@]}" --worker=all
  py=$(printf '%q' "$python")
  on_all_workers "set -e
command -v $py >/dev/null || { sudo apt-get update -qq && sudo apt-get install -y -qq $py $py-venv; }
rm -rf ~/clarifyjax/clarifyjax ~/clarifyjax/sage_jax && mkdir -p ~/clarifyjax
tar -xzf ~/clarifyjax.tgz -C ~/clarifyjax && cd ~/clarifyjax
test -x .venv/bin/python || $py -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e .
jax_version=\$(.venv/bin/python -c 'import jax; print(jax.__version__)')
.venv/bin/pip install -q \"jax[tpu]==\$jax_version\" -f https://storage.googleapis.com/jax-releases/libtpu_releases.html
.venv/bin/python -c 'import clarifyjax.core.distributed'"
  if [[ -n $data_dir ]]; then
    on_all_workers "mkdir -p ~/shared"
    gc compute tpus tpu-vm scp --recurse "$data_dir" "$name:~/shared/data" "${common[@]}" --worker=all
  fi
fi

# 3. train: the same command on every worker, at once
if ((train)); then
  cmd="cd ~/clarifyjax && .venv/bin/clarifyjax train $(printf '%q' "$config")"
  for override in "$@"; do
    cmd+=" $(printf '%q' "$override")"
  done
  if ((detach)); then
    cmd="cd ~/clarifyjax && nohup bash -c $(printf '%q' "$cmd") > ~/clarifyjax/train.log 2>&1 < /dev/null &"
  fi
  echo "tpu_pod: on all workers of $name: $cmd" >&2
  on_all_workers "$cmd"
fi
