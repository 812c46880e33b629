"""clarifyjax.core.sharding: mesh construction, logical axis rules, placing models and batches.

Rules and mesh-size errors are checked in-process against an abstract mesh; placement runs once in
a subprocess with 8 fake CPU devices (XLA_FLAGS must be set before jax is imported) and reports
what it observed as JSON, which the tests below check.
"""
from __future__ import annotations

import jax
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from clarifyjax.core import sharding
from helpers.children import run_processes, run_with_fake_devices

MESH_222 = AbstractMesh((2, 2, 2), sharding.MESH_AXES)


# ----------------------------------------------------------------------------- rules (in process)

def test_rules_map_names_to_mesh_axes():
    assert sharding.logical_to_mesh_spec(("embed", "mlp")) == P(None, "model")
    assert sharding.logical_to_mesh_spec(("vocab", "embed")) == P("model", None)
    assert sharding.logical_to_mesh_spec(("batch", "length", None)) == P(("data", "fsdp"), None, None)
    assert sharding.logical_to_mesh_spec(("embed", "heads", "kv")) == P(None, "model", None)
    assert sharding.logical_to_mesh_spec(("relpos_buckets", "heads")) == P(None, "model")
    assert sharding.logical_to_mesh_spec(("embed", "mlp"), sharding.FSDP_RULES) == P("fsdp", "model")


def test_indivisible_dimension_stays_replicated():
    # 6 heads over model=4 do not divide: replicated; 8 do.
    mesh = AbstractMesh((1, 2, 4), sharding.MESH_AXES)
    assert sharding.logical_to_mesh_spec(("embed", "heads"), shape=(16, 6), mesh=mesh) == P(None, None)
    assert sharding.logical_to_mesh_spec(("embed", "heads"), shape=(16, 8), mesh=mesh) == P(None, "model")
    # a batch of 6 does not split over data x fsdp = 4 devices: replicated
    assert sharding.logical_to_mesh_spec(("batch",), shape=(6,), mesh=MESH_222) == P(None)
    assert sharding.logical_to_mesh_spec(("batch",), shape=(8,), mesh=MESH_222) == P(("data", "fsdp"))
    # embed 30 is not divisible by fsdp=4 under FSDP rules
    assert sharding.logical_to_mesh_spec(("embed", "mlp"), sharding.FSDP_RULES, shape=(30, 64),
                                   mesh=AbstractMesh((1, 4, 2), sharding.MESH_AXES)) == P(None, "model")


def test_mesh_axis_used_once_per_spec_and_fallback_rules():
    # two dims both want "model": the second falls through to its next candidate (or None)
    rules = (("heads", "model"), ("mlp", "model"), ("mlp", "fsdp"))
    assert sharding.logical_to_mesh_spec(("heads", "mlp"), rules) == P("model", "fsdp")
    assert sharding.logical_to_mesh_spec(("mlp", "mlp"), (("mlp", "model"),)) == P("model", None)


def test_unknown_logical_name_is_an_error():
    with pytest.raises(ValueError, match="'embd' has no rule"):
        sharding.logical_to_mesh_spec(("embd", "mlp"))
    with pytest.raises(ValueError, match="do not match shape"):
        sharding.logical_to_mesh_spec(("embed",), shape=(2, 3), mesh=MESH_222)


def test_make_mesh_takes_the_config_mesh_section(tmp_path):
    """A run config's ``mesh:`` section is a `sharding.MeshConfig` (one declaration of the axes,
    their ranges and the rules name): `make_mesh` takes it as it is."""
    from clarifyjax.config import MeshLayout, config_from_dict

    assert MeshLayout is sharding.MeshConfig
    cfg = config_from_dict({"kind": "sft", "model": "m", "mesh": {"data": -1, "rules": "fsdp"}})
    assert isinstance(cfg.mesh, sharding.MeshConfig) and sharding.RULES[cfg.mesh.rules] is sharding.FSDP_RULES
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "model": 1}
    assert sharding.resolve_sizes(cfg.mesh, 8) == {"data": 8, "fsdp": 1, "model": 1}
    with pytest.raises(Exception, match="mesh: at most one axis may be -1"):
        config_from_dict({"kind": "sft", "model": "m", "mesh": {"data": -1, "fsdp": -1}})


def test_make_mesh_rejects_impossible_sizes():
    devices = [object()] * 8  # checked before any device is touched
    with pytest.raises(ValueError, match="needs 12 devices, but there are 8"):
        sharding.make_mesh(sharding.MeshConfig(data=3, fsdp=2, model=2), devices)
    with pytest.raises(ValueError, match="multiply to 3, which does not divide the 8 devices"):
        sharding.make_mesh({"model": 3}, devices)
    with pytest.raises(ValueError, match="at most one axis may be -1"):
        sharding.make_mesh({"data": -1, "model": -1}, devices)
    with pytest.raises(ValueError, match="'fsdp' has size 0"):
        sharding.make_mesh({"fsdp": 0}, devices)
    with pytest.raises(ValueError, match="unknown axes \\['tensor'\\]"):
        sharding.make_mesh({"tensor": 2}, devices)


