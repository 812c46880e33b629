"""Bytes per device of a PPO run: every model's parameters, Adam state, gradients, activations
(a T5 policy's or a decoder-only one's, `causal_activation_bytes`).

    plan(cfg, Hardware("8 x H100 80GB", 8, 81559 * 2 ** 20, 8), configs_dir) -> dict

`launch/memory_plan.py` prints it for a few hardware targets, and `clarifyjax train CONFIG
--dry-run` for the devices it sees. Nothing is allocated: models are abstract and the mesh an
`AbstractMesh` (how each term is counted is written above `plan`)."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any

from flax import nnx
from jax.sharding import AbstractMesh

from clarifyjax.core import sharding
from clarifyjax.config import ModelConfig, PPOConfig, TinyModelSpec, load_config
from clarifyjax.models.safetensors_io import read_config
from clarifyjax.models.state import shape_only
from clarifyjax.models.deberta import DebertaSequenceClassifier
from clarifyjax.models.encoder import EncoderConfig, SequenceClassifier
from clarifyjax.models.hf.deberta_map import deberta_config_from_hf
from clarifyjax.models.causal_lm import CausalLM
from clarifyjax.models.hf.causal_lm_map import MODEL_TYPES as CAUSAL_MODEL_TYPES, config_from_hf
from clarifyjax.models.t5 import T5, T5Config
from clarifyjax.rl.value import CausalValueModel, ValueModel

# Model folders written relative to the repository (as the configs write them) are found from any
# working directory.
GiB = 2 ** 30
_T5 = {"model_type": "t5", "vocab_size": 32128, "relative_attention_num_buckets": 32,
       "relative_attention_max_distance": 128, "num_layers": 24}
_T5_V1_1 = dict(_T5, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
_ROBERTA_LARGE = {"model_type": "roberta", "vocab_size": 50265, "hidden_size": 1024,
                  "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
                  "hidden_act": "gelu", "max_position_embeddings": 514, "type_vocab_size": 1,
                  "layer_norm_eps": 1e-5, "pad_token_id": 1}
# The fields of the Hugging Face config.json files that fix the parameter shapes.
KNOWN_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "t5-small": dict(_T5, d_model=512, d_kv=64, d_ff=2048, num_heads=8, num_layers=6),
    "t5-base": dict(_T5, d_model=768, d_kv=64, d_ff=3072, num_heads=12, num_layers=12),
    "t5-large": dict(_T5, d_model=1024, d_kv=64, d_ff=4096, num_heads=16),
    "t5-3b": dict(_T5, d_model=1024, d_kv=128, d_ff=16384, num_heads=32),
    "t5-11b": dict(_T5, d_model=1024, d_kv=128, d_ff=65536, num_heads=128),  # Delphi's size
    "t5-v1_1-large": dict(_T5_V1_1, d_model=1024, d_kv=64, d_ff=2816, num_heads=16),
    "flan-t5-large": dict(_T5_V1_1, d_model=1024, d_kv=64, d_ff=2816, num_heads=16),
    "t5-v1_1-xxl": dict(_T5_V1_1, d_model=4096, d_kv=64, d_ff=10240, num_heads=64),
    "flan-t5-xxl": dict(_T5_V1_1, d_model=4096, d_kv=64, d_ff=10240, num_heads=64),
    "roberta-large": _ROBERTA_LARGE,
    # decoder-only question policies (their Hugging Face config.json, shape fields)
    "Qwen3-0.6B": {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
                   "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
                   "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": True,
                   "bos_token_id": 151643, "eos_token_id": 151645},
    "Llama-3.2-1B": {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
                     "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                     "rope_theta": 500000.0, "tie_word_embeddings": True,
                     "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192},
                     "bos_token_id": 128000, "eos_token_id": 128001},
    "roberta-large-wanli": dict(_ROBERTA_LARGE, id2label={
        "0": "contradiction", "1": "entailment", "2": "neutral"}),
    "roberta-large-mnli": dict(_ROBERTA_LARGE, id2label={
        "0": "CONTRADICTION", "1": "NEUTRAL", "2": "ENTAILMENT"}),
}


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str
    devices: int
    hbm_bytes: int
    devices_per_host: int


class PlanError(ValueError):
    """A model the plan cannot size; the message names the role and the path."""


# --------------------------------------------------------------------------- architectures


@functools.cache
def _sft_outputs(configs_dir: Path) -> dict[str, tuple[Path, ModelConfig]]:
    """``runs/<name>/final`` -> (the SFT config that writes it, its model), for configs_dir."""
    out = {}
    for path in sorted(configs_dir.glob("sft_*.yaml")):
        sft = load_config(path)
        out[f"{sft.run.directory}/final"] = (path, sft.model)
    return out


def resolve_architecture(model: ModelConfig, role: str, configs_dir: Path,
                         seen: tuple[Path, ...] = ()) -> tuple[str, dict]:
    """(name, Hugging Face config dict) of a model of the config, without loading weights."""
    if model.tiny is not None:
        return "tiny", {"tiny": dataclasses.asdict(model.tiny)}
    init = str(model.init).rstrip("/")
    folder = Path(init)  # relative to the working directory, as the run reads it
    if (folder / "config.json").exists():
        return folder.name, read_config(folder)
    sft = _sft_outputs(configs_dir).get(init)  # the final export of an SFT run
    if sft is not None and sft[0] not in seen:
        return resolve_architecture(sft[1], f"{role} <- {sft[0].name}", configs_dir,
                                    seen + (sft[0],))
    name = init.split("/")[-1]
    if name in KNOWN_ARCHITECTURES:
        return name, KNOWN_ARCHITECTURES[name]
    raise PlanError(f"{role}: cannot size model {init!r}: no config.json there, no SFT config "
                    f"in {configs_dir} writes it, and {name!r} is not one of "
                    f"{sorted(KNOWN_ARCHITECTURES)}")


def _is_encoder(hf: dict) -> bool:
    return hf.get("model_type") in ("bert", "roberta", "deberta-v2")


def is_causal(hf: dict) -> bool:
    """Whether a config.json dict is a decoder-only model's (`causal_lm_map.MODEL_TYPES`)."""
    return hf.get("model_type") in CAUSAL_MODEL_TYPES


