"""The models a training run starts from: a T5 built from a config's model section (a folder's
weights, or a tiny random model, `t5_config_from_spec`), an encoder classifier (`build_classifier`),
and a PPO run's policy, frozen reference and value model (`build_ppo_models`); each real, or
abstract (`abstract_model`: `jax.ShapeDtypeStruct`s with their shardings, for the dry run).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from clarifyjax.core import sharding
from clarifyjax.config import ConfigError
from clarifyjax.models.hf import (load_t5, CheckpointError, check_causal_lm_folder, load_causal_lm,
                                  load_classifier, load_encoder_tokenizer)
from clarifyjax.models.hf.causal_lm_map import MODEL_TYPES as CAUSAL_MODEL_TYPES
from clarifyjax.models.causal_lm import CausalLM, CausalLMConfig
from clarifyjax.models.safetensors_io import read_config
from clarifyjax.models.t5 import T5, T5Config
from clarifyjax.models.state import copy_params, shape_only, split_model
from clarifyjax.rl.prompts import CausalPolicyText
from clarifyjax.rl.value import CausalValueModel, ValueModel
from clarifyjax.text.tokenizer import Tokenizer


def t5_config_from_spec(model_cfg) -> T5Config:
    """The T5Config of a tiny random model (``model.tiny``): no dropout unless the config says."""
    return T5Config(**model_cfg.tiny.t5_kwargs(), dtype=model_cfg.dtype,
                    param_dtype=model_cfg.param_dtype, dropout_rate=model_cfg.dropout_rate or 0.0,
                    precision=model_cfg.precision)


def with_dropout(config: T5Config, model_cfg) -> T5Config:
    """`config` with the run's ``dropout_rate`` (when set; else the checkpoint's)."""
    if model_cfg.dropout_rate is None or model_cfg.dropout_rate == config.dropout_rate:
        return config
    return dataclasses.replace(config, dropout_rate=model_cfg.dropout_rate)


def t5_config(model_cfg, hf: dict) -> T5Config:
    """The T5Config `builders.build_t5` gives `model_cfg`, from its architecture alone: a Hugging Face
    config.json dict, or ``{"tiny": ...}`` (`memory_plan.resolve_architecture`)."""
    if model_cfg.tiny is not None:
        return t5_config_from_spec(model_cfg)
    return with_dropout(T5Config.from_hf(hf, dtype=model_cfg.dtype,
                                         param_dtype=model_cfg.param_dtype,
                                         precision=model_cfg.precision), model_cfg)


def model_class(kind: str, config) -> type:
    """The class of a policy ("t5") or value model ("value") of `config`'s family."""
    if isinstance(config, CausalLMConfig):
        return CausalValueModel if kind == "value" else CausalLM
    return ValueModel if kind == "value" else T5


def abstract_model(kind: str, config, mesh, rules) -> tuple[Any, Any]:
    """(graphdef, params) of a policy ("t5": a T5 or, for a `CausalLMConfig`, a `CausalLM`) or a
    value model ("value") built with `nnx.eval_shape`: params is a pure dict of
    `jax.ShapeDtypeStruct`s carrying the rules' `NamedSharding`s."""
    graphdef, state = nnx.split(shape_only(model_class(kind, config), config))
    shardings = nnx.to_pure_dict(sharding.model_shardings(state, mesh, rules))
    return graphdef, abstract_tree(nnx.to_pure_dict(state), shardings)


def build_t5(model_cfg, *, seed: int, mesh, rules, tokenizer: Tokenizer | None = None,
             where: str = "model") -> tuple[T5Config, T5]:
    """A T5 from a `ModelConfig`: a Hugging Face folder (``init``) or a tiny random one (``tiny``),
    placed on `mesh`; ``dropout_rate`` (when set) overrides the checkpoint's."""
    def check_vocab(config: T5Config) -> None:  # before anything is built on the config
        if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
            raise ConfigError(f"{where}: the tokenizer {tokenizer.folder} has "
                              f"{tokenizer.vocab_size} tokens but the model's vocab_size is "
                              f"{config.vocab_size}")

    if model_cfg.init is None:
        config = t5_config_from_spec(model_cfg)
        check_vocab(config)
        return config, sharding.create_sharded(lambda: T5(config, rngs=nnx.Rngs(seed)),
                                               mesh, rules)
    loaded, model = load_t5(model_cfg.init, dtype=model_cfg.dtype, mesh=mesh, rules=rules,
                            param_dtype=model_cfg.param_dtype, precision=model_cfg.precision)
    check_vocab(loaded)
    config = with_dropout(loaded, model_cfg)
    if config != loaded:
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: T5(config, rngs=nnx.Rngs(0))))
        model = nnx.merge(graphdef, nnx.state(model))
    return config, model


