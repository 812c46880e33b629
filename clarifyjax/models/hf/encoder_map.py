"""Hugging Face BERT / RoBERTa checkpoint names -> `clarifyjax.models.encoder` parameters: the
encoder family's tensor map (`checkpoint_rules`, `read_params`), config ranges and config reader,
which `clarifyjax.models.hf` loads through.

Hugging Face `nn.Linear` stores [out, in]; we store [in, out], with attention projections split
into [embed, heads, kv] (and [heads, kv, embed] for the output projection).
"""
from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clarifyjax.core import sharding as sharding_lib
from clarifyjax.models.safetensors_io import (CheckpointError, TensorSource, check_config_numbers,
                                             check_shape, read_config)
from clarifyjax.models.encoder import EncoderConfig, QuestionAnswering, SequenceClassifier


# (our path, HF name, kind); kind "table": same layout; "linear:N": HF [out, in] transposed to
# [in, out] and reshaped to our [*in(N axes), *out]; "vector": reshaped to our shape.
_Rule = tuple[tuple, str, str]


def _layer_rules(i: int, prefix: str) -> list[_Rule]:
    hf = f"{prefix}encoder.layer.{i}."
    rules: list[_Rule] = []
    for ours, theirs, n_in in (("attention.query", "attention.self.query", 1),
                               ("attention.key", "attention.self.key", 1),
                               ("attention.value", "attention.self.value", 1),
                               ("attention.output", "attention.output.dense", 2),
                               ("mlp.wi", "intermediate.dense", 1),
                               ("mlp.wo", "output.dense", 1)):
        path = ("layers", i, *ours.split("."))
        rules.append(((*path, "kernel"), hf + theirs + ".weight", f"linear:{n_in}"))
        rules.append(((*path, "bias"), hf + theirs + ".bias", "vector"))
    for ours, theirs in (("attention_norm", "attention.output.LayerNorm"),
                         ("mlp_norm", "output.LayerNorm")):
        rules.append((("layers", i, ours, "scale"), hf + theirs + ".weight", "vector"))
        rules.append((("layers", i, ours, "bias"), hf + theirs + ".bias", "vector"))
    return rules


def checkpoint_rules(config: EncoderConfig, *, prefix: str = "", classifier: bool = False,
                     question_answering: bool = False) -> list[_Rule]:
    """Every parameter of `Encoder` (or `SequenceClassifier`, or `QuestionAnswering`) with its
    Hugging Face tensor name.

    `prefix` is "" for a bare `BertModel` / `RobertaModel` folder and "bert." / "roberta." for a
    `...ForSequenceClassification` / `...ForQuestionAnswering` folder. A head's paths are under
    "encoder" for the trunk.
    """
    emb = f"{prefix}embeddings."
    rules: list[_Rule] = [
        (("embeddings", "word_embeddings", "embedding"), emb + "word_embeddings.weight", "table"),
        (("embeddings", "position_embeddings", "embedding"), emb + "position_embeddings.weight",
         "table"),
        (("embeddings", "token_type_embeddings", "embedding"),
         emb + "token_type_embeddings.weight", "table"),
        (("embeddings", "norm", "scale"), emb + "LayerNorm.weight", "vector"),
        (("embeddings", "norm", "bias"), emb + "LayerNorm.bias", "vector"),
    ]
    for i in range(config.num_layers):
        rules += _layer_rules(i, prefix)
    if not (classifier or question_answering):
        return rules
    rules = [(("encoder", *path), name, kind) for path, name, kind in rules]
    if question_answering:  # the same name in BERT and RoBERTa
        return rules + [(("qa_outputs", "kernel"), "qa_outputs.weight", "linear:1"),
                        (("qa_outputs", "bias"), "qa_outputs.bias", "vector")]
    if config.model_type == "roberta":
        dense, out = "classifier.dense", "classifier.out_proj"
    else:
        dense, out = f"{prefix}pooler.dense", "classifier"
    for ours, theirs in (("dense", dense), ("out_proj", out)):
        rules.append(((ours, "kernel"), theirs + ".weight", "linear:1"))
        rules.append(((ours, "bias"), theirs + ".bias", "vector"))
    return rules


