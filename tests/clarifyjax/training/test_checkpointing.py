"""clarifyjax.training.checkpointing: orbax round trips, retention, sharded restore, SIGTERM and kill -9.

The preemption tests run a tiny training loop (LOOP below) in a subprocess; its state after n steps
has a closed form (`expected_state`), so a resumed run is checked against arithmetic, not against
another run of the same code.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clarifyjax.training.checkpointing import Checkpointer, PreemptionGuard, jsonable
from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.files.child_result import RESULT_FILE_ENV, read_result
from helpers.env import REPO_ROOT
from helpers.children import child_failure, child_result, clean_env, run_with_fake_devices


def make_state(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "params": {"dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                             "bias": jnp.asarray(rng.normal(size=(3,)), jnp.bfloat16)},
                   "layers": [jnp.arange(6, dtype=jnp.int32).reshape(2, 3) + seed]},
        "opt": {"count": jnp.int32(seed), "mu": jnp.full((4, 3), 0.5 + seed, jnp.float32)},
        "rng": jax.random.key(seed),
    }


def assert_trees_equal(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x, np.float64) if x.dtype == jnp.bfloat16 else x,
                                      np.asarray(y, np.float64) if y.dtype == jnp.bfloat16 else y)


def test_roundtrip_values_dtypes_and_extra(tmp_path):
    state = make_state(1)
    extra = {"data": {"epoch": np.int64(2), "index": 5, "seed": 0},
             "normalizer": {"gain": np.float32(2.5), "bias": -0.1}, "kl": {"coef": 0.15},
             "config": {"ppo": {"clip": 0.2, "buckets": (8, 16)}}}
    with Checkpointer(tmp_path / "ckpt", max_to_keep=2) as ckpt:
        assert ckpt.restore_latest(state) is None
        assert ckpt.save(7, state, extra)
        ckpt.wait()
        step, restored, got = ckpt.restore_latest(jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state))
    assert step == 7
    assert_trees_equal(restored, state)
    assert got == {"data": {"epoch": 2, "index": 5, "seed": 0},
                   "normalizer": {"gain": 2.5, "bias": -0.1}, "kl": {"coef": 0.15},
                   "config": {"ppo": {"clip": 0.2, "buckets": [8, 16]}}}
    # a second manager on the same folder sees it (nothing is held in memory only)
    with Checkpointer(tmp_path / "ckpt") as again:
        assert again.all_steps() == [7]


def test_max_to_keep_interval_and_latest(tmp_path):
    with Checkpointer(tmp_path, max_to_keep=2, save_interval_steps=3) as ckpt:
        assert [s for s in range(10) if ckpt.should_save(s)] == [3, 6, 9]
        for step in (3, 6, 9):
            ckpt.save(step, make_state(step), {"step": step})
        assert not ckpt.save(9, make_state(0))  # an existing step is not overwritten
        ckpt.wait()
        assert ckpt.all_steps() == [6, 9]
        step, state, extra = ckpt.restore_latest(make_state(0))
        assert step == 9 and extra == {"step": 9}
        assert_trees_equal(state, make_state(9))
        _, older = ckpt.restore(6, make_state(0))[0], ckpt.restore(6, make_state(0))[1]
        assert older == {"step": 6}
        with pytest.raises(CheckpointError, match="no checkpoint of step 3"):
            ckpt.restore(3, make_state(0))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["6", "9"]


def test_restore_into_another_model_shape_is_a_clear_error(tmp_path):
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, make_state())
        ckpt.wait()
        wrong = make_state()
        wrong["params"]["dense"]["kernel"] = jnp.zeros((8, 3))
        with pytest.raises(CheckpointError, match=r"params/dense/kernel' has shape \(4, 3\) in "
                                                  r"the checkpoint but the model expects \(8, 3\)"):
            ckpt.restore_latest(wrong)
        extra_leaf = dict(make_state(), head=jnp.zeros(2))
        with pytest.raises(CheckpointError, match=r"missing from the checkpoint \['head'\]"):
            ckpt.restore_latest(extra_leaf)


def json_roundtrip(value):
    import json

    return json.loads(json.dumps(value))


def test_extra_must_be_json(tmp_path):
    assert jsonable({"a": np.arange(3), "b": (1, np.float32(0.5))}) == {"a": [0, 1, 2],
                                                                         "b": [1, 0.5]}
    from clarifyjax.config import config_to_dict, load_config

    cfg = load_config(REPO_ROOT / "clarifyjax" / "presets" / "ppo_tiny.yaml")
    assert jsonable({"config": cfg}) == {"config": json_roundtrip(config_to_dict(cfg))}
    with pytest.raises(CheckpointError, match=r"extra\.normalizer: a object"):
        jsonable({"normalizer": object()})


@pytest.mark.child
def test_sharded_save_restores_into_other_shardings():
    """Saved from a 4-way sharded array, restored into a 2x2 mesh and onto 1 device."""
    result = run_with_fake_devices(textwrap.dedent("""
        import tempfile
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        from clarifyjax.training.checkpointing import Checkpointer
        from clarifyjax.files.child_result import write_result
        auto = (jax.sharding.AxisType.Auto,) * 2
        mesh = jax.make_mesh((4, 1), ("a", "b"), axis_types=auto)
        x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("a", None)))
        d = tempfile.mkdtemp()
        with Checkpointer(d) as ckpt:
            ckpt.save(1, {"w": x})
        mesh2 = jax.make_mesh((2, 2), ("a", "b"), axis_types=auto)
        target = NamedSharding(mesh2, P("b", "a"))
        with Checkpointer(d) as ckpt:
            step, got, _ = ckpt.restore_latest(
                {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=target)})
            one = jax.sharding.SingleDeviceSharding(jax.devices()[3])
            _, single, _ = ckpt.restore_latest(
                {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=one)})
        assert got["w"].sharding == target, got["w"].sharding
        assert {s.data.shape for s in got["w"].addressable_shards} == {(4, 2)}
        np.testing.assert_array_equal(np.asarray(got["w"]), np.arange(32.0).reshape(8, 4))
        assert single["w"].sharding == one
        np.testing.assert_array_equal(np.asarray(single["w"]), np.arange(32.0).reshape(8, 4))
        write_result({"step": step})
    """), n_devices=4, timeout=300)
    assert result == {"step": 1}


# --------------------------------------------------------------------------- preemption

LOOP = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp, numpy as np
    from clarifyjax.training.checkpointing import Checkpointer, PreemptionGuard
    from clarifyjax.files.child_result import write_result

    directory, total, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

    @jax.jit
    def train_step(state, step):
        return {"w": state["w"] * 2.0 % 1000.0 + step, "count": state["count"] + 1}

    init = {"w": jnp.ones((3,), jnp.float32), "count": jnp.int32(0)}
    with Checkpointer(directory, max_to_keep=3, save_interval_steps=5) as ckpt, \\
            PreemptionGuard() as guard:
        restored = ckpt.restore_latest(init)
        step, state = (0, init) if restored is None else restored[:2]
        report = {"start": step, "step": step, "preempted": None, "signal": None}
        while step < total:
            state = train_step(state, step)
            step += 1
            report["step"] = step
            write_result(report)  # progress: the parent waits for a step before signalling
            stop = guard.should_stop(step)
            if stop or ckpt.should_save(step) or step == total:
                ckpt.save(step, state, {"data": {"index": step}})
            if stop:
                report.update(preempted=step, signal=int(guard.signal_received))
                break
            time.sleep(pause)
    write_result({**report, "final": [step, float(state["w"][0]), int(state["count"])]})
""")


