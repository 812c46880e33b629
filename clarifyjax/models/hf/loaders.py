"""The one way in and out of Hugging Face checkpoint folders (safetensors), for every model family:
`load_t5` / `save_t5`; `load_encoder`, `load_sequence_classifier`, `load_encoder_tokenizer`
(BERT, RoBERTa); `load_causal_lm` / `save_causal_lm`, `read_generation_defaults`; `load_deberta`,
`load_deberta_sequence_classifier`; `load_question_answering`; `load_classifier` /
`save_sequence_classifier` (either encoder family, by config.json `model_type`). Each family's
tensor map is its `*_map` module. With a mesh, each device reads only its own slice of each
tensor (`jax.make_array_from_callback`), so nothing ever holds a whole sharded tensor."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from clarifyjax.models.hf import causal_lm_map
from clarifyjax.models.causal_lm import CausalLM, CausalLMConfig
from clarifyjax.models.hf.causal_lm_map import read_generation_defaults
from clarifyjax.files.textfiles import atomic_write_bytes
from clarifyjax.models.safetensors_io import (CheckpointError, TensorSource, read_config,
                                             write_checkpoint)
from clarifyjax.models.deberta import (DebertaEncoder, DebertaQuestionAnswering,
                                       DebertaSequenceClassifier)
from clarifyjax.models.hf.deberta_map import (deberta_tensor_maps, read_deberta,
                                              read_deberta_config)
from clarifyjax.models.encoder import (BertEncoder, QuestionAnswering, SequenceClassifier,
                                       check_classifier_architecture)
from clarifyjax.models.hf.encoder_map import encoder_tensor_maps, read_encoder_config, read_params
from clarifyjax.models.hf.tensor_map import read_into
from clarifyjax.models.t5 import T5, T5Config
from clarifyjax.models.hf.t5_map import check_t5_tensors, resolve_config, t5_tensor_maps

# --------------------------------------------------------------------------- T5


def load_t5(path: str | os.PathLike, *, dtype: str = "float32", param_dtype: str | None = None,
            mesh: jax.sharding.Mesh | None = None, rules=None,
            allow_pickle: bool = False, precision: str = "default") -> tuple[T5Config, T5]:
    """Read a Hugging Face T5 folder (config.json + model.safetensors or a sharded index).

    Args:
      dtype: compute dtype; param_dtype: storage dtype (None: same as `dtype`).
      mesh, rules: place every parameter on `mesh` by the logical axis `rules`
        (default `clarifyjax.core.sharding.DEFAULT_RULES`), reading per device only its slice.
      allow_pickle: accept a folder that holds only `pytorch_model.bin` (a pickle).
      precision: of the model's matmuls (`T5Config.precision`).
    Raises:
      CheckpointError: a missing folder/config/tensor, a wrong shape (names the tensor and both
        shapes), an unknown config value (names the field), tensors the config does not explain.
    """
    config, source, maps = check_t5_folder(path, dtype=dtype, param_dtype=param_dtype,
                                           allow_pickle=allow_pickle, precision=precision)
    abstract = nnx.eval_shape(lambda: T5(config, rngs=nnx.Rngs(0)))
    return config, read_into(abstract, maps, source, config.param_dtype, mesh, rules)


def check_t5_folder(path: str | os.PathLike, *, dtype: str = "float32",
                    param_dtype: str | None = None, allow_pickle: bool = False,
                    precision: str = "default"):
    """Everything `load_t5` checks before it reads a weight: the folder, config.json and every
    tensor's name and shape in the safetensors headers -> (T5Config, its TensorSource, its
    tensor maps). The dry run checks a run's T5 folders with it. Raises as `load_t5`."""
    source = TensorSource(path, allow_pickle=allow_pickle)  # checks the folder, refuses pickles
    folder = source.folder
    config = resolve_config(folder, read_config(folder), source, dtype=dtype,
                             param_dtype=param_dtype or dtype, precision=precision)
    maps = t5_tensor_maps(config)
    check_t5_tensors(folder, source, maps, config.tie_word_embeddings)
    return config, source, maps


def _host_params(model: nnx.Module):
    """(path, float32 numpy value) of every parameter, gathered from all hosts if sharded."""
    for p, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = var.get_value()
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            value = multihost_utils.process_allgather(value, tiled=True)
        yield p, np.asarray(jax.device_get(value), np.float32)


