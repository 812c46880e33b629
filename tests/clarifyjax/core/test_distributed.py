"""clarifyjax.core.distributed: how a process was started (pure detection), and a real 2-process start.

The detection tests feed environments as dicts (no JAX call). The multi-process test starts two
interpreters on 127.0.0.1 with 4 fake CPU devices each (gloo collectives), configured only through
the CLARIFYJAX_* variables, and checks what each of them saw.
"""
from __future__ import annotations

import pytest

from clarifyjax.core import distributed
from helpers.children import clean_env, run_child, run_processes

SLURM_STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_NTASKS": "16",
              "SLURM_PROCID": "9", "SLURM_LOCALID": "1"}


def detect(*args, env=None, tpu_chips=False, **kwargs) -> distributed.Launch:
    return distributed.detect_launch(*args, environ=env or {}, tpu_chips=tpu_chips, **kwargs)


# ----------------------------------------------------------------------------- detection

def test_plain_process_is_single():
    assert detect() == distributed.Launch("single", 1, 0)
    assert not detect().multi_process


def test_explicit_arguments_win_over_environment_and_clusters():
    env = {distributed.ENV_COORDINATOR: "10.0.0.1:1", distributed.ENV_NUM_PROCESSES: "8",
           distributed.ENV_PROCESS_ID: "5", **SLURM_STEP}
    got = detect("10.0.0.2:1234", 4, 3, [0, 1], env=env)
    assert got == distributed.Launch("explicit", 4, 3, "10.0.0.2:1234", (0, 1))
    # a missing argument is taken from the CLARIFYJAX_* variables
    assert detect(process_id=2, env=env) == distributed.Launch("explicit", 8, 2, "10.0.0.1:1")


def test_clarifyjax_environment_variables():
    env = {distributed.ENV_COORDINATOR: "127.0.0.1:5555", distributed.ENV_NUM_PROCESSES: " 2 ",
           distributed.ENV_PROCESS_ID: "1", distributed.ENV_LOCAL_DEVICE_IDS: "0,2"}
    got = detect(env=env)
    assert got == distributed.Launch("env", 2, 1, "127.0.0.1:5555", (0, 2))
    assert got.multi_process
    # one process needs no coordinator
    assert detect(env={distributed.ENV_NUM_PROCESSES: "1"}) == distributed.Launch("single", 1, 0)


@pytest.mark.parametrize("env, match", [
    ({distributed.ENV_NUM_PROCESSES: "two", distributed.ENV_PROCESS_ID: "0"},
     "CLARIFYJAX_NUM_PROCESSES must be an integer, got 'two'"),
    ({distributed.ENV_NUM_PROCESSES: "2", distributed.ENV_COORDINATOR: "h:1"}, "set CLARIFYJAX_PROCESS_ID"),
    ({distributed.ENV_NUM_PROCESSES: "2", distributed.ENV_PROCESS_ID: "0"}, "set CLARIFYJAX_COORDINATOR"),
    ({distributed.ENV_PROCESS_ID: "0", distributed.ENV_COORDINATOR: "h:1"}, "set CLARIFYJAX_NUM_PROCESSES"),
    ({distributed.ENV_NUM_PROCESSES: "2", distributed.ENV_PROCESS_ID: "2", distributed.ENV_COORDINATOR: "h:1"},
     r"process id 2 is outside \[0, 2\)"),
    ({distributed.ENV_NUM_PROCESSES: "2", distributed.ENV_PROCESS_ID: "0", distributed.ENV_COORDINATOR: "host"},
     "'host' must look like host:port"),
    ({distributed.ENV_NUM_PROCESSES: "2", distributed.ENV_PROCESS_ID: "0", distributed.ENV_COORDINATOR: "h:1",
      distributed.ENV_LOCAL_DEVICE_IDS: "0,x"}, "CLARIFYJAX_LOCAL_DEVICE_IDS must be an integer"),
    ({distributed.ENV_NUM_PROCESSES: "0"}, "num_processes must be >= 1"),
])
def test_bad_settings_name_the_variable(env, match):
    with pytest.raises(distributed.DistributedError, match=match):
        detect(env=env)


def test_bad_explicit_argument_names_the_argument():
    with pytest.raises(distributed.DistributedError, match="process_id must be an integer"):
        detect("h:1", 2, "first")


