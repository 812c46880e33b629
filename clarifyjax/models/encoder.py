"""Flax NNX BERT / RoBERTa encoders and their sequence-classification and QA heads.

One implementation serves both families: they differ only in position ids (RoBERTa counts from
`pad_token_id + 1` and skips padding) and in the head's checkpoint names (`hf.encoder_map`).
Layers are post-LN, as the original BERT. Parameters carry the logical axis names shared with
the T5 ("vocab", "embed", "mlp", "heads", "kv", "classes").
Shapes: b = batch, s = sequence, d = hidden size, h = heads, k = head size, f = MLP width."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.models.state import check_precision, honours_precision

SUPPORTED_MODEL_TYPES = ("bert", "roberta")
# transformers' `PretrainedConfig`: a config.json without id2label or num_labels has two labels.
DEFAULT_NUM_LABELS = 2

# Hugging Face `hidden_act` names (transformers.activations.ACT2FN) -> jax.
ENCODER_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}


# Parameters are stored in `param_dtype` and computed in `dtype`; LayerNorm and softmax run in
# float32. Matmuls run at `precision` (`state.matmul_precision`): with JAX's default, float32
# products run in TF32 on GPUs (~1e-3 off a PyTorch float32 reference); "highest" gives full f32.
@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """The architecture of a BERT or RoBERTa encoder (hashable, so it can be a static argument)."""

    model_type: str = "bert"  # "bert" | "roberta"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    initializer_range: float = 0.02
    # Labels of a classification head, in id order (empty for a bare encoder).
    labels: tuple[str, ...] = ()
    dtype: str = "float32"  # compute
    param_dtype: str = "float32"  # storage
    precision: str = "default"  # of every matmul (`state.PRECISIONS`)

    def __post_init__(self):
        check_precision(self, "encoder")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"config.json field 'model_type' is {self.model_type!r}; this encoder supports "
                f"{' and '.join(SUPPORTED_MODEL_TYPES)} only")
        if self.hidden_act not in ENCODER_ACTIVATIONS:
            raise CheckpointError(
                f"config.json field 'hidden_act' is {self.hidden_act!r}; supported: "
                f"{sorted(ENCODER_ACTIVATIONS)}")
        if self.hidden_size % self.num_heads:
            raise CheckpointError(
                f"config.json: hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def max_tokens(self) -> int:
        """The longest input the position table allows (RoBERTa loses pad_token_id + 1 slots)."""
        if self.model_type == "roberta":
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides) -> EncoderConfig:
        """From a Hugging Face `config.json` dict (BertConfig / RobertaConfig fields)."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"config.json field 'model_type' is {model_type!r}; this encoder supports "
                f"{' and '.join(SUPPORTED_MODEL_TYPES)} only")
        position_type = hf.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise CheckpointError(
                f"config.json field 'position_embedding_type' is {position_type!r}; only "
                "'absolute' is supported")

        if hf.get("is_decoder") or hf.get("add_cross_attention"):
            raise CheckpointError("config.json describes a decoder (is_decoder / "
                                  "add_cross_attention); this is an encoder-only model")

        def field(name):
            if name not in hf:
                raise CheckpointError(f"config.json lacks the field {name!r} ({model_type})")
            return hf[name]

        values = dict(
            model_type=model_type,
            vocab_size=int(field("vocab_size")),
            hidden_size=int(field("hidden_size")),
            num_layers=int(field("num_hidden_layers")),
            num_heads=int(field("num_attention_heads")),
            intermediate_size=int(field("intermediate_size")),
            hidden_act=str(hf.get("hidden_act", "gelu")),
            max_position_embeddings=int(field("max_position_embeddings")),
            type_vocab_size=int(hf.get("type_vocab_size", 2)),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            pad_token_id=int(hf.get("pad_token_id") if hf.get("pad_token_id") is not None
                             else (1 if model_type == "roberta" else 0)),
            initializer_range=float(hf.get("initializer_range", 0.02)),
            labels=labels_from_hf(hf),
        )
        values.update(overrides)
        return cls(**values)


