"""The reward models sharded over a process's own devices (`sharding.process_mesh`).

Each process of a PPO run scores its own rows, so `train.build_reward_fn` loads the answerer,
fusion model, judge and NLI filter onto the process's devices, split by the run's rules. Checked
in a child interpreter with 8 fake CPU devices, on tiny random models:
* every parameter lies on the process mesh with the sharding its logical axes ask for, each device
  holding only its slice (FSDP rules on data=2 x fsdp=2 x model=2: a device holds 25% of a T5's
  bytes and 30% of an encoder's, whose embeddings' sizes the model axis may not divide);
* the sharded pipeline gives the unsharded pipeline's outputs on 64 situations of δ-CLARIFY
  dev.tsv (the same texts; probabilities and rewards within 1e-5), and so does an encoder judge.
`process_sizes` itself is checked for the layouts a pod run meets.
"""
from __future__ import annotations

import json
import textwrap

import pytest

from clarifyjax.core import sharding
from conftest import shared_data
from helpers.children import run_with_fake_devices
from helpers.tiny_models import tiny_classifier_folder, tiny_nli_folder, tiny_t5_folder


@pytest.mark.parametrize("global_sizes, n_local, expected", [
    ({"data": 4, "fsdp": 4, "model": 1}, 4, {"data": 1, "fsdp": 4, "model": 1}),   # v4-32, fsdp 4
    ({"data": 1, "fsdp": 16, "model": 1}, 4, {"data": 1, "fsdp": 4, "model": 1}),  # fsdp over hosts
    ({"data": 2, "fsdp": 2, "model": 2}, 8, {"data": 2, "fsdp": 2, "model": 2}),   # one host
    ({"data": 1, "fsdp": 2, "model": 4}, 4, {"data": 1, "fsdp": 1, "model": 4}),
    ({"data": 8, "fsdp": 1, "model": 1}, 8, {"data": 8, "fsdp": 1, "model": 1}),
    ({"data": 1, "fsdp": 3, "model": 1}, 4, {"data": 4, "fsdp": 1, "model": 1}),
])
def test_process_sizes(global_sizes, n_local, expected):
    assert sharding.process_sizes(global_sizes, n_local) == expected


def test_resolve_sizes_fills_and_checks():
    assert sharding.resolve_sizes({"fsdp": 2, "model": 2}, 16) == {"data": 4, "fsdp": 2, "model": 2}
    with pytest.raises(ValueError, match="does not divide the 6 devices"):
        sharding.resolve_sizes({"fsdp": 4}, 6)


CHILD = r"""
import csv, json
import numpy as np, jax
from flax import nnx
from clarifyjax.core import sharding
from clarifyjax.files.child_result import write_result
from clarifyjax.reward.judge import ClassifierJudge
from clarifyjax.reward.pipeline import PipelineConfig, RewardPipeline

F = json.loads(FOLDERS)
with open(F["dev"], newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:64]
situations, questions = [r["situation"] for r in rows], [r["question"] for r in rows]

mesh = sharding.process_mesh({"data": 2, "fsdp": 2, "model": 2})
rules = sharding.FSDP_RULES
config = PipelineConfig(answer_max_length=10, fusion_max_length=14, judgment_max_length=6)
kwargs = dict(answerer=F["answerer"], fusion=F["fusion"], judge=F["judge"], nli=F["nli"],
              config=config, nli_batch_size=128)
plain = RewardPipeline.from_folders(**kwargs)
sharded = RewardPipeline.from_folders(**kwargs, mesh=mesh, rules=rules)

def placement(model):
    expected = dict(nnx.to_flat_state(sharding.model_shardings(nnx.state(model), mesh, rules)))
    wrong, split, total, per_device = [], 0, 0, 0
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        x = var.get_value()
        want = expected[path].get_value()
        if x.sharding != want:
            wrong.append(f"{path}: {x.sharding} != {want}")
        shard = x.addressable_shards[0].data
        total += x.nbytes
        per_device += shard.nbytes
        split += shard.shape != x.shape
        if any(want.spec) != (shard.shape != x.shape):
            wrong.append(f"{path}: spec {want.spec} but shard {shard.shape} of {x.shape}")
    return {"wrong": wrong[:5], "split": int(split), "share": per_device / total}

models = {"answerer": sharded.answerer.model, "fusion": sharded.fusion.model,
          "judge": sharded.judge.seq2seq.model}
nli_model = nnx.merge(sharded.nli._graphdef, sharded.nli._state)
result = {name: placement(m) for name, m in {**models, "nli": nli_model}.items()}
result["mesh_devices"] = sorted(d.id for d in mesh.devices.flat)
result["mesh_shape"] = dict(mesh.shape)

a = plain(situations, questions, rng=0)
b = sharded(situations, questions, rng=0)
result["same_texts"] = all(getattr(a, k) == getattr(b, k) for k in (
    "judgments", "weak_answers", "strong_answers", "weak_situations", "strong_situations"))
result["max_diff"] = max(float(np.abs(getattr(a, k) - getattr(b, k)).max())
                         for k in ("reward", "jsd", "p_base", "p_weak", "p_strong"))
result["same_dropped"] = bool((a.dropped == b.dropped).all())
result["dropped"] = int(a.dropped.sum())

cj_plain = ClassifierJudge.from_pretrained(F["classifier"])
cj = ClassifierJudge.from_pretrained(F["classifier"], mesh=mesh, rules=rules)
result["classifier"] = placement(cj.model)
texts = situations[:13]
result["classifier_diff"] = float(np.abs(cj_plain.class_probabilities(texts)
                                         - cj.class_probabilities(texts)).max())
write_result(result)
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    folders = {
        "answerer": tiny_t5_folder(tmp_path_factory, seed=21, initializer_factor=3.0),
        "fusion": tiny_t5_folder(tmp_path_factory, family="v1.1", seed=12,
                                 initializer_factor=3.0),
        "judge": tiny_t5_folder(tmp_path_factory, seed=13),
        "nli": tiny_nli_folder(tmp_path_factory, seed=14),
        "classifier": tiny_classifier_folder(tmp_path_factory, seed=15),
        "dev": shared_data("delta-clarify/dev.tsv"),
    }
    code = f"FOLDERS = {json.dumps(json.dumps({k: str(v) for k, v in folders.items()}))}\n"
    return run_with_fake_devices(code + textwrap.dedent(CHILD), 8, timeout=600)


@pytest.mark.slow  # the child loads and runs two pipelines: ~35 s
@pytest.mark.parametrize("name", ["answerer", "fusion", "judge", "nli", "classifier"])
def test_every_parameter_sharded_on_the_process_mesh(child, name):
    assert child["mesh_shape"] == {"data": 2, "fsdp": 2, "model": 2}
    assert child["mesh_devices"] == list(range(8))
    got = child[name]
    assert got["wrong"] == []
    assert got["split"] > 0
    # embed over fsdp and mlp/heads/vocab over model: a quarter of the matrices, whole norms
    assert got["share"] <= (0.3 if name in ("answerer", "fusion", "judge") else 0.35), got


@pytest.mark.slow
def test_sharded_pipeline_gives_the_same_rewards(child):
    assert child["same_texts"]
    assert child["same_dropped"] and child["dropped"] > 0
    assert child["max_diff"] < 1e-5
    assert child["classifier_diff"] < 1e-5