def expected_state(steps: int) -> tuple[float, int]:
    w = np.float32(1.0)
    for s in range(steps):
        w = np.float32(w * np.float32(2.0) % np.float32(1000.0) + np.float32(s))
    return float(w), steps


class Loop:
    """LOOP in a child process; its progress and final report are in its result file."""

    def __init__(self, tmp_path, total: int, pause: float):
        script = tmp_path / "loop.py"
        script.write_text(LOOP)
        self.result = tmp_path / f"result.{time.monotonic_ns()}.json"
        self.out, self.err = (open(tmp_path / f"{self.result.stem}.{n}", "w+")
                              for n in ("out", "err"))
        env = clean_env(JAX_PLATFORMS="cpu", **{RESULT_FILE_ENV: str(self.result)})
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "ckpt"), str(total), str(pause)],
            stdout=self.out, stderr=self.err, env=env, cwd=str(tmp_path))

    def output(self) -> tuple[str, str]:
        self.out.seek(0), self.err.seek(0)
        return self.out.read(), self.err.read()

    def wait_for_step(self, step: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if read_result(self.result)["step"] >= step:
                    return
            except (OSError, ValueError):
                pass  # not written yet
            time.sleep(0.01)
        self.proc.kill()
        self.proc.wait()
        raise child_failure("loop", self.proc.returncode, *self.output(),
                            f"never reached step {step}")

    def finish(self, timeout: float = 180) -> dict:
        self.proc.wait(timeout=timeout)
        output = self.output()
        self.out.close(), self.err.close()
        return child_result(self.result, self.proc.returncode, *output, "loop")


def test_sigterm_saves_a_checkpoint_and_exits_zero(tmp_path):
    loop = Loop(tmp_path, total=10_000, pause=0.05)
    loop.wait_for_step(7)
    loop.proc.send_signal(signal.SIGTERM)
    report = loop.finish(timeout=120)  # exit status 0, or this fails
    stopped = report["preempted"]
    assert stopped is not None and 7 <= stopped < 10_000, report
    assert report["signal"] == signal.SIGTERM
    assert report["final"] == [stopped, expected_state(stopped)[0], stopped]
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.latest_step() == stopped  # off the save interval: saved because of SIGTERM
        _, state, extra = ckpt.restore_latest({"w": jnp.ones((3,)), "count": jnp.int32(0)})
    assert extra == {"data": {"index": stopped}}
    np.testing.assert_array_equal(np.asarray(state["w"]), np.full(3, expected_state(stopped)[0],
                                                                  np.float32))


def test_kill_9_then_restart_resumes_from_the_last_complete_checkpoint(tmp_path):
    total = 40
    loop = Loop(tmp_path, total=total, pause=0.05)
    loop.wait_for_step(17)
    loop.proc.send_signal(signal.SIGKILL)
    loop.proc.wait(timeout=60)
    assert loop.proc.returncode == -signal.SIGKILL
    # what a kill in the middle of a save leaves: an uncommitted temporary step folder
    junk = tmp_path / "ckpt" / "35.orbax-checkpoint-tmp-1234567890"
    (junk / "state").mkdir(parents=True)
    (junk / "state" / "garbage").write_bytes(b"\0" * 64)
    report = Loop(tmp_path, total=total, pause=0.0).finish(timeout=180)
    assert report["start"] in (10, 15), report  # the newest committed multiple of 5 before the kill
    assert report["final"] == [total, expected_state(total)[0], total]  # == uninterrupted
    assert not junk.exists()  # cleaned up on start
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.latest_step() == total and total - 10 in ckpt.all_steps()


def test_guard_restores_the_previous_handler():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionGuard() as guard:
        assert not guard.should_stop(0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert guard.requested and guard.should_stop(1)
        assert guard.signal_received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before