@functools.cache
def abstract_state(kind: str, hf_json: str, param_dtype: str):
    """The abstract (shape-only) state of one model ("t5", "value" or "encoder"), flattened:
    [(path, Variable holding a ShapeDtypeStruct)]; cached per architecture."""
    hf = json.loads(hf_json)
    if kind == "encoder" and hf.get("model_type") == "deberta-v2":  # type_vocab_size 0 allowed
        cfg = deberta_config_from_hf(hf, param_dtype=param_dtype)
        return nnx.to_flat_state(nnx.state(shape_only(DebertaSequenceClassifier, cfg)))
    if kind == "encoder":
        cfg = EncoderConfig.from_hf(hf, param_dtype=param_dtype)
        return nnx.to_flat_state(nnx.state(shape_only(SequenceClassifier, cfg)))
    if is_causal(hf):  # a decoder-only policy, its reference or its value model
        cfg = config_from_hf(hf, param_dtype=param_dtype)
        model = CausalValueModel if kind == "value" else CausalLM
        return nnx.to_flat_state(nnx.state(shape_only(model, cfg)))
    if "tiny" in hf:
        cfg = T5Config(**TinyModelSpec(**hf["tiny"]).t5_kwargs(), param_dtype=param_dtype)
    else:
        cfg = T5Config.from_hf(hf, param_dtype=param_dtype)
    return nnx.to_flat_state(nnx.state(shape_only(ValueModel if kind == "value" else T5, cfg)))


# --------------------------------------------------------------------------- sizes


@dataclasses.dataclass
class ModelPlan:
    role: str
    architecture: str
    trainable: bool
    n_params: int
    bytes_total: int
    bytes_per_device: int
    largest_layer_bytes: int  # one layer (or top-level parameter), unsharded


def mesh_sizes(layout, n_devices: int) -> dict[str, int]:
    """The config's (data, fsdp, model) sizes for `n_devices`, the -1 axis filled."""
    try:
        return sharding.resolve_sizes(layout, n_devices)
    except ValueError as e:
        raise PlanError(f"{e} (of the hardware)") from e


