"""The same SFT step and the same PPO update give the same parameters on 1 device, on 8 fake CPU
devices (data=2, fsdp=2, model=2, FSDP rules) and on 2 processes x 4 fake devices on 127.0.0.1
started by `launch/local_multiprocess.sh` (issue 6).

Each run executes `DRIVER` (below) in its own interpreter: it builds a tiny random T5 policy and
value model (1 encoder + 1 decoder layer: every kind of parameter and every sharding rule, and a
third less to compile than 2 + 2 layers in each of the four processes) directly in their sharded
layout, one SFT step and one PPO update (2 epochs x 2 minibatches) on a fixed batch that every
process builds whole (the global array is assembled from each device's rows,
`jax.make_array_from_callback`), and process 0 dumps the initial and the updated parameters,
gathered from all hosts, to an .npz. The test compares the dumps.

Optimizer: plain SGD. Adam's first step is ~lr * sign(g): a gradient entry that is ~0 in float32
(its sign set by the reduction order, which differs with the layout) would move by +-lr, so Adam
would measure the optimizer, not the sharded step. Tolerance: 1e-5 absolute on every parameter
(measured: 4.2e-7 for SFT, 1.2e-7 for PPO at lr 0.005; with 2 + 2 layers 1.0e-6, 1.2e-7, and
7.9e-6 for PPO at lr 0.02); the test also checks that every step really moved the parameters
(> 1e-4, 10 x the tolerance; measured: 1.27 for SFT, 0.011 for PPO).
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from helpers.children import fake_device_env, run_child, run_launcher, run_with_fake_devices

TOL = 1e-5

DRIVER = r'''
import sys
from clarifyjax.core import distributed
from clarifyjax.files.child_result import write_result
distributed.initialize()  # reads CLARIFYJAX_* from local_multiprocess.sh; one process otherwise

import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from jax.experimental import multihost_utils
from clarifyjax.rl import ppo
from clarifyjax.training import sft
from clarifyjax.rl import policy
from clarifyjax.models.state import split_model
from clarifyjax.rl.value import ValueModel
from clarifyjax.core import sharding
from clarifyjax.models.t5 import T5, T5Config

out_path, layout = sys.argv[1], sys.argv[2]
if layout == "single":
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "model": 1}, devices=jax.devices()[:1])
    rules = sharding.DEFAULT_RULES
else:
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "model": 2})
    rules = sharding.FSDP_RULES
config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                  relative_attention_num_buckets=8, relative_attention_max_distance=32,
                  dropout_rate=0.0, feed_forward_proj="gated-gelu", tie_word_embeddings=False)

def build(factory):
    graphdef, params = split_model(sharding.create_sharded(factory, mesh, rules))
    return graphdef, params

pol_def, pol = build(lambda: T5(config, rngs=nnx.Rngs(0)))
val_def, val = build(lambda: ValueModel(config, rngs=nnx.Rngs(1), head_init="normal"))

def place(x):
    """The whole numpy batch -> a global array split over data x fsdp (any process count)."""
    x = np.asarray(x)
    placement = sharding.batch_sharding(mesh, x.ndim)
    return jax.make_array_from_callback(x.shape, placement, lambda idx: x[idx])

rs = np.random.RandomState(0)
B, S, T = 8, 12, 10
lengths = rs.randint(3, T + 1, size=B)
resp_mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
q_len = rs.randint(4, S + 1, size=B)
q_mask = (np.arange(S)[None] < q_len[:, None]).astype(np.int32)
q_ids = rs.randint(2, 64, size=(B, S)) * q_mask
r_ids = rs.randint(2, 64, size=(B, T)) * resp_mask

def gather(tree):
    flat = {jax.tree_util.keystr(p): np.asarray(multihost_utils.process_allgather(x, tiled=True))
            for p, x in jax.tree_util.tree_leaves_with_path(tree)}
    return flat

dumps = {}
for p, v in gather({"policy": pol, "value": val}).items():
    dumps["init" + p] = v

# ---- one SFT step (2 micro-batches of 4 rows, token-weighted accumulation)
tx = optax.sgd(1.0)
state = sft.init_state(pol, tx, seed=0)
step = jax.jit(sft.make_train_step(pol_def, tx))
micro = {"input_ids": q_ids, "input_mask": q_mask, "target_ids": r_ids, "target_mask": resp_mask,
         "example_mask": np.ones((B,), np.int32)}
micro = {k: place(v) for k, v in micro.items()}
micro = jax.tree.map(lambda x: jnp.stack([x, x[::-1]]), micro)  # [a=2, b, ...]
state, metrics = step(state, micro)
for p, v in gather({"policy": state.params}).items():
    dumps["sft" + p] = v
dumps["sft_loss"] = np.asarray(multihost_utils.process_allgather(metrics["loss"], tiled=True))

# ---- one PPO update
logp_fn, value_fn = policy.make_ppo_fns(pol_def, val_def)
scorer = jax.jit(policy.make_rollout_scorer(pol_def, val_def))
qi, qm, ri, rm = (place(x) for x in (q_ids, q_mask, r_ids, resp_mask))
logprobs, ref_logprobs, values = scorer(pol, pol, val, qi, qm, ri, rm)
noise = place(0.05 * rs.randn(B, T).astype(np.float32))
rollout = ppo.Rollout(query_ids=qi, query_mask=qm, response_ids=ri, response_mask=rm,
                      logprobs=logprobs, ref_logprobs=ref_logprobs + noise, values=values,
                      rewards=place(rs.randn(B).astype(np.float32)))
ptx, vtx = optax.sgd(0.005), optax.sgd(0.005)
ppo_state = ppo.init_ppo_state(pol, val, ptx, vtx)
update = jax.jit(ppo.make_ppo_update(logp_fn, value_fn, ptx, vtx,
                                     ppo.PPOUpdateConfig(epochs=2, minibatches=2)))
ppo_state, ppo_metrics = update(ppo_state, rollout, jax.random.key(3))
for p, v in gather({"policy": ppo_state.policy_params, "value": ppo_state.value_params}).items():
    dumps["ppo" + p] = v
dumps["ppo_total_loss"] = np.asarray(multihost_utils.process_allgather(ppo_metrics["total_loss"], tiled=True))

if jax.process_index() == 0:
    np.savez(out_path, **dumps)
write_result({"process": jax.process_index(), "processes": jax.process_count(),
              "devices": jax.device_count(), "mesh": dict(mesh.shape)})
'''


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scale_equality")
    script = tmp / "driver.py"
    script.write_text(DRIVER)
    out = {}
    # 1 device
    r = run_child([sys.executable, script, tmp / "single.npz", "single"], env=fake_device_env(1))
    assert (r["processes"], r["devices"]) == (1, 1), r
    out["single"] = dict(np.load(tmp / "single.npz"))
    # 8 fake devices, one process
    r = run_with_fake_devices(f"import sys; sys.argv = ['driver', {str(tmp / 'eight.npz')!r}, "
                              "'mesh']\n" + DRIVER, 8)
    assert (r["processes"], r["devices"]) == (1, 8), r
    assert r["mesh"] == {"data": 2, "fsdp": 2, "model": 2}, r
    out["eight"] = dict(np.load(tmp / "eight.npz"))
    # 2 processes x 4 fake devices, started by the launch script
    results = run_launcher([sys.executable, script, tmp / "multi.npz", "mesh"], 2, n_devices=4)
    for i, r in enumerate(results):
        assert (r["process"], r["processes"], r["devices"]) == (i, 2, 8), r
        assert r["mesh"] == {"data": 2, "fsdp": 2, "model": 2}, r
    out["multi"] = dict(np.load(tmp / "multi.npz"))
    return out


def _max_diff(a: dict, b: dict, prefix: str) -> tuple[float, int]:
    keys = sorted(k for k in a if k.startswith(prefix))
    assert keys and keys == sorted(k for k in b if k.startswith(prefix))
    worst = 0.0
    for k in keys:
        assert a[k].shape == b[k].shape, k
        worst = max(worst, float(np.max(np.abs(a[k].astype(np.float64) - b[k]))))
    return worst, len(keys)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["eight", "multi"])
@pytest.mark.parametrize("phase", ["init", "sft", "ppo"])
def test_same_parameters_as_one_device(dumps, layout, phase):
    worst, n = _max_diff(dumps["single"], dumps[layout], phase + "[")
    print(f"{phase} {layout}: {n} arrays, max |diff| vs 1 device = {worst:.3g}")
    assert worst <= TOL, f"{phase} on {layout}: max |diff| {worst} > {TOL}"


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["sft", "ppo"])
def test_steps_move_the_parameters(dumps, phase):
    """Otherwise equality would prove nothing: each update changes the weights well above TOL."""
    single = dumps["single"]
    moved = max(float(np.max(np.abs(single[phase + k[4:]] - single[k])))
                for k in single if k.startswith("init[") and phase + k[4:] in single)
    print(f"{phase}: parameters moved by up to {moved:.3g}")
    assert moved > 1e-4, f"{phase} step changed the parameters by at most {moved}"
    loss = single[f"{phase}_loss" if phase == "sft" else "ppo_total_loss"]
    for layout in ("eight", "multi"):
        other = dumps[layout][f"{phase}_loss" if phase == "sft" else "ppo_total_loss"]
        np.testing.assert_allclose(other, loss, rtol=1e-5, atol=1e-6)