def save_t5(model: T5, config: T5Config, path: str | os.PathLike, *,
            dtype: str = "float32") -> Path:
    """Write `model` as a Hugging Face folder (model.safetensors in torch layout + config.json)
    that `transformers.T5ForConditionalGeneration.from_pretrained` and `load_t5` read.

    dtype: of the written tensors ("float32", "bfloat16" or "float16"). On several hosts only
    process 0 writes.
    """
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"save_t5: dtype {dtype!r}; allowed: float32, bfloat16, float16")
    structural = ("dtype", "param_dtype", "precision")
    mine = {k: v for k, v in dataclasses.asdict(model.config).items() if k not in structural}
    given = {k: v for k, v in dataclasses.asdict(config).items() if k not in structural}
    if mine != given:
        diff = sorted(k for k in mine if mine[k] != given[k])
        raise ValueError(f"save_t5: config differs from the model's config in {diff}")
    maps = t5_tensor_maps(config)
    tensors: dict[str, np.ndarray] = {}
    for p, value in _host_params(model):
        tensors[maps[p].hf_name] = maps[p].to_hf(value).astype(jnp.dtype(dtype))
    hf_config = dict(config.to_hf(), dtype=dtype)
    if jax.process_index() != 0:
        return Path(path)
    return write_checkpoint(path, tensors, hf_config)


# --------------------------------------------------------------------------- BERT / RoBERTa


def load_encoder(path, *, dtype: str = "float32", param_dtype: str = "float32",
                 allow_pickle: bool = False, mesh=None, rules=None) -> BertEncoder:
    """A `BertEncoder` from a Hugging Face BERT / RoBERTa folder (config.json + safetensors).

    Works on bare model folders and on `...ForSequenceClassification` / `...ForMaskedLM` folders
    (names prefixed "bert." / "roberta."); head tensors are ignored. With `mesh`, each parameter
    is placed in its shards by the logical axis `rules` (default `sharding.DEFAULT_RULES`): no
    device receives more than its slice.
    Raises:
      CheckpointError: unsupported model_type, a missing tensor, or a tensor whose shape differs
        (the message names the tensor and both shapes).
    """
    config = read_encoder_config(path, dtype=dtype, param_dtype=param_dtype)
    return read_params(BertEncoder, path, config, allow_pickle, mesh, rules)


def load_sequence_classifier(path, *, dtype: str = "float32", param_dtype: str = "float32",
                             allow_pickle: bool = False, mesh=None,
                             rules=None, precision: str = "default") -> SequenceClassifier:
    """A `SequenceClassifier` from a Hugging Face `BertForSequenceClassification` or
    `RobertaForSequenceClassification` folder; labels come from config.json as transformers
    reads them (`encoder.labels_from_hf`: `id2label`, else `num_labels`, else two); a folder whose
    `architectures` names no `...ForSequenceClassification` is refused. `mesh`, `rules` as
    `load_encoder`; `precision`: of its matmuls (`EncoderConfig.precision`)."""
    check_classifier_architecture(read_config(path), Path(path) / "config.json")
    config = read_encoder_config(path, dtype=dtype, param_dtype=param_dtype, precision=precision)
    return read_params(SequenceClassifier, path, config, allow_pickle, mesh, rules)


def load_encoder_tokenizer(folder, max_length: int, vocab_size: int | None = None):
    """The folder's `tokenizer.json` (`tokenizers` library) with its own padding turned off (we
    pad to buckets) and longest-first truncation at max_length (pairs included).

    With vocab_size, a tokenizer that can emit ids outside the embedding table is refused (a jax
    gather would silently clamp them).
    """
    from tokenizers import Tokenizer

    file = Path(folder) / "tokenizer.json"
    if not file.exists():
        raise CheckpointError(f"no tokenizer.json in {folder}: save the model's fast tokenizer "
                              "there (tokenizer.save_pretrained)")
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as e:  # the Rust error says what is wrong in the file
        raise CheckpointError(f"{file}: not a tokenizers file ({e})") from e
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab_size is not None and n > vocab_size:
        raise CheckpointError(f"{file} has {n} tokens but the model's embedding table "
                              f"(config.json vocab_size) has only {vocab_size} rows")
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length, strategy="longest_first")
    return tokenizer


# --------------------------------------------------------------------------- decoder-only LMs