def size_model(role: str, model: ModelConfig, kind: str, mesh: AbstractMesh, rules,
               configs_dir: Path, trainable: bool) -> ModelPlan:
    name, hf = resolve_architecture(model, role, configs_dir)
    if kind != "encoder" and _is_encoder(hf):
        kind = "encoder"
    flat = abstract_state(kind, json.dumps(hf, sort_keys=True), model.param_dtype)
    state = nnx.from_flat_state(flat)
    shardings = dict(nnx.to_flat_state(sharding.model_shardings(state, mesh, rules)))
    n = total = per_device = 0
    layers: dict[tuple, int] = {}
    for path, var in flat:
        value = var.get_value()
        size, itemsize = math.prod(value.shape), value.dtype.itemsize
        n += size
        total += size * itemsize
        shard = shardings[path].get_value().shard_shape(value.shape)
        per_device += math.prod(shard) * itemsize
        # a layer = the path up to its index in a layer list (e.g. encoder/layers/3)
        cut = next((i + 1 for i, p in enumerate(path) if isinstance(p, int)), len(path))
        layers[path[:cut]] = layers.get(path[:cut], 0) + size * itemsize
    return ModelPlan(role, name, trainable, n, total, per_device, max(layers.values()))


# An upper bound: every intermediate of one PPO minibatch's forward pass that a backward pass could
# need, for policy and value together, in the compute dtype with softmax and logits in float32, as
# if nothing were fused or rematerialized. XLA keeps much less: compiled for one H100 (jax 0.11.2),
# the T5-large policy + value gradient of 4 and 8 rows (128 source / 30 target tokens, bfloat16)
# needed 0.45 and 0.97 GiB of temporaries against this bound's 1.70 and 3.41 GiB.
def activation_bytes(hf: dict, rows: int, source: int, target: int, compute_bytes: int,
                     logits: bool) -> int:
    """Saved activations of one T5 forward for backward, `rows` sequences (an estimate).

    Per encoder token: norms (2 x 2d), q k v and context (4 x inner), attention output (d),
    MLP input (d), wi (1 or 2 x d_ff), activation (d_ff), wo output (d); per decoder token the
    same with a cross-attention block, whose keys and values span the source; attention scores
    and weights in float32; vocabulary logits and log-softmax in float32 when `logits`.
    """
    d, f, heads = hf["d_model"], hf["d_ff"], hf["num_heads"]
    inner = heads * hf["d_kv"]
    gated = 2 if hf.get("feed_forward_proj", "relu").startswith("gated") else 1
    layers, dec_layers = hf["num_layers"], hf.get("num_decoder_layers") or hf["num_layers"]
    enc = source * (6 * d + 4 * inner + (gated + 1) * f) * compute_bytes \
        + 2 * heads * source * source * 4
    dec = (target * (9 * d + 6 * inner + (gated + 1) * f) + 2 * inner * source) * compute_bytes \
        + 2 * heads * (target * target + target * source) * 4
    per_row = layers * enc + dec_layers * dec + (source + target) * d * compute_bytes
    if logits:
        per_row += 2 * target * hf["vocab_size"] * 4
    return rows * per_row


def causal_activation_bytes(hf: dict, rows: int, source: int, target: int, compute_bytes: int,
                            logits: bool) -> int:
    """`activation_bytes` of a decoder-only model reading `source` + `target` tokens as one
    sequence: per token and layer two norms (2 x H), q, k, v and context ((2 n + 2 k) x d),
    attention output and MLP input (2 x H), gate / up (1 or 2 x F), activation (F), down output
    (H); attention scores and weights in float32; the vocabulary logits and log-softmax in
    float32 at the `target` positions only (`policy.response_logits`) when `logits`."""
    c = config_from_hf(hf)
    n, k, d, h, f = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size, c.ffn_size
    length = source + target
    gated = 2 if c.gated_mlp else 1
    per_layer = length * (5 * h + (2 * n + 2 * k) * d + (gated + 1) * f) * compute_bytes \
        + 2 * n * length * length * 4
    per_row = c.num_layers * per_layer + length * c.embed_size * compute_bytes
    if logits:
        per_row += 2 * target * c.vocab_size * 4
    return rows * per_row


# --------------------------------------------------------------------------- the plan


