"""Checkpoints saved by 2 processes (x 4 fake devices, mesh data=2 x fsdp=2 x model=2, FSDP rules;
started by `launch/local_multiprocess.sh`) restore on 1 process with 1 device and on 1 process
with 8 devices (another mesh: data=1 x fsdp=8) with bit-equal values (issue 6).

The saved state is a tiny T5's parameters, an Adam state after one update (moments sharded like
their parameters) and a step counter, written by `clarifyjax.training.checkpointing.Checkpointer` (orbax:
every process writes its own shards). Process 0 of the saving run dumps the gathered values to an
.npz; each restoring run dumps what it restored; the test compares them exactly.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from helpers.children import fake_device_env, run_child, run_launcher, run_with_fake_devices

DRIVER = r'''
import sys
from clarifyjax.core import distributed
from clarifyjax.files.child_result import write_result
distributed.initialize()

import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from jax.experimental import multihost_utils
from clarifyjax.models.state import split_model
from clarifyjax.core import sharding
from clarifyjax.training.checkpointing import Checkpointer, to_abstract
from clarifyjax.models.t5 import T5, T5Config

mode, ckpt_dir, out_path = sys.argv[1:4]
if mode == "save":
    mesh, rules = sharding.make_mesh({"data": 2, "fsdp": 2, "model": 2}), sharding.FSDP_RULES
elif jax.device_count() == 1:
    mesh, rules = sharding.make_mesh({"data": 1}), sharding.DEFAULT_RULES
else:
    mesh, rules = sharding.make_mesh({"data": 1, "fsdp": -1, "model": 1}), sharding.FSDP_RULES
config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                  relative_attention_num_buckets=8, relative_attention_max_distance=32,
                  dropout_rate=0.0, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
seed = 0 if mode == "save" else 7  # a restore must overwrite every value
_, params = split_model(
    sharding.create_sharded(lambda: T5(config, rngs=nnx.Rngs(seed)), mesh, rules))
tx = optax.adam(1e-2)

@jax.jit
def make_state(params):
    opt = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.cos(p * 3.0), params)
    updates, opt = tx.update(grads, opt, params)
    return {"params": optax.apply_updates(params, updates), "opt": opt,
            "step": jnp.asarray(5 if mode == "save" else 0, jnp.int32)}

state = make_state(params)
if mode == "save":
    with Checkpointer(ckpt_dir, async_save=False) as ckpt:
        ckpt.save(5, state, {"note": "saved by 2 processes"})
else:
    # restore into this topology's shardings: an abstract state (shapes + NamedShardings)
    with Checkpointer(ckpt_dir) as ckpt:
        state, extra = ckpt.restore(5, to_abstract(state))
    assert extra == {"note": "saved by 2 processes"}, extra
placed = sorted({str(tuple(x.sharding.spec)) for x in jax.tree.leaves(state) if x.ndim == 2})

flat = {jax.tree_util.keystr(p): np.asarray(multihost_utils.process_allgather(x, tiled=True))
        for p, x in jax.tree_util.tree_leaves_with_path(state)}
if jax.process_index() == 0:
    np.savez(out_path, **flat)
write_result({"mode": mode, "process": jax.process_index(), "processes": jax.process_count(),
              "devices": jax.device_count(), "mesh": dict(mesh.shape), "specs": placed})
'''


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cross_topology")
    script = tmp / "driver.py"
    script.write_text(DRIVER)
    ckpt = tmp / "ckpt"
    results = run_launcher([sys.executable, script, "save", ckpt, tmp / "saved.npz"], 2,
                           n_devices=4)
    for i, r in enumerate(results):
        assert (r["mode"], r["process"], r["processes"], r["devices"]) == ("save", i, 2, 8), r
    out = {"saved": dict(np.load(tmp / "saved.npz"))}
    r = run_child([sys.executable, script, "restore", ckpt, tmp / "one.npz"],
                  env=fake_device_env(1))
    assert (r["mode"], r["devices"]) == ("restore", 1), r
    out["one"] = dict(np.load(tmp / "one.npz"))
    r = run_with_fake_devices(f"import sys; sys.argv = ['driver', 'restore', {str(ckpt)!r}, "
                              f"{str(tmp / 'eight.npz')!r}]\n" + DRIVER, 8)
    assert r["mesh"] == {"data": 1, "fsdp": 8, "model": 1}, r
    assert any("fsdp" in spec for spec in r["specs"]), r  # really resharded
    out["eight"] = dict(np.load(tmp / "eight.npz"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("target", ["one", "eight"])
def test_restore_on_another_topology_gives_equal_values(dumps, target):
    saved, restored = dumps["saved"], dumps[target]
    assert sorted(saved) == sorted(restored)
    assert len(saved) > 20  # params + both Adam moments + counts + step
    assert int(restored["['step']"]) == 5
    for key in saved:
        np.testing.assert_array_equal(restored[key], saved[key], err_msg=key)