def load_causal_lm(path: str | os.PathLike, *, dtype: str = "float32",
                   param_dtype: str | None = None, mesh: jax.sharding.Mesh | None = None,
                   rules=None) -> tuple[CausalLMConfig, CausalLM]:
    """Read a Hugging Face decoder-only folder (llama, mistral, qwen2, qwen3, opt, falcon:
    config.json + model.safetensors or a sharded index) -> (config, `CausalLM`).

    The config's `eos_token_ids` are those of config.json together with those of
    generation_config.json, so that `decoding.generate` stops where transformers does.
    Args:
      dtype: compute dtype; param_dtype: storage dtype (None: same as `dtype`).
      mesh, rules: place every parameter on `mesh` by the logical axis `rules`
        (default `clarifyjax.core.sharding.DEFAULT_RULES`), each device reading only its block.
    Raises:
      CheckpointError: naming the field (unknown model_type, unsupported switch such as falcon
        `alibi: true`, a bad number) or the tensor (missing, unmapped, wrong shape).
    """
    config, source, maps = check_causal_lm_folder(path, dtype=dtype, param_dtype=param_dtype)
    abstract = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
    return config, read_into(abstract, maps, source, config.param_dtype, mesh, rules)


def save_causal_lm(model: CausalLM, source: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Write `model` (loaded from the folder `source`, e.g. a PPO policy) as a Hugging Face folder
    that `load_causal_lm` and transformers read: model.safetensors in torch layout (float32; a
    fused tensor from its parts), and `source`'s config.json and generation_config.json. On
    several hosts only process 0 writes."""
    source = Path(source)
    maps = causal_lm_map.causal_lm_tensor_maps(model.config)
    tensors: dict[str, np.ndarray] = {}
    for p, value in _host_params(model):
        tensors[maps[p].hf_name] = maps[p].to_hf(value, tensors.get(maps[p].hf_name))
    hf_config = dict(read_config(source), torch_dtype="float32")
    if jax.process_index() != 0:
        return Path(path)
    folder = write_checkpoint(path, tensors, hf_config)
    if (source / "generation_config.json").is_file():
        atomic_write_bytes(folder / "generation_config.json",
                           (source / "generation_config.json").read_bytes())
    return folder


def check_causal_lm_folder(path: str | os.PathLike, *, dtype: str = "float32",
                           param_dtype: str | None = None):
    """Everything `load_causal_lm` checks before it reads a weight: the folder, config.json,
    generation_config.json and every tensor's name and shape in the safetensors headers ->
    (CausalLMConfig, its TensorSource, its tensor maps). `sage-jax run` checks its local
    generators with it before the first answer. Raises as `load_causal_lm`."""
    source = TensorSource(path)
    folder = source.folder
    config = causal_lm_map.config_from_hf(read_config(folder), folder / "config.json",
                                          dtype=dtype, param_dtype=param_dtype or dtype)
    generation = read_generation_defaults(folder, config.eos_token_ids)
    eos = tuple(dict.fromkeys(config.eos_token_ids + generation["eos_token_ids"]))
    config = dataclasses.replace(config, eos_token_ids=eos)
    maps = causal_lm_map.causal_lm_tensor_maps(config)
    causal_lm_map.check_causal_lm_tensors(folder, source, maps, config)
    return config, source, maps


# --------------------------------------------------------------------------- DeBERTa-v2/v3, QA heads
# (one section, so that merges with the other families' additions stay simple)


def load_deberta(path, *, dtype: str = "float32", param_dtype: str = "float32",
                 allow_pickle: bool = False, mesh=None, rules=None):
    """A `deberta.DebertaEncoder` from a Hugging Face DeBERTa-v2/v3 folder (a bare
    `DebertaV2Model` or any `DebertaV2For...` folder, whose head tensors are ignored).

    dtype: compute; param_dtype: storage. With `mesh`, each device reads only its slice of each
    tensor, placed by the logical axis `rules` (default `sharding.DEFAULT_RULES`).
    Raises:
      CheckpointError: a missing tensor, a wrong shape (names the tensor and both shapes), a
        trunk tensor the config does not account for, an unsupported config.json field.
    """
    config = read_deberta_config(path, dtype=dtype, param_dtype=param_dtype)
    return read_deberta(DebertaEncoder, path, config, allow_pickle, mesh, rules)


def load_deberta_sequence_classifier(path, *, dtype: str = "float32",
                                     param_dtype: str = "float32", allow_pickle: bool = False,
                                     mesh=None, rules=None, precision: str = "default"):
    """A `deberta.DebertaSequenceClassifier` from a `DebertaV2ForSequenceClassification` folder
    (ContextPooler + classifier); labels and `architectures` as `load_sequence_classifier`;
    `precision` as there; the rest as `load_deberta`."""
    check_classifier_architecture(read_config(path), Path(path) / "config.json")
    config = read_deberta_config(path, dtype=dtype, param_dtype=param_dtype, precision=precision)
    return read_deberta(DebertaSequenceClassifier, path, config, allow_pickle, mesh, rules)


def load_question_answering(path, *, dtype: str = "float32", param_dtype: str = "float32",
                            allow_pickle: bool = False, mesh=None, rules=None):
    """An extractive QA model (start / end logits) from a `BertForQuestionAnswering`,
    `RobertaForQuestionAnswering` or `DebertaV2ForQuestionAnswering` folder, by config.json
    `model_type`: `encoder.QuestionAnswering` or `deberta.DebertaQuestionAnswering`. The
    unanswerable rule over its logits is `clarifyjax.evaluation.answer_spans`. Other arguments as
    `load_encoder`."""
    if read_config(path).get("model_type") == "deberta-v2":
        config = read_deberta_config(path, dtype=dtype, param_dtype=param_dtype)
        return read_deberta(DebertaQuestionAnswering, path, config, allow_pickle, mesh, rules)
    config = read_encoder_config(path, dtype=dtype, param_dtype=param_dtype)
    return read_params(QuestionAnswering, path, config, allow_pickle, mesh, rules)


# --------------------------------------------------------------------------- classifiers of
# either encoder family (the discriminator trained by `clarifyjax train`)


def load_classifier(path, *, dtype: str = "float32", param_dtype: str = "float32", mesh=None,
                    rules=None, precision: str = "default"):
    """A sequence classifier by config.json `model_type`: `load_deberta_sequence_classifier`
    for "deberta-v2", else `load_sequence_classifier` (BERT / RoBERTa; any other model_type is
    refused there, naming the field); `precision`: of its matmuls."""
    load = (load_deberta_sequence_classifier if read_config(path).get("model_type") == "deberta-v2"
            else load_sequence_classifier)
    return load(path, dtype=dtype, param_dtype=param_dtype, mesh=mesh, rules=rules,
                precision=precision)


def check_classifier_folder(path):
    """What `load_classifier` checks before it reads a weight: config.json (`architectures`, the
    labels, every field of its family) and the safetensors headers -> the model's config. The dry
    run checks a run's classifier folders with it. Raises CheckpointError naming file and field."""
    hf = read_config(path)
    check_classifier_architecture(hf, Path(path) / "config.json")
    read = read_deberta_config if hf.get("model_type") == "deberta-v2" else read_encoder_config
    config = read(path)
    TensorSource(path)  # the weights' headers, checked against the file (a pickle is refused)
    return config


def _classifier_tensors(model) -> dict[str, np.ndarray]:
    """Hugging Face name -> torch-layout float32 tensor of every parameter of `model`."""
    if isinstance(model, DebertaSequenceClassifier):
        maps = deberta_tensor_maps(DebertaSequenceClassifier, model.config, "deberta.")
    else:
        maps = encoder_tensor_maps(model.config, prefix=f"{model.config.model_type}.",
                                   classifier=True)
    return {maps[p].hf_name: maps[p].to_hf(v) for p, v in _host_params(model)}


def save_sequence_classifier(model, path: str | os.PathLike, source: str | os.PathLike) -> Path:
    """Write a `SequenceClassifier` or `DebertaSequenceClassifier` as a Hugging Face folder
    (model.safetensors in torch layout, float32, + config.json) that `load_classifier` and
    transformers' `AutoModelForSequenceClassification` read. config.json is the one of the
    `source` folder the model was loaded from (same architecture), with the model's labels.
    On several hosts only process 0 writes."""
    if not isinstance(model, (SequenceClassifier, DebertaSequenceClassifier)):
        raise TypeError(f"save_sequence_classifier: {type(model).__name__} is not a sequence "
                        "classifier")
    tensors = _classifier_tensors(model)
    labels = model.config.labels
    hf_config = dict(read_config(source), dtype="float32",
                     id2label={str(i): label for i, label in enumerate(labels)},
                     label2id={label: i for i, label in enumerate(labels)})
    hf_config.pop("torch_dtype", None)
    if jax.process_index() != 0:
        return Path(path)
    return write_checkpoint(path, tensors, hf_config)