def test_slurm_step_is_left_to_jax_detection():
    assert detect(env=SLURM_STEP) == distributed.Launch("slurm", 16, 9)
    # srun's per-step count wins over the allocation's
    assert detect(env={**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"}
                  ) == distributed.Launch("slurm", 2, 1)
    assert detect(env={**SLURM_STEP, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}).source == "single"
    # the batch script itself (no srun step) is not a cluster of 16: it must not wait for 15 others
    batch_step = {k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_NODELIST"}
    assert detect(env=batch_step).source == "single"


def test_open_mpi():
    env = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3", "OMPI_MCA_orte_hnp_uri": "x"}
    assert detect(env=env) == distributed.Launch("ompi", 4, 3)


def test_tpu_pods():
    env = {"TPU_WORKER_HOSTNAMES": "t-w-0,t-w-1,t-w-2,t-w-3", "TPU_WORKER_ID": "2"}
    assert detect(env=env) == distributed.Launch("tpu", 4, 2)
    assert detect(env={"TPU_WORKER_HOSTNAMES": "only-one"}).source == "single"
    multislice = detect(env={"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.9",
                             "MEGASCALE_NUM_SLICES": "2"})
    assert multislice.source == "tpu" and multislice.num_processes is None
    assert multislice.multi_process
    # a TPU VM without worker variables: the metadata server knows, so JAX is asked
    assert detect(tpu_chips=True) == distributed.Launch("tpu", None, None)
    assert detect(env={"TPU_SKIP_MDS_QUERY": "1"}, tpu_chips=True).source == "single"


@pytest.mark.child
def test_single_process_initialize_is_a_no_op_and_idempotent():
    """In this (single) test process: no jax.distributed, same answer twice, conflicts raise."""
    code = r'''
import jax
from clarifyjax.core import distributed
from clarifyjax.files.child_result import write_result
a = distributed.initialize()
b = distributed.initialize()
assert a is b and a.source == "single" and not jax.distributed.is_initialized(), a
assert distributed.is_primary() and distributed.primary_only(lambda: 7)() == 7
distributed.barrier("no-op")
try:
    distributed.initialize(num_processes=2)
except distributed.DistributedError as e:
    write_result({"conflict": str(e)})
'''
    result = run_child(code, env=clean_env(JAX_PLATFORMS="cpu"), timeout=120)
    assert result["conflict"].startswith(
        "initialize() was already called (single) with num_processes=1"), result


# ------------------------------------------------------------------ two processes on 127.0.0.1

TWO_PROCESS_SCRIPT = r'''
from clarifyjax.core import distributed
from clarifyjax.files.child_result import write_result
launch = distributed.initialize()            # everything from CLARIFYJAX_* (set by the test)
again = distributed.initialize()             # idempotent
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
from clarifyjax.core import sharding

pid = jax.process_index()
mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, model=2))       # all 8 devices, both hosts
local = (np.arange(4 * 3, dtype=np.float32).reshape(4, 3) + 100 * pid)  # this host's 4 rows
x = sharding.shard_batch({"x": local}, mesh)["x"]

# psum inside shard_map: each device adds its own rows' sum, over the batch axes (the rows are
# replicated along "model")
psum = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b.sum(), ("data", "fsdp")),
                             mesh=mesh, in_specs=P(("data", "fsdp")), out_specs=P()))(x)
# the same reduction left to XLA's partitioner on the global array
total = jax.jit(jnp.sum)(x)
# each process's own mesh (the reward models'): its 4 devices, fsdp x model kept, no other host
pm = sharding.process_mesh({"data": 2, "fsdp": 2, "model": 2})
w_host = np.arange(8 * 6, dtype=np.float32).reshape(8, 6) + pid
w = jax.device_put(w_host, jax.sharding.NamedSharding(pm, P("fsdp", "model")))
r_host = np.arange(4 * 8, dtype=np.float32).reshape(4, 8) - 10 * pid
y = jax.jit(lambda r, w: r @ w)(sharding.place_rows(r_host, pm), w)
written = distributed.primary_only(lambda: "written")()
distributed.barrier("after-write")
write_result({
    "source": launch.source, "same": again is launch, "num_processes": launch.num_processes,
    "process_id": launch.process_id, "pid": pid, "primary": distributed.is_primary(),
    "devices": jax.device_count(), "local_devices": jax.local_device_count(),
    "mesh": dict(mesh.shape), "global_shape": list(x.shape),
    "psum": float(psum.addressable_data(0)), "sum": float(total.addressable_data(0)),
    "written": written, "process_mesh": dict(pm.shape),
    "process_mesh_local": sorted(d.id for d in pm.devices.flat) == sorted(
        d.id for d in jax.local_devices()),
    "w_shard": list(w.addressable_shards[0].data.shape),
    "local_matmul": bool(np.array_equal(np.asarray(y), r_host @ w_host))})
'''


@pytest.mark.child
def test_two_processes_initialize_build_a_global_mesh_and_agree_on_a_psum():
    results = run_processes(TWO_PROCESS_SCRIPT, 2, n_devices=4, timeout=240)
    # rows 0..11 of host 0 and 100..111 of host 1: an independent sum
    expected = float(sum(range(12)) + sum(100 + r for r in range(12)))
    for i, r in enumerate(results):
        assert (r["source"], r["same"], r["num_processes"], r["process_id"], r["pid"]) == \
            ("env", True, 2, i, i)
        assert r["primary"] == (i == 0)
        assert r["written"] == ("written" if i == 0 else None)
        assert (r["devices"], r["local_devices"]) == (8, 4)
        assert r["mesh"] == {"data": 2, "fsdp": 2, "model": 2}
        assert r["global_shape"] == [8, 3]
        assert r["psum"] == expected and r["sum"] == expected  # exact: small integers in float32
        assert r["process_mesh"] == {"data": 1, "fsdp": 2, "model": 2}
        assert r["process_mesh_local"] and r["w_shard"] == [4, 3] and r["local_matmul"]