def build_classifier(model_cfg, *, mesh, rules, num_labels: int = 2, where: str = "model"):
    """(classifier, tokenizer) from a `ModelConfig` naming a Hugging Face sequence-classification
    folder (``init``): DeBERTa-v2/v3, BERT or RoBERTa by config.json model_type
    (`hf.load_classifier`), placed on `mesh`, with `num_labels` classes; the folder's
    tokenizer.json truncating pairs to ``max_input_length``. Any problem with the folder is one
    `ConfigError` naming ``{where}.init``. The classifier is called without token type ids (all
    0): DeBERTa-v3 and RoBERTa have no segment embeddings, but a BERT trains and exports with
    its second segment read as type 0 (not what transformers' pair encoding feeds it)."""
    try:
        model = load_classifier(model_cfg.init, dtype=model_cfg.dtype,
                                param_dtype=model_cfg.param_dtype, mesh=mesh, rules=rules,
                                precision=model_cfg.precision)
        tokenizer = load_encoder_tokenizer(model_cfg.init, model_cfg.max_input_length,
                                           vocab_size=model.config.vocab_size)
    except (CheckpointError, OSError) as e:
        raise ConfigError(f"{where}.init: {e}", key=f"{where}.init") from e
    if model.config.num_labels != num_labels:
        raise ConfigError(f"{where}.init: {model_cfg.init} has {model.config.num_labels} labels "
                          f"{list(model.config.labels)}; the discriminator needs {num_labels} "
                          "(0 irrelevant, 1 relevant)", key=f"{where}.init")
    return model, tokenizer


def build_value(cfg, trunk: T5 | CausalLM) -> ValueModel | CausalValueModel:
    """The value model on `trunk` with a new head (seeded from ``run.seed``, ``value.head_init``)."""
    if isinstance(trunk, CausalLM):
        return CausalValueModel.from_lm(trunk, seed=cfg.run.seed + 2,
                                        head_init=cfg.value.head_init)
    return ValueModel.from_t5(trunk, seed=cfg.run.seed + 2, head_init=cfg.value.head_init)


def model_family(model_cfg) -> str:
    """"causal" for a folder whose config.json names a decoder-only `model_type`, "t5" for a tiny
    spec or another folder; for a folder not there (yet), what ``prompt_format`` implies (a
    policy's: set for a decoder-only one), and the loader then names the missing folder."""
    if model_cfg.init is None:
        return "t5"
    if not (Path(model_cfg.init) / "config.json").is_file():
        return "t5" if getattr(model_cfg, "prompt_format", None) is None else "causal"
    try:
        model_type = read_config(model_cfg.init).get("model_type")
    except (OSError, ValueError):
        return "t5"
    return "causal" if model_type in CAUSAL_MODEL_TYPES else "t5"


def check_policy_family(cfg) -> str:
    """The policy's family ("t5" or "causal"), checked against the settings only the other reads."""
    family = model_family(cfg.policy)
    if family == "t5" and cfg.policy.prompt_format is not None:
        raise ConfigError(f"policy.prompt_format: {cfg.policy.init or 'the tiny policy'} is a T5, "
                          "whose input is 'question: ' + the situation; prompt_format is for "
                          "decoder-only policies", key="policy.prompt_format")
    if family == "causal":
        why = f"policy.init {cfg.policy.init} is a decoder-only model"
        if cfg.policy.prompt_format is None:
            raise ConfigError(f"policy.prompt_format: {why}: give chat (its chat template) or "
                              "plain (policy.prompt_template as it is)", key="policy.prompt_format")
        if cfg.ppo.reward_situations != "source":
            raise ConfigError(f"ppo.reward_situations: {why}, whose prompt is not the situation "
                              "alone; use source", key="ppo.reward_situations")
        if cfg.policy.precision != "default":
            raise ConfigError(f"policy.precision: {why}, which runs at JAX's default matmul "
                              "precision; remove it", key="policy.precision")
    return family