def labels_from_hf(hf: Mapping[str, Any], where=None) -> tuple[str, ...]:
    """A classification head's labels in id order, read as transformers' `PretrainedConfig` reads
    them: config.json `id2label` (ids 0..n-1) when it is there; else `num_labels` (LABEL_i) when
    it is there; else transformers' default of two labels (LABEL_0, LABEL_1). transformers 5
    writes neither field for a two-label head with default names, so a classifier it saved has
    them only by that default. (A bare trunk gets the two default labels too; its loaders ignore
    them.) A malformed `id2label` or `num_labels` names the field (and the file `where`)."""
    at = "config.json" if where is None else f"{where}:"
    id2label = hf.get("id2label")
    if id2label is not None:
        if not isinstance(id2label, Mapping) or not id2label:
            raise CheckpointError(f"{at} field 'id2label' must be a non-empty object "
                                  f"{{id: label}}, got {id2label!r}")
        try:
            labels = {int(k): str(v) for k, v in id2label.items()}
        except (TypeError, ValueError):
            raise CheckpointError(f"{at} field 'id2label' has keys {list(id2label)}; "
                                  "they must be the ids 0..n-1") from None
        if sorted(labels) != list(range(len(labels))):
            raise CheckpointError(
                f"{at} field 'id2label' must have ids 0..n-1, got {sorted(labels)}")
        return tuple(labels[i] for i in range(len(labels)))
    n = hf.get("num_labels")
    if n is None:
        n = DEFAULT_NUM_LABELS
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CheckpointError(f"{at} field 'num_labels' is {n!r}; must be an integer >= 1")
    return tuple(f"LABEL_{i}" for i in range(n))


def check_classifier_architecture(hf: Mapping[str, Any], where) -> None:
    """Refuse a config.json whose `architectures` names models but no
    `...ForSequenceClassification` (a bare trunk, a masked LM, a QA head), naming the field.
    A config.json without `architectures` passes: its tensors decide."""
    names = hf.get("architectures")
    if not names:
        return
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{where}: field 'architectures' must be a list of class names, "
                              f"got {names!r}")
    if not any(n.endswith("ForSequenceClassification") for n in names):
        raise CheckpointError(f"{where}: field 'architectures' is {names}: not a "
                              "sequence-classification checkpoint (a ...ForSequenceClassification)")


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------

def _param(rngs: nnx.Rngs, init, shape: tuple[int, ...], names: tuple, dtype) -> nnx.Param:
    """A parameter initialized by `init` and annotated with logical axis `names`.

    Eager sharding is off: the names are logical, mapped onto a mesh later by
    `clarifyjax.core.sharding` (flax 0.12 would otherwise try to use them as mesh axes at creation).
    """
    init = nnx.with_partitioning(init, names, eager_sharding=False)
    return nnx.Param(init(rngs.params(), shape, dtype))


class Dense(nnx.Module):
    """y = x . kernel + bias, contracting the last `len(in_shape)` axes of x.

    kernel [*in_shape, *out_shape] with logical axes `in_names + out_names`.
    """

    def __init__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...], in_names: tuple,
                 out_names: tuple, *, config: EncoderConfig, rngs: nnx.Rngs):
        pdt = jnp.dtype(config.param_dtype)
        std = nnx.initializers.truncated_normal(config.initializer_range)
        self.kernel = _param(rngs, std, (*in_shape, *out_shape), (*in_names, *out_names), pdt)
        self.bias = _param(rngs, nnx.initializers.zeros_init(), out_shape, out_names, pdt)
        self.n_in = len(in_shape)
        self.dtype = jnp.dtype(config.dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...].astype(self.dtype)
        y = jax.lax.dot_general(x.astype(self.dtype), kernel,
                                (((tuple(range(x.ndim - self.n_in, x.ndim))),
                                  tuple(range(self.n_in))), ((), ())))
        return y + self.bias[...].astype(self.dtype)


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis, computed in float32, returned in the compute dtype."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        pdt = jnp.dtype(config.param_dtype)
        d = (config.hidden_size,)
        self.scale = _param(rngs, nnx.initializers.ones_init(), d, ("embed",), pdt)
        self.bias = _param(rngs, nnx.initializers.zeros_init(), d, ("embed",), pdt)
        self.eps = config.layer_norm_eps
        self.dtype = jnp.dtype(config.dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(self.dtype)


class Embedding(nnx.Module):
    """A lookup table [num, width] (width: the hidden size unless given) with logical axes
    (`row_name`, "embed")."""

    def __init__(self, num: int, row_name: str | None, config: EncoderConfig, *, rngs: nnx.Rngs,
                 width: int | None = None):
        init = nnx.initializers.truncated_normal(config.initializer_range)
        self.embedding = _param(rngs, init, (num, width or config.hidden_size),
                                (row_name, "embed"), jnp.dtype(config.param_dtype))
        self.dtype = jnp.dtype(config.dtype)

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)


def roberta_position_ids(input_ids: jax.Array, pad_token_id: int) -> jax.Array:
    """[b, s] -> [b, s]: non-padding tokens count from pad_token_id + 1, padding keeps pad_token_id.

    Hugging Face's `create_position_ids_from_input_ids` (padding found by token id, not by mask).
    """
    not_pad = (input_ids != pad_token_id).astype(jnp.int32)
    return jnp.cumsum(not_pad, axis=1) * not_pad + pad_token_id