def test_single_device_default_mesh():
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "model": 1}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


# ------------------------------------------------------------------ placement on 8 fake devices

PLACEMENT_SCRIPT = r'''
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from clarifyjax.core import sharding
from clarifyjax.files.child_result import write_result

out = {}
out["fill"] = {k: dict(sharding.make_mesh(c).shape) for k, c in {
    "default": None, "model2": {"model": 2}, "fsdp_fill": sharding.MeshConfig(data=2, fsdp=-1)}.items()}
mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, model=2))

P = nnx.with_partitioning
init = nnx.initializers.normal(0.2)   # keeps activations O(1)

class Tiny(nnx.Module):
    """embed -> mlp (relu) -> heads x kv; the heads dim (3) is indivisible by model=2."""
    def __init__(self, rngs):
        self.embed = nnx.Embed(64, 16, embedding_init=P(nnx.initializers.normal(1.0),
                                                        ("vocab", "embed")), rngs=rngs)
        self.up = nnx.Linear(16, 32, kernel_init=P(init, ("embed", "mlp")),
                             bias_init=P(init, ("mlp",)), rngs=rngs)
        self.down = nnx.Linear(32, 16, kernel_init=P(init, ("mlp", "embed")), rngs=rngs)
        self.qkv = nnx.Param(init(rngs.params(), (16, 3, 4)), out_sharding=("embed", "heads", "kv"))
        self.scale = nnx.Param(jnp.ones((16,)))        # no logical names: replicated
    def __call__(self, ids):
        x = self.embed(ids)
        x = x + self.down(jax.nn.relu(self.up(x)))
        return jnp.einsum("bld,dhk->blhk", x * self.scale, self.qkv[...])

def spec_list(spec):  # P('model', None) and P('model') are the same sharding
    spec = list(spec)
    while spec and spec[-1] is None:
        spec.pop()
    return spec

def specs(model):
    return {"/".join(map(str, p)): [spec_list(v.get_value().sharding.spec),
                                    list(v.get_value().addressable_shards[0].data.shape),
                                    list(v.get_value().shape)]
            for p, v in nnx.to_flat_state(nnx.state(model))}

with nnx.use_eager_sharding(False):
    plain = Tiny(nnx.Rngs(0))
ids = jax.random.randint(jax.random.key(1), (8, 5), 0, 64)
reference = np.asarray(plain(ids))
out["reference_max"] = float(np.abs(reference).max())

for rules_name, rules in (("default", sharding.DEFAULT_RULES), ("fsdp", sharding.FSDP_RULES)):
    with nnx.use_eager_sharding(False):
        model = Tiny(nnx.Rngs(0))
    sharding.shard_model(model, mesh, rules)
    logits = nnx.jit(lambda m, x: m(x))(model, sharding.shard_batch(ids, mesh))
    out[f"shard_model_{rules_name}"] = {
        "specs": specs(model), "max_diff": float(np.abs(np.asarray(logits) - reference).max()),
        "shardings": {"/".join(map(str, p)): spec_list(s.get_value().spec) for p, s in
                      nnx.to_flat_state(sharding.model_shardings(model, mesh, rules))}}

created = sharding.create_sharded(lambda: Tiny(nnx.Rngs(0)), mesh, sharding.FSDP_RULES)
out["create_sharded"] = {
    "specs": specs(created),
    "max_diff": float(np.abs(np.asarray(nnx.jit(lambda m, x: m(x))(created, ids)) - reference).max())}

batch = {"ids": np.zeros((8, 5), np.int32), "extra": [np.zeros((8,), np.float32)]}
placed = sharding.shard_batch(batch, mesh)
out["batch"] = {"ids": spec_list(placed["ids"].sharding.spec),
                "ids_shard": list(placed["ids"].addressable_shards[0].data.shape),
                "extra": spec_list(placed["extra"][0].sharding.spec),
                "batch_sharding3": list(sharding.batch_sharding(mesh, 3).spec)}
try:
    sharding.shard_batch({"ids": np.zeros((8, 5)), "labels": [np.zeros((6,))]}, mesh)
except ValueError as e:
    out["batch_error"] = str(e)
write_result(out)
'''


@pytest.fixture(scope="module")
def placement() -> dict:
    return run_with_fake_devices(PLACEMENT_SCRIPT, 8)