# For one hardware target, every model of the run is built abstractly (`nnx.eval_shape`), the mesh
# resolved for that many devices on an AbstractMesh, each parameter sharded by the config's rules
# (`sharding.model_shardings`, as training does), and each device's shards added up. Models come
# from the config: a folder with a config.json is read; runs/<sft run>/final is traced to the SFT
# config that writes it (clarifyjax/presets/sft_*.yaml) and its init; a missing folder is looked up by its last
# name in `KNOWN_ARCHITECTURES`. Per device: parameters (policy, value and reference on the run's
# mesh; the reward models on each host's own devices, `sharding.process_mesh`, as the loop places
# them); Adam's two moments (in the parameters' dtype) and gradients of policy + value (the policy
# alone for ``ppo.algorithm`` rloo or grpo, which have no value model); activations
# (`activation_bytes`); the FSDP all-gather buffer (the largest layer of any model, unsharded).
def plan(cfg: PPOConfig, hardware: Hardware, configs_dir: Path) -> dict:
    """Bytes per device of every component of `cfg` on `hardware` (a JSON-ready dict)."""
    if not isinstance(cfg, PPOConfig):
        raise PlanError(f"the memory plan is for PPO configs (kind: ppo), got kind {cfg.kind!r}")
    sizes = mesh_sizes(cfg.mesh, hardware.devices)
    mesh = AbstractMesh(tuple(sizes[a] for a in sharding.MESH_AXES), sharding.MESH_AXES)
    # the reward models live on each host's own devices (`loops.build_reward_fn`)
    local = sharding.process_sizes(sizes, hardware.devices_per_host)
    host_mesh = AbstractMesh(tuple(local[a] for a in sharding.MESH_AXES), sharding.MESH_AXES)
    rules = sharding.RULES[cfg.mesh.rules]
    value_model = cfg.value.model or cfg.policy
    has_value = cfg.ppo.algorithm == "ppo"  # rloo, grpo: no value model
    roles = [("policy", cfg.policy, "t5", True)]
    roles += [("value", value_model, "value", True)] if has_value else []
    roles += [("reference", cfg.reference or cfg.policy, "t5", False),
              ("answerer", cfg.rewards.answerer, "t5", False),
              ("fusion", cfg.rewards.fusion, "t5", False),
              ("judge", cfg.rewards.judge.model,
               "encoder" if cfg.rewards.judge.kind == "encoder" else "t5", False)]
    if cfg.rewards.nli is not None:
        roles.append(("nli", cfg.rewards.nli, "encoder", False))
    models = [size_model(r, m, k, mesh if r in ("policy", "value", "reference") else host_mesh,
                         rules, configs_dir, t) for r, m, k, t in roles]

    trainable_per_device = sum(m.bytes_per_device for m in models if m.trainable)
    if cfg.optimizer.name not in ("adam", "adamw"):
        raise PlanError(f"optimizer.name = {cfg.optimizer.name!r}: the plan counts Adam's two "
                        f"moments; other optimizers are not modelled")
    batch_shards = sizes["data"] * sizes["fsdp"]
    minibatch = cfg.ppo.batch_size // cfg.ppo.minibatches
    rows = math.ceil(minibatch / batch_shards)
    compute_bytes = 2 if cfg.policy.dtype in ("bfloat16", "float16") else 4
    source, target = cfg.policy.max_input_length, cfg.ppo.sampling.max_new_tokens
    _, policy_hf = resolve_architecture(cfg.policy, "policy", configs_dir)
    value_hf = resolve_architecture(value_model, "value", configs_dir)[1] if has_value else {}
    if "tiny" in policy_hf or "tiny" in value_hf:
        raise PlanError("activation estimates need Hugging Face T5 architectures, not tiny specs")
    estimate = causal_activation_bytes if is_causal(policy_hf) else activation_bytes
    activations = estimate(policy_hf, rows, source, target, compute_bytes, True)
    if has_value:
        activations += estimate(value_hf, rows, source, target, compute_bytes, False)
    trained = "policy + value" if has_value else "policy"
    components = {f"params: {m.role}": m.bytes_per_device for m in models}
    components[f"Adam moments ({trained})"] = 2 * trainable_per_device
    components[f"gradients ({trained})"] = trainable_per_device
    components["activations (PPO minibatch, bound)"] = activations
    gathers = cfg.mesh.rules == "fsdp" and sizes["fsdp"] > 1  # else no weight is all-gathered
    components["FSDP all-gather (largest layer)"] = (
        max(m.largest_layer_bytes for m in models) if gathers else 0)
    total = sum(components.values())
    return {"hardware": hardware.name, "devices": hardware.devices, "hbm_bytes": hardware.hbm_bytes,
            "mesh": sizes, "reward_models_mesh": local, "rules": cfg.mesh.rules,
            "minibatch_rows_per_device": rows, "source_length": source, "target_length": target,
            "models": [dataclasses.asdict(m) for m in models],
            "components": components, "total_bytes": total,
            "fraction_of_hbm": total / hardware.hbm_bytes}