class Embeddings(nnx.Module):
    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.word_embeddings = Embedding(config.vocab_size, "vocab", config, rngs=rngs)
        self.position_embeddings = Embedding(config.max_position_embeddings, None, config, rngs=rngs)
        self.token_type_embeddings = Embedding(config.type_vocab_size, None, config, rngs=rngs)
        self.norm = LayerNorm(config, rngs=rngs)

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array) -> jax.Array:
        """[b, s] int ids -> [b, s, d]."""
        if self.config.model_type == "roberta":
            positions = roberta_position_ids(input_ids, self.config.pad_token_id)
        else:
            positions = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_type_ids))
        return self.norm(x)


CHUNK_TOKENS = 512  # tokens run at once on one CPU device (see `chunk_rows`)


def chunk_rows(rows: int, length: int) -> int:
    """Rows of a [rows, length] batch to run at once: all of them, except on a lone CPU device,
    where the largest divisor of rows with at most CHUNK_TOKENS tokens. A whole batch's
    activations (and its [rows, heads, length, length] attention weights) spill the CPU's
    caches between one product and the next; a few rows' stay in them (benchmarks/results/
    sage_pipeline.json, part d: the embedder, its attention block)."""
    if jax.default_backend() != "cpu" or jax.device_count() != 1:
        return rows
    fit = max(1, CHUNK_TOKENS // length)
    return max(r for r in range(1, min(rows, fit) + 1) if rows % r == 0)


def map_rows(fn: Callable, x: jax.Array, mask: jax.Array) -> jax.Array:
    """fn(x, mask) -> [rows, length, ...] run `chunk_rows` rows at a time (`lax.map`), for
    x [rows, length, ...] and mask [rows, length]."""
    rows, length = mask.shape
    chunk = chunk_rows(rows, length)
    if chunk == rows:
        return fn(x, mask)
    split = (x.reshape(rows // chunk, chunk, *x.shape[1:]), mask.reshape(rows // chunk, chunk, length))
    out = jax.lax.map(lambda a: fn(*a), split)
    return out.reshape(rows, *out.shape[2:])


class SelfAttention(nnx.Module):
    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        d, h, k = config.hidden_size, config.num_heads, config.head_dim

        def proj():
            return Dense((d,), (h, k), ("embed",), ("heads", "kv"), config=config, rngs=rngs)

        self.query, self.key, self.value = proj(), proj(), proj()
        self.output = Dense((h, k), (d,), ("heads", "kv"), ("embed",), config=config, rngs=rngs)
        self.dtype = jnp.dtype(config.dtype)

    def __call__(self, x: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """x [b, s, d], attention_mask [b, s] (True = attend) -> [b, s, d], a few rows at a
        time on one CPU device (`map_rows`)."""
        return map_rows(self._rows, x, attention_mask)

    def _rows(self, x: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """Q, K and V come from one matmul (the three kernels side by side, 1/sqrt(head size)
        folded into Q's) and one transpose to [3, b, h, s, k], so that both attention products
        read contiguous [s, k] blocks per (row, head); the softmax divides the context [.., s, k]
        after the second product instead of the weights [.., s, s] before it. The numbers are
        those of three projections and a softmax, to float rounding."""
        b, s, d = x.shape
        h, k = self.query.kernel.shape[1:]
        scale = 1.0 / math.sqrt(k)
        kernel = jnp.stack([self.query.kernel[...] * scale, self.key.kernel[...],
                            self.value.kernel[...]], axis=1).astype(self.dtype)  # [d, 3, h, k]
        bias = jnp.stack([self.query.bias[...] * scale, self.key.bias[...],
                          self.value.bias[...]]).astype(self.dtype)             # [3, h, k]
        qkv = (x.astype(self.dtype).reshape(b * s, d) @ kernel.reshape(d, 3 * h * k))
        qkv = qkv.reshape(b, s, 3, h, k) + bias
        q, keys, v = jnp.transpose(qkv, (2, 0, 3, 1, 4))                        # [b, h, s, k]
        context = self._attend(q, keys, v, attention_mask)
        return self.output(jnp.transpose(context, (0, 2, 1, 3)).astype(self.dtype))

    def _attend(self, q, keys, v, attention_mask) -> jax.Array:
        """q, keys, v [b, h, s, k], attention_mask [b, s] -> context [b, h, s, k] float32."""
        scores = jnp.einsum("bhqk,bhsk->bhqs", q, keys, preferred_element_type=jnp.float32)
        # The most negative float, as Hugging Face's extended mask: fully padded rows stay finite.
        scores = jnp.where(attention_mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
        weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
        context = jnp.einsum("bhqs,bhsk->bhqk", weights.astype(self.dtype), v,
                             preferred_element_type=jnp.float32)
        return context / jnp.sum(weights, axis=-1, keepdims=True)


class MLP(nnx.Module):
    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        self.wi = Dense((d,), (f,), ("embed",), ("mlp",), config=config, rngs=rngs)
        self.wo = Dense((f,), (d,), ("mlp",), ("embed",), config=config, rngs=rngs)
        self.hidden_act = config.hidden_act

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.wo(ENCODER_ACTIVATIONS[self.hidden_act](self.wi(x)))


class BertLayer(nnx.Module):
    """Post-LN: x = LN(x + attn(x)); x = LN(x + mlp(x))."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.attention = SelfAttention(config, rngs=rngs)
        self.attention_norm = LayerNorm(config, rngs=rngs)
        self.mlp = MLP(config, rngs=rngs)
        self.mlp_norm = LayerNorm(config, rngs=rngs)

    def __call__(self, x: jax.Array, attention_mask: jax.Array) -> jax.Array:
        x = self.attention_norm(x + self.attention(x, attention_mask))
        return self.mlp_norm(x + self.mlp(x))


class BertEncoder(nnx.Module):
    """BERT / RoBERTa encoder: `(input_ids, attention_mask, token_type_ids) -> hidden [b, s, d]`."""

    def __init__(self, config: EncoderConfig, rngs: nnx.Rngs):
        self.config = config
        self.embeddings = Embeddings(config, rngs=rngs)
        self.layers = nnx.List([BertLayer(config, rngs=rngs) for _ in range(config.num_layers)])

    @honours_precision
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array | None = None) -> jax.Array:
        """input_ids [b, s] int, attention_mask [b, s] (1/True = token), token_type_ids [b, s] or
        None (zeros) -> last hidden state [b, s, d] in the compute dtype.

        Ids outside the tables are not checked here (jax clamps gathers): callers validate them.
        """
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        mask = attention_mask.astype(bool)
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return x


class SequenceClassifier(nnx.Module):
    """A trunk (`BertEncoder`) + head on the first token: logits = out_proj(act(dense(hidden[:, 0]))).

    With act = tanh this is both Hugging Face's RoBERTa head (`classifier.dense`,
    `classifier.out_proj`) and BERT's pooler + classifier (`bert.pooler.dense`, `classifier`): the
    same computation without dropout. A subclass swaps the trunk (`trunk`) and the activation
    (`pooler_activation`): DeBERTa's ContextPooler is the same head with `pooler_hidden_act`.
    """

    trunk = BertEncoder

    def __init__(self, config: EncoderConfig, rngs: nnx.Rngs):
        if config.num_labels < 1:
            raise CheckpointError("a sequence classifier needs labels (config.json 'id2label')")
        self.config = config
        self.encoder = type(self).trunk(config, rngs)
        d = config.hidden_size
        self.dense = Dense((d,), (d,), ("embed",), (None,), config=config, rngs=rngs)
        self.out_proj = Dense((d,), (config.num_labels,), (None,), ("classes",), config=config,
                              rngs=rngs)

    @staticmethod
    def pooler_activation(config) -> Callable[[jax.Array], jax.Array]:
        return jnp.tanh

    @honours_precision
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array | None = None) -> jax.Array:
        """[b, s] ids and mask -> logits [b, num_labels] in float32."""
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)
        pooled = self.pooler_activation(self.config)(self.dense(hidden[:, 0]))
        return self.out_proj(pooled).astype(jnp.float32)


class QuestionAnswering(nnx.Module):
    """A trunk (`BertEncoder`) + extractive span head, Hugging Face's `...ForQuestionAnswering` layout:
    `qa_outputs` (a [d, 2] Dense) on every position gives start and end logits.
    A subclass swaps the trunk (`trunk`), as `SequenceClassifier`."""

    trunk = BertEncoder

    def __init__(self, config: EncoderConfig, rngs: nnx.Rngs):
        self.config = config
        self.encoder = type(self).trunk(config, rngs)
        self.qa_outputs = Dense((config.hidden_size,), (2,), ("embed",), (None,), config=config,
                                rngs=rngs)

    @honours_precision
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """[b, s] ids and mask -> (start_logits [b, s], end_logits [b, s]) in float32.

        Padding positions get logits like any other (as Hugging Face): `best_spans` masks them."""
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)
        logits = self.qa_outputs(hidden).astype(jnp.float32)
        return logits[..., 0], logits[..., 1]