@pytest.mark.child
def test_make_mesh_fills_minus_one(placement):
    assert placement["fill"] == {"default": {"data": 8, "fsdp": 1, "model": 1},
                                 "model2": {"data": 4, "fsdp": 1, "model": 2},
                                 "fsdp_fill": {"data": 2, "fsdp": 4, "model": 1}}


@pytest.mark.child
def test_shard_model_places_params_by_rules_and_keeps_outputs(placement):
    # [spec, per-device shard shape, global shape]
    d = placement["shard_model_default"]
    assert d["specs"]["embed/embedding"][:2] == [["model"], [32, 16]]
    assert d["specs"]["up/kernel"][:2] == [[None, "model"], [16, 16]]
    assert d["specs"]["up/bias"][:2] == [["model"], [16]]
    assert d["specs"]["down/kernel"][:2] == [["model"], [16, 16]]
    assert d["specs"]["qkv"][:2] == [[], [16, 3, 4]]  # 3 heads: indivisible
    assert d["specs"]["scale"][:2] == [[], [16]]
    assert d["shardings"]["up/kernel"] == [None, "model"]
    assert d["max_diff"] <= 1e-6 * max(1.0, placement["reference_max"])

    f = placement["shard_model_fsdp"]
    assert f["specs"]["embed/embedding"][:2] == [["model", "fsdp"], [32, 8]]
    assert f["specs"]["up/kernel"][:2] == [["fsdp", "model"], [8, 16]]
    assert f["specs"]["down/kernel"][:2] == [["model", "fsdp"], [16, 8]]
    assert f["specs"]["qkv"][:2] == [["fsdp"], [8, 3, 4]]
    assert f["max_diff"] <= 1e-6 * max(1.0, placement["reference_max"])


@pytest.mark.child
def test_create_sharded_never_holds_the_whole_model(placement):
    c = placement["create_sharded"]
    sharded = 0
    for name, (spec, shard_shape, shape) in c["specs"].items():
        expected = placement["shard_model_fsdp"]["specs"][name]
        assert spec == expected[0], name
        if any(s is not None for s in spec):
            assert shard_shape != shape and all(a <= b for a, b in zip(shard_shape, shape)), name
            sharded += 1
    assert sharded == 5  # embedding, up kernel+bias, down kernel, qkv
    # same initialization as the unsharded model (threefry is partitionable): same outputs
    assert c["max_diff"] <= 1e-6 * max(1.0, placement["reference_max"])


@pytest.mark.child
def test_shard_batch_splits_leading_dim_over_data_and_fsdp(placement):
    b = placement["batch"]
    assert b["ids"] == [["data", "fsdp"]]
    assert b["ids_shard"] == [2, 5]
    assert b["extra"] == [["data", "fsdp"]]
    assert b["batch_sharding3"] == [["data", "fsdp"], None, None]
    err = placement["batch_error"]
    assert "['labels'][0]" in err and "batch size 6" in err and "4 data x fsdp" in err


# ------------------------------------------------------- two processes (multi-host on one machine)

TWO_PROCESS_SCRIPT = r'''
import os
import jax
# jax's own initialize, not clarifyjax.core.distributed's: the launch variables passed by hand
pid = int(os.environ["CLARIFYJAX_PROCESS_ID"])
jax.distributed.initialize(coordinator_address=os.environ["CLARIFYJAX_COORDINATOR"],
                           num_processes=2, process_id=pid)
import numpy as np
from jax.experimental import multihost_utils
from clarifyjax.core import sharding
from clarifyjax.files.child_result import write_result

out = {}
mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, model=2))      # 8 devices, 4 per process
local = np.arange(4 * 3).reshape(4, 3) + 100 * pid                # this process's 4 of 8 rows
x = sharding.shard_batch({"x": local}, mesh)["x"]
out["global_shape"] = list(x.shape)
out["gathered"] = np.asarray(multihost_utils.process_allgather(x, tiled=True)).tolist()
try:
    sharding.shard_batch({"x": np.zeros((3, 2))}, mesh)
except ValueError as e:
    out["error"] = str(e)
multihost_utils.sync_global_devices("results-ready")  # neither process shuts down while the other works
write_result(out)
jax.distributed.shutdown()
'''


@pytest.mark.child
def test_shard_batch_with_two_processes():
    """Each process passes its own rows and gets the global batch (gloo collectives on CPU)."""
    results = run_processes(TWO_PROCESS_SCRIPT, 2, n_devices=4, timeout=240)
    expected = [[r + 100 * pid for r in range(3 * i, 3 * i + 3)] for pid in (0, 1) for i in range(4)]
    for r in results:
        assert r["global_shape"] == [8, 3]
        assert r["gathered"] == expected
        assert "batch size 3" in r["error"] and "2 data x fsdp shards held by this process" in r["error"]
