"""launch/: the three launchers parse (bash -n); local_multiprocess.sh runs a real 2-process JAX job
and stops everything when one process fails; tpu_pod.sh and slurm.sbatch are run against fake
`gcloud` / `srun` / `scontrol` executables that record what they were asked to do.
"""
from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.env import REPO_ROOT
from helpers.children import clean_env, run_launcher

LAUNCH = REPO_ROOT / "launch"
SCRIPTS = ["local_multiprocess.sh", "tpu_pod.sh", "slurm.sbatch"]


def run(args, env=None, timeout=240, cwd=REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], env=env or clean_env(), cwd=str(cwd),
                          capture_output=True, text=True, timeout=timeout)


def fake_executable(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(f"#!{sys.executable}\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse_and_are_executable(script):
    path = LAUNCH / script
    proc = run(["bash", "-n", path])
    assert proc.returncode == 0, proc.stderr
    assert os.access(path, os.X_OK), f"{path} is not executable"
    assert path.read_text().startswith("#!/usr/bin/env bash\n")


# ------------------------------------------------------------------- local_multiprocess.sh

PSUM_COMMAND = r'''
from clarifyjax.core import distributed
from clarifyjax.files.child_result import write_result
launch = distributed.initialize()
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
from clarifyjax.core import sharding
mesh = sharding.make_mesh({"data": -1})                                  # all devices of both processes
rows = np.full((jax.local_device_count(), 2), jax.process_index() + 1, np.float32)
x = sharding.shard_batch(rows, mesh)
total = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b.sum(), "data"), mesh=mesh,
                              in_specs=P("data"), out_specs=P()))(x)
write_result({"pid": jax.process_index(), "n": launch.num_processes,
              "devices": jax.device_count(), "psum": float(total.addressable_data(0))})
'''


def test_local_multiprocess_runs_a_two_process_psum():
    """The launcher passes the environment through: each process writes its own result file."""
    results = run_launcher([sys.executable, "-c", PSUM_COMMAND], 2, n_devices=4, timeout=240)
    for i, r in enumerate(results):
        assert r["pid"] == i and r["n"] == 2 and r["devices"] == 8
        # 4 devices x 2 values of 1 (process 0) + 4 x 2 of 2 (process 1)
        assert r["psum"] == 4 * 2 * 1 + 4 * 2 * 2


def test_local_multiprocess_stops_the_others_when_one_fails(tmp_path):
    command = (f"echo $$ > {tmp_path}/pid.$CLARIFYJAX_PROCESS_ID; "
               "if [ $CLARIFYJAX_PROCESS_ID = 1 ]; then sleep 0.5; exit 3; fi; exec sleep 120")
    start = time.monotonic()
    proc = run([LAUNCH / "local_multiprocess.sh", 3, "bash", "-c", command],
               env=clean_env(KILL_GRACE="2", DEVICES_PER_PROCESS="0"), timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == 3, proc.stderr
    assert "process 1" in proc.stderr and "exited with status 3" in proc.stderr
    assert elapsed < 30, f"took {elapsed:.1f} s: the sleepers were not stopped"
    for i in (0, 2):
        pid = int((tmp_path / f"pid.{i}").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_local_multiprocess_sets_the_environment(tmp_path):
    # The children are `bash -c echo`: no native library shares this stdout, and the "[i] "
    # prefix on it is the launcher's own output under test.
    proc = run([LAUNCH / "local_multiprocess.sh", 2, "bash", "-c",
                'echo "$CLARIFYJAX_NUM_PROCESSES $CLARIFYJAX_PROCESS_ID $CLARIFYJAX_COORDINATOR '
                '$JAX_PLATFORMS $XLA_FLAGS"'],
               env=clean_env(PORT="12345", DEVICES_PER_PROCESS="3", XLA_FLAGS="--xla_dump_to=x"))
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    # the device count goes first, the caller's own flags are kept after it
    assert lines == [f"[{i}] 2 {i} 127.0.0.1:12345 cpu --xla_force_host_platform_device_count=3 "
                     "--xla_dump_to=x" for i in (0, 1)]


@pytest.mark.parametrize("args", [[], [2], [0, "true"], ["two", "true"]])
def test_local_multiprocess_usage_errors(args):
    proc = run([LAUNCH / "local_multiprocess.sh", *args])
    assert proc.returncode == 2
    assert "usage" in proc.stderr or "positive integer" in proc.stderr


# ------------------------------------------------------------------------------ tpu_pod.sh

FAKE_GCLOUD = r'''
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
if "describe" in sys.argv:
    state = os.environ.get("FAKE_TPU_STATE")
    if not state:
        sys.exit(1)          # no such TPU VM
    print(state)
'''


def tpu_pod(tmp_path, *args, state=None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake_executable(bin_dir, "gcloud", FAKE_GCLOUD)
    log = tmp_path / "gcloud.log"
    log.write_text("")
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_LOG=str(log))
    if state:
        env["FAKE_TPU_STATE"] = state
    proc = run([LAUNCH / "tpu_pod.sh", *args], env=env, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return proc, calls


def test_tpu_pod_creates_installs_and_trains_on_all_workers(tmp_path):
    proc, calls = tpu_pod(tmp_path, "--name", "my-tpu", "--zone", "us-central2-b", "--type",
                          "v4-32", "--project", "proj", "--spot", "clarifyjax/presets/ppo_t5_large.yaml",
                          "run.output_dir=gs://bucket/run one", "ppo.batch_size=8")
    assert proc.returncode == 0, proc.stderr
    verbs = [c[3] for c in calls]
    assert verbs == ["describe", "create", "scp", "ssh", "ssh"]
    where = ["--zone", "us-central2-b", "--project", "proj"]
    create = calls[1]
    assert create[:5] == ["compute", "tpus", "tpu-vm", "create", "my-tpu"]
    assert create[5:] == where + ["--accelerator-type", "v4-32", "--version",
                                  "tpu-ubuntu2204-base", "--spot"]
    scp, install, train = calls[2:]
    assert scp[-len(where) - 1:] == where + ["--worker=all"] and scp[5] == "my-tpu:~/clarifyjax.tgz"
    for ssh in (install, train):
        assert ssh[4] == "my-tpu" and "--worker=all" in ssh and ssh[-2] == "--command"
    assert "pip install -q -e ." in install[-1] and "jax[tpu]==" in install[-1]
    assert shlex.split(train[-1]) == [
        "cd", "~/clarifyjax", "&&", ".venv/bin/clarifyjax", "train", "clarifyjax/presets/ppo_t5_large.yaml",
        "run.output_dir=gs://bucket/run one", "ppo.batch_size=8"]


def test_tpu_pod_reuses_a_ready_vm_and_can_detach(tmp_path):
    proc, calls = tpu_pod(tmp_path, "--skip-install", "--detach", "clarifyjax/presets/ppo_tiny.yaml",
                          state="READY")
    assert proc.returncode == 0, proc.stderr
    assert [c[3] for c in calls] == ["describe", "ssh"]
    assert calls[0][4] == "clarifyjax-v4-32"  # the default name
    remote = calls[1][-1]
    assert "nohup" in remote and "train.log" in remote and remote.endswith("&")


def test_tpu_pod_dry_run_prints_and_runs_nothing(tmp_path):
    proc, calls = tpu_pod(tmp_path, "--dry-run", "--skip-install", "clarifyjax/presets/ppo_tiny.yaml", "a.b=1")
    assert proc.returncode == 0, proc.stderr
    assert calls == []
    printed = [shlex.split(line) for line in proc.stdout.splitlines()]
    assert [p[4] for p in printed] == ["create", "ssh"]
    assert shlex.split(printed[1][-1])[-2:] == ["clarifyjax/presets/ppo_tiny.yaml", "a.b=1"]


@pytest.mark.parametrize("args, state, message", [
    (["clarifyjax/presets/ppo_tiny.yaml", "novalue"], None, "overrides must look like key=value"),
    (["clarifyjax/presets/nope.yaml"], None, "config file not found"),
    (["--bogus", "clarifyjax/presets/ppo_tiny.yaml"], None, "unknown option --bogus"),
    ([], None, "missing CONFIG"),
    (["--zone"], None, "--zone needs a value"),
    (["clarifyjax/presets/ppo_tiny.yaml"], "PREEMPTED", "is in state PREEMPTED"),
])
def test_tpu_pod_errors(tmp_path, args, state, message):
    proc, calls = tpu_pod(tmp_path, *args, state=state)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert all(c[3] == "describe" for c in calls)  # nothing created, copied or started


# ---------------------------------------------------------------------------- slurm.sbatch

FAKE_SRUN = r'''
import os, subprocess, sys
args = sys.argv[1:]
options = [a for a in args if a.startswith("--")]
command = args[len(options):]
per_node = "--ntasks-per-node=1" in options
nodes = int(os.environ["SLURM_JOB_NUM_NODES"])
ntasks = nodes if per_node else int(os.environ["SLURM_NTASKS"])
for rank in range(ntasks):   # sequentially: each task only records what it was given
    env = dict(os.environ, SLURM_NTASKS=str(ntasks), SLURM_PROCID=str(rank),
               SLURM_LOCALID=str(rank % (ntasks // nodes)))
    code = subprocess.call(command, env=env)
    if code:
        sys.exit(code)
'''
FAKE_SCONTROL = r'''
import sys
assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
print("gpu-a\ngpu-b")
'''
FAKE_CLARIFYJAX = r'''
import json, os, sys
keys = ["CLARIFYJAX_COORDINATOR", "CLARIFYJAX_NUM_PROCESSES", "CLARIFYJAX_PROCESS_ID",
        "CLARIFYJAX_LOCAL_DEVICE_IDS"]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"args": sys.argv[1:], **{k: os.environ.get(k) for k in keys}}) + "\n")
'''


@pytest.mark.parametrize("mode", ["per-gpu", "per-node"])
def test_slurm_sbatch_starts_one_process_per_task_with_the_coordinator(tmp_path, mode):
    bin_dir = tmp_path / "bin"
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    fake_executable(bin_dir, "srun", FAKE_SRUN)
    fake_executable(bin_dir, "scontrol", FAKE_SCONTROL)
    fake_executable(tmp_path / "venv" / "bin", "clarifyjax", FAKE_CLARIFYJAX)
    log = tmp_path / "tasks.log"
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_LOG=str(log),
                    VENV=str(tmp_path / "venv"), PROCESS_MODE=mode, SLURM_JOB_ID="31337",
                    SLURM_JOB_NODELIST="gpu-[a-b]", SLURM_JOB_NUM_NODES="2", SLURM_NTASKS="4",
                    SLURM_SUBMIT_DIR=str(REPO_ROOT))
    proc = run(["bash", LAUNCH / "slurm.sbatch", "clarifyjax/presets/ppo_t5_large.yaml", "mesh.fsdp=2"],
               env=env, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    tasks = [json.loads(line) for line in log.read_text().splitlines()]
    n = 4 if mode == "per-gpu" else 2
    assert len(tasks) == n
    for rank, task in enumerate(tasks):
        assert task["args"] == ["train", "clarifyjax/presets/ppo_t5_large.yaml", "mesh.fsdp=2"]
        assert task["CLARIFYJAX_COORDINATOR"] == f"gpu-a:{20000 + 31337 % 20000}"
        assert task["CLARIFYJAX_NUM_PROCESSES"] == str(n)
        assert task["CLARIFYJAX_PROCESS_ID"] == str(rank)
        expected_ids = str(rank % 2) if mode == "per-gpu" else None
        assert task["CLARIFYJAX_LOCAL_DEVICE_IDS"] == expected_ids


def test_slurm_sbatch_refuses_to_run_outside_slurm(tmp_path):
    proc = run(["bash", LAUNCH / "slurm.sbatch", "clarifyjax/presets/ppo_tiny.yaml"], timeout=30)
    assert proc.returncode != 0 and "SLURM_JOB_ID" in proc.stderr