# Older (TF-converted) BERT checkpoints call LayerNorm parameters gamma / beta.
_ALIASES = {".LayerNorm.weight": ".LayerNorm.gamma", ".LayerNorm.bias": ".LayerNorm.beta"}


def _resolve(source: TensorSource, name: str) -> str:
    if name in source:
        return name
    for new, old in _ALIASES.items():
        if name.endswith(new) and name[: -len(new)] + old in source:
            return name[: -len(new)] + old
    raise CheckpointError(f"tensor {name!r} is missing from the checkpoint in {source.folder}")


def _convert(source: TensorSource, name: str, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """Read HF tensor `name` and return it in our layout `shape`; shape errors name both."""
    actual = source.shape(name)
    if kind.startswith("linear:"):
        n_in = int(kind.split(":")[1])
        expected = (math.prod(shape[n_in:]), math.prod(shape[:n_in]))  # HF [out, in]
        check_shape(name, actual, expected)
        return np.asarray(source.get(name)).T.reshape(shape)
    expected = shape if kind == "table" else (math.prod(shape),)
    check_shape(name, actual, expected)
    return np.asarray(source.get(name)).reshape(shape)


def _detect_prefix(source: TensorSource, config: EncoderConfig) -> str:
    prefix = f"{config.model_type}."
    return prefix if any(k.startswith(prefix) for k in source.keys()) else ""


def read_params(cls, path, config: EncoderConfig, allow_pickle: bool, mesh=None, axis_rules=None):
    """A `cls` (`Encoder` or `SequenceClassifier`) with the folder's tensors; with `mesh`, each
    device receives only its slice."""
    source = TensorSource(path, allow_pickle=allow_pickle)
    abstract = nnx.eval_shape(lambda: cls(config, nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    flat = dict(nnx.to_flat_state(state))
    rules = checkpoint_rules(config, prefix=_detect_prefix(source, config),
                             classifier=cls is SequenceClassifier,
                             question_answering=cls is QuestionAnswering)
    unmapped = set(flat) - {r[0] for r in rules}
    if unmapped:  # a bug in checkpoint_rules, not in the checkpoint
        raise RuntimeError(f"parameters without a checkpoint name: {sorted(unmapped)}")
    dtype = jnp.dtype(config.param_dtype)
    shardings = None
    if mesh is not None:

        shardings = sharding_lib.flat_shardings(state, mesh, axis_rules)
    for ours, name, kind in rules:
        var = flat[ours]
        value = _convert(source, _resolve(source, name), kind, tuple(var.shape)).astype(dtype)
        if shardings is None:
            var.set_value(jnp.asarray(value))
        else:  # one tensor at a time on the host; each device receives only its slice
            var.set_value(jax.make_array_from_callback(value.shape, shardings[ours],
                                                       lambda index, v=value: v[index]))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


# The numeric fields of a BERT / RoBERTa config.json and their ranges (`check_config_numbers`).
ENCODER_CONFIG_RANGES = {
    **dict.fromkeys(("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size",
                     "num_labels"), "int >= 1"),
    **dict.fromkeys(("pad_token_id", "bos_token_id", "eos_token_id"), "int >= 0"),
    **dict.fromkeys(("hidden_dropout_prob", "attention_probs_dropout_prob",
                     "classifier_dropout"), "[0, 1)"),
    "layer_norm_eps": "> 0", "initializer_range": ">= 0"}


def read_encoder_config(path, **overrides) -> EncoderConfig:
    """`EncoderConfig` from `path`/config.json; errors name the file (and the field)."""
    hf = read_config(path)
    check_config_numbers(hf, Path(path) / "config.json", ENCODER_CONFIG_RANGES)
    try:
        return EncoderConfig.from_hf(hf, **overrides)
    except CheckpointError as e:
        if "config.json" in str(e) and str(path) not in str(e):
            raise CheckpointError(f"{Path(path) / 'config.json'}: {e}") from e
        raise
