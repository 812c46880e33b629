"""Hugging Face BERT / RoBERTa checkpoint names -> `clarifyjax.models.encoder` parameters: the
encoder family's tensor map (`encoder_tensor_maps`, read through `read_params`), config ranges and
config reader, which `clarifyjax.models.hf` loads through.

Hugging Face `nn.Linear` stores [out, in]; we store [in, out], with attention projections split
into [embed, heads, kv] (and [heads, kv, embed] for the output projection): each parameter's
`tensor_map.TensorMap` says how.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from flax import nnx

from clarifyjax.models.encoder import EncoderConfig, QuestionAnswering, SequenceClassifier
from clarifyjax.models.hf.tensor_map import (TensorMap, check_tensors, linear, read_into,
                                             same_layout, vector)
from clarifyjax.models.safetensors_io import (CheckpointError, TensorSource, check_config_numbers,
                                             read_config)


def _dense(maps: dict, ours: tuple, theirs: str, in_shape: tuple[int, ...],
           out_shape: tuple[int, ...]) -> None:
    maps[ours + ("kernel",)] = linear(theirs + ".weight", in_shape, out_shape)
    maps[ours + ("bias",)] = vector(theirs + ".bias", out_shape)


def _norm(maps: dict, ours: tuple, theirs: str, d: int) -> None:
    maps[ours + ("scale",)] = vector(theirs + ".weight", (d,))
    maps[ours + ("bias",)] = vector(theirs + ".bias", (d,))


def _layer_maps(maps: dict, c: EncoderConfig, i: int, prefix: str) -> None:
    hf = f"{prefix}encoder.layer.{i}."
    d, h, k, f = c.hidden_size, c.num_heads, c.head_dim, c.intermediate_size
    for ours, theirs, in_shape, out_shape in (
            ("attention.query", "attention.self.query", (d,), (h, k)),
            ("attention.key", "attention.self.key", (d,), (h, k)),
            ("attention.value", "attention.self.value", (d,), (h, k)),
            ("attention.output", "attention.output.dense", (h, k), (d,)),
            ("mlp.wi", "intermediate.dense", (d,), (f,)),
            ("mlp.wo", "output.dense", (f,), (d,))):
        _dense(maps, ("layers", i, *ours.split(".")), hf + theirs, in_shape, out_shape)
    for ours, theirs in (("attention_norm", "attention.output.LayerNorm"),
                         ("mlp_norm", "output.LayerNorm")):
        _norm(maps, ("layers", i, ours), hf + theirs, d)


def encoder_tensor_maps(config: EncoderConfig, *, prefix: str = "", classifier: bool = False,
                        question_answering: bool = False) -> dict[tuple, TensorMap]:
    """Every parameter of `BertEncoder` (or `SequenceClassifier`, or `QuestionAnswering`) with its
    Hugging Face tensor.

    `prefix` is "" for a bare `BertModel` / `RobertaModel` folder and "bert." / "roberta." for a
    `...ForSequenceClassification` / `...ForQuestionAnswering` folder. A head's paths are under
    "encoder" for the trunk.
    """
    c, emb = config, f"{prefix}embeddings."
    d = c.hidden_size
    maps: dict[tuple, TensorMap] = {}
    for ours, rows in (("word_embeddings", c.vocab_size),
                       ("position_embeddings", c.max_position_embeddings),
                       ("token_type_embeddings", c.type_vocab_size)):
        maps[("embeddings", ours, "embedding")] = same_layout(f"{emb}{ours}.weight", (rows, d))
    _norm(maps, ("embeddings", "norm"), emb + "LayerNorm", d)
    for i in range(c.num_layers):
        _layer_maps(maps, c, i, prefix)
    if not (classifier or question_answering):
        return maps
    maps = {("encoder", *path): tm for path, tm in maps.items()}
    if question_answering:  # the same name in BERT and RoBERTa
        _dense(maps, ("qa_outputs",), "qa_outputs", (d,), (2,))
        return maps
    if c.model_type == "roberta":
        dense, out = "classifier.dense", "classifier.out_proj"
    else:
        dense, out = f"{prefix}pooler.dense", "classifier"
    _dense(maps, ("dense",), dense, (d,), (d,))
    _dense(maps, ("out_proj",), out, (d,), (c.num_labels,))
    return maps


# Older (TF-converted) BERT checkpoints call LayerNorm parameters gamma / beta.
_ALIASES = {".LayerNorm.weight": ".LayerNorm.gamma", ".LayerNorm.bias": ".LayerNorm.beta"}


def _resolve(source: TensorSource, name: str) -> str:
    if name in source:
        return name
    for new, old in _ALIASES.items():
        if name.endswith(new) and name[: -len(new)] + old in source:
            return name[: -len(new)] + old
    raise CheckpointError(f"tensor {name!r} is missing from the checkpoint in {source.folder}")


def _detect_prefix(source: TensorSource, config: EncoderConfig) -> str:
    prefix = f"{config.model_type}."
    return prefix if any(k.startswith(prefix) for k in source.keys()) else ""


def checked_maps(cls, path, config: EncoderConfig, allow_pickle: bool = False):
    """(TensorSource, tensor maps) of a `cls` (`BertEncoder`, `SequenceClassifier` or
    `QuestionAnswering`) in the folder, every tensor it reads checked in the safetensors headers
    (a missing tensor or a wrong shape is named; other heads' tensors are ignored)."""
    source = TensorSource(path, allow_pickle=allow_pickle)
    maps = encoder_tensor_maps(config, prefix=_detect_prefix(source, config),
                               classifier=cls is SequenceClassifier,
                               question_answering=cls is QuestionAnswering)
    maps = {p: dataclasses.replace(tm, hf_name=_resolve(source, tm.hf_name))
            for p, tm in maps.items()}
    check_tensors(source.folder, source, maps, f"the {config.model_type} config", within=())
    return source, maps


def read_params(cls, path, config: EncoderConfig, allow_pickle: bool, mesh=None, axis_rules=None):
    """A `cls` with the folder's tensors (`checked_maps`); with `mesh`, each device reads only its
    own slice (`tensor_map.read_into`)."""
    source, maps = checked_maps(cls, path, config, allow_pickle)
    abstract = nnx.eval_shape(lambda: cls(config, nnx.Rngs(0)))
    return read_into(abstract, maps, source, config.param_dtype, mesh, axis_rules)


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
