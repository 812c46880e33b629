"""launch/memory_plan.py: the bytes per device of clarifyjax/presets/ppo_t5_large.yaml, checked against plain
parameter counts (closed forms of the T5 and RoBERTa architectures written here) times bytes, and
against a plain application of the FSDP rule (split `embed` over fsdp when it divides)."""
from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest

from clarifyjax.training.memory_plan import abstract_state, causal_activation_bytes
from helpers.env import REPO_ROOT

GiB = 2 ** 30


@pytest.fixture(scope="module")
def mp():
    spec = importlib.util.spec_from_file_location("memory_plan", REPO_ROOT / "launch" /
                                                  "memory_plan.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["memory_plan"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("memory_plan", None)


@pytest.fixture(scope="module")
def plans(mp, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    result = mp.main(["--markdown", str(out / "plan.md"), "--json", str(out / "plan.json")])
    return dict(result), out


def t5_count(hf: dict) -> int:
    """HF T5 v1.0 (relu, tied embeddings): embedding, per layer attention q/k/v/o, MLP wi/wo and
    RMSNorm scales, one relative-position table and one final norm per stack."""
    V, d, f, H, k, L = (hf[n] for n in ("vocab_size", "d_model", "d_ff", "num_heads", "d_kv",
                                        "num_layers"))
    B = hf["relative_attention_num_buckets"]
    assert hf.get("feed_forward_proj", "relu") == "relu" and hf.get("tie_word_embeddings", True)
    encoder = L * (4 * d * H * k + 2 * d * f + 2 * d) + d + B * H
    decoder = L * (8 * d * H * k + 2 * d * f + 3 * d) + d + B * H
    return V * d + encoder + decoder


def roberta_classifier_count(hf: dict, labels: int) -> int:
    V, d, f, L = (hf[n] for n in ("vocab_size", "hidden_size", "intermediate_size",
                                  "num_hidden_layers"))
    embeddings = (V + hf["max_position_embeddings"] + hf["type_vocab_size"]) * d + 2 * d
    layer = 4 * (d * d + d) + 2 * d + (d * f + f) + (f * d + d) + 2 * d
    head = (d * d + d) + (d * labels + labels)
    return embeddings + L * layer + head


def test_parameter_counts_are_the_architectures(mp, plans):
    by_name, _ = plans
    large, t5_11b = mp.KNOWN_ARCHITECTURES["t5-large"], mp.KNOWN_ARCHITECTURES["t5-11b"]
    assert t5_count(large) == 737_668_096  # Hugging Face's count for t5-large
    p = by_name["v4-32, judge t5-large"]
    models = {m["role"]: m for m in p["models"]}
    assert list(models) == ["policy", "value", "reference", "answerer", "fusion", "judge", "nli"]
    for role in ("policy", "reference", "answerer", "fusion", "judge"):
        assert models[role]["architecture"] == "t5-large", role  # via clarifyjax/presets/sft_*.yaml
        assert models[role]["n_params"] == t5_count(large), role
    assert models["value"]["n_params"] == t5_count(large) + large["d_model"] + 1  # scalar head
    nli = mp.KNOWN_ARCHITECTURES["roberta-large-wanli"]
    assert models["nli"]["architecture"] == "roberta-large-wanli"
    assert models["nli"]["n_params"] == roberta_classifier_count(nli, 3)
    judge_11b = {m["role"]: m for m in by_name["v4-32, judge t5-11b"]["models"]}["judge"]
    assert judge_11b["n_params"] == t5_count(t5_11b)
    for m in list(models.values()) + [judge_11b]:  # every parameter in float32 (param_dtype)
        assert m["bytes_total"] == 4 * m["n_params"], m["role"]


def fsdp_bytes_per_device(flat_state, fsdp: int) -> int:
    """Plain FSDP on a (data, fsdp, model=1) mesh: a dimension named 'embed' that fsdp divides is
    split fsdp ways; everything else is whole on every device."""
    total = 0
    for _, var in flat_state:
        value = var.get_value()
        names = var.get_metadata().get("out_sharding") or ()
        split = any(n == "embed" and s % fsdp == 0 for n, s in zip(names, value.shape))
        total += math.prod(value.shape) * value.dtype.itemsize // (fsdp if split else 1)
    return total


@pytest.mark.parametrize("column, fsdp", [("v4-32, judge t5-large", 4),
                                          ("8xH100, judge t5-11b", 4)])
def test_bytes_per_device_follow_the_fsdp_rule(mp, plans, column, fsdp):
    p = plans[0][column]
    assert p["mesh"] == ({"data": 4, "fsdp": 4, "model": 1} if column.startswith("v4")
                         else {"data": 2, "fsdp": 4, "model": 1})
    models = {m["role"]: m for m in p["models"]}
    large = mp.KNOWN_ARCHITECTURES["t5-large"]
    # closed form for T5: only the two relative-position tables (buckets x heads) lack 'embed'
    relpos = 2 * large["relative_attention_num_buckets"] * large["num_heads"]
    assert models["policy"]["bytes_per_device"] == 4 * ((t5_count(large) - relpos) // fsdp + relpos)
    for role, m in models.items():
        kind = "encoder" if role == "nli" else "value" if role == "value" else "t5"
        hf = mp.KNOWN_ARCHITECTURES[m["architecture"]]
        flat = abstract_state(kind, json.dumps(hf, sort_keys=True), "float32")
        assert sum(math.prod(v.get_value().shape) for _, v in flat) == m["n_params"]
        assert m["bytes_per_device"] == fsdp_bytes_per_device(flat, fsdp), role
    trainable = models["policy"]["bytes_per_device"] + models["value"]["bytes_per_device"]
    c = p["components"]
    assert c["Adam moments (policy + value)"] == 2 * trainable
    assert c["gradients (policy + value)"] == trainable
    assert p["total_bytes"] == sum(c.values())
    assert sum(c[f"params: {r}"] for r in models) == sum(m["bytes_per_device"] for m in
                                                         models.values())
    assert p["fraction_of_hbm"] == p["total_bytes"] / p["hbm_bytes"] < 1


def test_activations_scale_with_rows_per_device(plans):
    by_name, _ = plans
    v4, h100 = by_name["v4-32, judge t5-large"], by_name["8xH100, judge t5-large"]
    # 64 situations over data x fsdp = 16 and 8 devices
    assert (v4["minibatch_rows_per_device"], h100["minibatch_rows_per_device"]) == (4, 8)
    key = "activations (PPO minibatch, bound)"
    assert h100["components"][key] == 2 * v4["components"][key]
    # the bound is above what XLA kept on an H100 (0.45 GiB for 4 rows, 0.97 GiB for 8)
    assert v4["components"][key] > 0.45 * GiB and h100["components"][key] > 0.97 * GiB


def test_replicated_rules_put_every_parameter_on_every_device(mp):
    plans = dict(mp.main(["mesh.rules=default", "--hardware", "v4-32", "--judges", "config"]))
    (p,) = plans.values()
    for m in p["models"]:
        assert m["bytes_per_device"] == m["bytes_total"], m["role"]
    assert p["components"]["FSDP all-gather (largest layer)"] == 0


def test_outputs_and_command(plans):
    by_name, out = plans
    markdown = (out / "plan.md").read_text()
    assert "`python launch/memory_plan.py`" in markdown
    assert markdown.count("\n| ") >= 15 and "| **total per device** |" in markdown
    for name, p in by_name.items():
        assert name in markdown and f"{p['total_bytes'] / GiB:.2f}" in markdown
    assert json.loads((out / "plan.json").read_text()).keys() == by_name.keys()


@pytest.mark.e2e
def test_model_folder_with_config_json_wins(mp, tmp_path):
    small = mp.KNOWN_ARCHITECTURES["t5-small"]
    (tmp_path / "config.json").write_text(json.dumps(small))
    plans = dict(mp.main([f"policy.init={tmp_path}", "--hardware", "8xH100", "--judges",
                          "config"]))
    (p,) = plans.values()
    policy = next(m for m in p["models"] if m["role"] == "policy")
    assert policy["n_params"] == t5_count(small)


@pytest.mark.e2e
def test_unknown_model_is_a_clear_error(mp):
    with pytest.raises(mp.PlanError, match="rewards.fusion|fusion: cannot size model "
                                           "'pretrained/mystery'"):
        mp.main(["rewards.fusion.init=pretrained/mystery", "--hardware", "v4-32",
                 "--judges", "config"])
    with pytest.raises(mp.PlanError, match="kind: ppo"):
        mp.main([str(REPO_ROOT / "clarifyjax" / "presets" / "sft_judge.yaml")])


def test_a_decoder_only_policy_is_sized_as_its_family(mp):
    """Issue 38: a Qwen3-0.6B question policy (by name, no folder): policy, value (its trunk and
    a scalar head) and reference sized as Qwen3's closed form, activations as a decoder's."""
    plans = dict(mp.main(["policy.init=pretrained/Qwen3-0.6B", "policy.prompt_format=chat",
                          "--hardware", "8xH100", "--judges", "config"]))
    (p,) = plans.values()
    by_role = {m["role"]: m for m in p["models"]}
    hf = mp.KNOWN_ARCHITECTURES["Qwen3-0.6B"]
    H, F, L, V = (hf[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                  "vocab_size"))
    n, k, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    layer = 2 * H * n * d + 2 * H * k * d + 3 * H * F + 2 * H + 2 * d  # q/o, k/v, MLP, norms
    count = V * H + L * layer + H  # tied embedding, layers, final norm
    assert by_role["policy"]["n_params"] == by_role["reference"]["n_params"] == count
    assert by_role["value"]["n_params"] == count + H + 1
    assert count == 596_049_920  # Qwen3-0.6B's published size
    rows, source, target = p["minibatch_rows_per_device"], p["source_length"], p["target_length"]
    assert p["components"]["activations (PPO minibatch, bound)"] == sum(
        causal_activation_bytes(hf, rows, source, target, 2, logits) for logits in (True, False))