def policy_tokenizer(cfg, family: str) -> Tokenizer | CausalPolicyText:
    """The policy's text side: a T5's `Tokenizer`, or a decoder's `CausalPolicyText` (its prompt
    format; its questions end at the EOS ids `hf.load_causal_lm` gives the model)."""
    if family == "t5":
        return Tokenizer.from_pretrained(cfg.policy.tokenizer_path)
    try:
        eos_ids = check_causal_lm_folder(cfg.policy.init, dtype=cfg.policy.dtype)[0].eos_token_ids
    except (CheckpointError, OSError) as e:
        raise ConfigError(f"policy.init: {e}", key="policy.init") from e
    try:
        return CausalPolicyText(cfg.policy.tokenizer_path, cfg.policy.prompt_format,
                                cfg.policy.prompt_template, eos_ids)
    except (OSError, ValueError) as e:
        raise ConfigError(f"policy.prompt_format: {e}", key="policy.prompt_format") from e


def build_policy(model_cfg, family: str, *, seed: int, mesh, rules, tokenizer=None,
                 where: str = "policy") -> tuple[T5Config | CausalLMConfig, T5 | CausalLM]:
    """(config, model) of a policy-family model: `build_t5`, or a decoder-only folder read by
    `hf.load_causal_lm` (``dtype``, ``param_dtype``), placed on `mesh`."""
    if family == "t5":
        return build_t5(model_cfg, seed=seed, mesh=mesh, rules=rules, tokenizer=tokenizer,
                        where=where)
    try:
        return load_causal_lm(model_cfg.init, dtype=model_cfg.dtype,
                              param_dtype=model_cfg.param_dtype, mesh=mesh, rules=rules)
    except (CheckpointError, OSError) as e:
        raise ConfigError(f"{where}.init: {e}", key=f"{where}.init") from e


class PPOModels(NamedTuple):
    """The policy (its config, graphdef and parameters), the frozen reference's parameters and
    the value model (graphdef, parameters), placed on the run's mesh; `family` "t5" or "causal"."""

    config: T5Config | CausalLMConfig
    graphdef: Any
    params: Any
    ref_params: Any
    value_graphdef: Any
    value_params: Any
    family: str = "t5"


def build_ppo_models(cfg, mesh, rules, tokenizer, family: str = "t5") -> PPOModels:
    """The models of a `PPOConfig`: the policy (of `family`), its reference (a copy unless
    ``reference`` is set) and the value model (a copy of the policy, or of ``value.model``,
    with a new head; none for ``ppo.algorithm`` rloo or grpo: value_graphdef and value_params
    None)."""
    seed = cfg.run.seed
    tok = tokenizer if family == "t5" else None
    p_config, policy = build_policy(cfg.policy, family, seed=seed, mesh=mesh, rules=rules,
                                    tokenizer=tok)
    graphdef, params = split_model(policy)
    if cfg.reference is None:
        ref_params = copy_params(params)
    else:
        _, reference = build_policy(cfg.reference, family, seed=seed, mesh=mesh, rules=rules,
                                    where="reference")
        ref_graphdef, ref_params = split_model(reference)
        if ref_graphdef != graphdef:
            raise ConfigError("reference: the reference model's architecture differs from the "
                              "policy's")
    if cfg.ppo.algorithm != "ppo":  # rloo, grpo: no value model
        return PPOModels(p_config, graphdef, params, ref_params, None, None, family)
    trunk = policy if cfg.value.model is None else build_policy(
        cfg.value.model, family, seed=seed + 1, mesh=mesh, rules=rules, where="value.model")[1]
    value = build_value(cfg, trunk)
    value_graphdef, value_params = split_model(value)
    value_params = jax.device_put(value_params, nnx.to_pure_dict(sharding.model_shardings(
        nnx.state(value), mesh, rules)))
    return PPOModels(p_config, graphdef, params, ref_params, value_graphdef, value_params, family)


# --------------------------------------------------------------------------- shardings


def abstract_tree(tree, shardings=None):
    """`jax.ShapeDtypeStruct`s of `tree`'s arrays, with `shardings` (a matching tree) or theirs."""
    def spec(x, given=None):
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, weak_type=bool(getattr(x, "weak_type",
                                                                               False)),
                                    sharding=getattr(x, "sharding", None) if given is None
                                    else given)
    return jax.tree.map(spec, tree) if shardings is None else jax.tree.map(spec, tree, shardings)
