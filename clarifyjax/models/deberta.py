"""Flax NNX DeBERTa-v2 / v3 (Hugging Face `model_type` "deberta-v2"): the encoder with disentangled
attention (what differs from BERT is listed above `DisentangledSelfAttention`), and its
sequence-classification and extractive-QA heads; it reuses `clarifyjax.models.encoder`'s layers.
`deberta_map` refuses what is not supported (deberta-v2-xlarge's conv layer, a
`pooler_hidden_size` other than `hidden_size`), naming the field.

Shapes: b = batch, s = sequence, d = hidden size, e = embedding size, h = heads, k = head size,
r = 2 * att_span relative-position rows."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clarifyjax.models.encoder import (ENCODER_ACTIVATIONS, MLP, Dense, Embedding, LayerNorm,
                                       QuestionAnswering, SequenceClassifier)
from clarifyjax.models.state import check_precision, honours_precision

ATTENTION_TERMS = ("c2p", "p2c")


@dataclasses.dataclass(frozen=True)
class DebertaConfig:
    """The architecture of a DeBERTa-v2/v3 encoder (hashable: usable as a static argument).

    Field names follow `EncoderConfig` where the meaning is the same (the shared layers read
    hidden_size, intermediate_size, hidden_act, layer_norm_eps, initializer_range, the dtypes).
    `deberta_params.read_deberta_config` fills it from config.json and checks every value.
    """

    vocab_size: int = 128100
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    head_dim: int = 64  # config.json attention_head_size, else hidden_size // heads
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 0  # 0: no token-type table
    embedding_size: int = 768  # e; a projection to d follows when e != d
    layer_norm_eps: float = 1e-7
    pad_token_id: int = 0
    initializer_range: float = 0.02
    position_biased_input: bool = False
    relative_attention: bool = True
    max_relative_positions: int = 512  # already resolved (-1 in config.json -> max positions)
    position_buckets: int = 256  # <= 0: no log buckets
    pos_att_type: tuple[str, ...] = ("p2c", "c2p")
    share_att_key: bool = True
    norm_rel_ebd: bool = True  # config.json norm_rel_ebd contains "layer_norm"
    pooler_hidden_act: str = "gelu"
    labels: tuple[str, ...] = ()
    dtype: str = "float32"
    param_dtype: str = "float32"
    model_type: str = "deberta-v2"
    precision: str = "default"  # of every matmul (`state.PRECISIONS`)

    def __post_init__(self):
        check_precision(self, "DeBERTa")

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def att_span(self) -> int:
        """Relative distances are clamped to [-att_span, att_span) (Hugging Face pos_ebd_size)."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    @property
    def scale_factor(self) -> int:
        """Scores are divided by sqrt(head_dim * scale_factor): 1 + one per relative term."""
        return 1 + sum(t in self.pos_att_type for t in ATTENTION_TERMS)

    @property
    def max_tokens(self) -> int:
        return self.max_position_embeddings


def log_bucket_positions(relative: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
    """Hugging Face's `make_log_bucket_position`, in float32 as torch computes it: distances
    within +-bucket_size/2 stay, larger ones go to mid + ceil(log(|x| / mid) / log((max - 1) /
    mid) * (mid - 1)), with their sign. int array in, int64 array out."""
    relative = np.asarray(relative, np.int64)
    sign = np.sign(relative)
    mid = bucket_size // 2
    abs_pos = np.where((relative < mid) & (relative > -mid), mid - 1, np.abs(relative))
    ratio = abs_pos.astype(np.float32) / np.float32(mid)
    log_pos = np.ceil(np.log(ratio) / np.log(np.float32((max_position - 1) / mid))
                      * np.float32(mid - 1)) + np.float32(mid)
    bucket = np.where(abs_pos <= mid, relative.astype(np.float32), log_pos * sign)
    return bucket.astype(np.int64)


def relative_positions(length: int, config: DebertaConfig) -> np.ndarray:
    """[s, s] bucketed i - j for a sequence of `length` (a trace-time constant)."""
    ids = np.arange(length)
    relative = ids[:, None] - ids[None, :]
    if config.position_buckets > 0 and config.max_relative_positions > 0:
        relative = log_bucket_positions(relative, config.position_buckets,
                                        config.max_relative_positions)
    return relative


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], names: tuple, config: DebertaConfig
           ) -> nnx.Param:
    """A truncated-normal parameter with logical axis `names` (mapped onto a mesh later, by
    `clarifyjax.core.sharding`)."""
    init = nnx.initializers.truncated_normal(config.initializer_range)
    init = nnx.with_partitioning(init, names, eager_sharding=False)
    return nnx.Param(init(rngs.params(), shape, jnp.dtype(config.param_dtype)))


class DebertaEmbeddings(nnx.Module):
    def __init__(self, config: DebertaConfig, *, rngs: nnx.Rngs):
        e, d = config.embedding_size, config.hidden_size
        self.word_embeddings = Embedding(config.vocab_size, "vocab", config, rngs=rngs, width=e)
        self.position_embeddings = (
            Embedding(config.max_position_embeddings, None, config, rngs=rngs, width=e)
            if config.position_biased_input else None)
        self.token_type_embeddings = (Embedding(config.type_vocab_size, None, config, rngs=rngs,
                                                width=e) if config.type_vocab_size > 0 else None)
        # Hugging Face's projection from e to d has no bias: a bare kernel [e, d].
        self.embed_proj = (_param(rngs, (e, d), (None, "embed"), config) if e != d else None)
        self.norm = LayerNorm(config, rngs=rngs)

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array,
                 mask: jax.Array) -> jax.Array:
        """[b, s] ids, token types and mask (1 = token) -> [b, s, d], zero at padding."""
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            positions = jnp.arange(input_ids.shape[1])
            x = x + self.position_embeddings(positions)[None]
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        if self.embed_proj is not None:
            x = jnp.einsum("bse,ed->bsd", x, self.embed_proj[...].astype(x.dtype))
        x = self.norm(x)
        return x * mask[..., None].astype(x.dtype)


def _gather_relative(scores: jax.Array, index: np.ndarray) -> jax.Array:
    """scores [b, h, s, r], index [s, s] into r -> [b, h, s, s]: out[..., i, j] =
    scores[..., i, index[i, j]] (torch.gather along the last axis)."""
    b, h, s, _ = scores.shape
    index = jnp.broadcast_to(jnp.asarray(index, jnp.int32)[None, None], (b, h, s, s))
    return jnp.take_along_axis(scores, index, axis=-1)


# What differs from BERT:
# * Scores add two relative-position terms to content->content (He et al. 2021, eq. 4): c2p (the
#   query against the key projection of the relative embedding at bucket(i - j)) and p2c (the key
#   against the query projection at bucket(j - i)), each divided like the content term by
#   sqrt(head_dim * (1 + number of terms)).
# * Relative distances go into `2 * att_span` rows: clamped at +-att_span and, with
#   `position_buckets > 0`, squashed into log buckets beyond +-position_buckets / 2 (v3); the table
#   is computed on the host in float32 exactly as Hugging Face's `make_log_bucket_position`.
# * `share_att_key` (v3): the position projections are the content query / key projections; else
#   (v2) separate `pos_key_proj` / `pos_query_proj`. `norm_rel_ebd: layer_norm` (v3): a LayerNorm on
#   the relative table. `position_biased_input`: absolute positions added to the input (v2) or not.
# * Masks as Hugging Face's: the [b, s, s] mask is mask[i] * mask[j], so a padding query row attends
#   uniformly to all positions (computed and returned, as theirs); the embeddings are multiplied by
#   the mask before the first layer.
class DisentangledSelfAttention(nnx.Module):
    def __init__(self, config: DebertaConfig, *, rngs: nnx.Rngs):
        self.config = config
        d, h, k = config.hidden_size, config.num_heads, config.head_dim

        def proj():
            return Dense((d,), (h, k), ("embed",), ("heads", "kv"), config=config, rngs=rngs)

        self.query, self.key, self.value = proj(), proj(), proj()
        own = config.relative_attention and not config.share_att_key  # v2: own projections
        self.pos_key = proj() if own and "c2p" in config.pos_att_type else None
        self.pos_query = proj() if own and "p2c" in config.pos_att_type else None
        self.output = Dense((h, k), (d,), ("heads", "kv"), ("embed",), config=config, rngs=rngs)
        self.dtype = jnp.dtype(config.dtype)

    def _relative_scores(self, q: jax.Array, k: jax.Array, rel: jax.Array) -> jax.Array:
        """q, k [b, s, h, k]; rel [r, d] -> the c2p + p2c terms [b, h, s, s] in float32."""
        c = self.config
        span, s = c.att_span, q.shape[1]
        positions = relative_positions(s, c)
        scale = math.sqrt(c.head_dim * c.scale_factor)
        total = jnp.zeros((q.shape[0], c.num_heads, s, s), jnp.float32)
        if "c2p" in c.pos_att_type:
            pos_key = (self.key if c.share_att_key else self.pos_key)(rel)  # [r, h, k]
            c2p = jnp.einsum("bqhk,rhk->bhqr", q, pos_key, preferred_element_type=jnp.float32)
            total += _gather_relative(c2p, np.clip(positions + span, 0, 2 * span - 1)) / scale
        if "p2c" in c.pos_att_type:
            pos_query = (self.query if c.share_att_key else self.pos_query)(rel)  # [r, h, k]
            p2c = jnp.einsum("bshk,rhk->bhsr", k, pos_query, preferred_element_type=jnp.float32)
            gathered = _gather_relative(p2c, np.clip(-positions + span, 0, 2 * span - 1))
            total += jnp.swapaxes(gathered, -1, -2) / scale
        return total

    def __call__(self, x: jax.Array, pair_mask: jax.Array, rel: jax.Array | None) -> jax.Array:
        """x [b, s, d], pair_mask [b, s, s] (True = attend), rel [r, d] or None -> [b, s, d]."""
        c = self.config
        q, k, v = self.query(x), self.key(x), self.value(x)  # [b, s, h, k]
        scores = jnp.einsum("bqhk,bshk->bhqs", q, k, preferred_element_type=jnp.float32)
        scores = scores / math.sqrt(c.head_dim * c.scale_factor)
        if rel is not None:
            scores = scores + self._relative_scores(q, k, rel)
        scores = jnp.where(pair_mask[:, None], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
        return self.output(jnp.einsum("bhqs,bshk->bqhk", probs, v))


class DebertaLayer(nnx.Module):
    """Post-LN, as BERT: x = LN(x + attn(x)); x = LN(x + mlp(x))."""

    def __init__(self, config: DebertaConfig, *, rngs: nnx.Rngs):
        self.attention = DisentangledSelfAttention(config, rngs=rngs)
        self.attention_norm = LayerNorm(config, rngs=rngs)
        self.mlp = MLP(config, rngs=rngs)
        self.mlp_norm = LayerNorm(config, rngs=rngs)

    def __call__(self, x: jax.Array, pair_mask: jax.Array, rel: jax.Array | None) -> jax.Array:
        x = self.attention_norm(x + self.attention(x, pair_mask, rel))
        return self.mlp_norm(x + self.mlp(x))


class DebertaEncoder(nnx.Module):
    """DeBERTa-v2/v3 trunk: `(input_ids, attention_mask, token_type_ids) -> hidden [b, s, d]`,
    the same call as `encoder.BertEncoder`, so the heads and callers take either."""

    def __init__(self, config: DebertaConfig, rngs: nnx.Rngs):
        self.config = config
        self.embeddings = DebertaEmbeddings(config, rngs=rngs)
        self.layers = nnx.List([DebertaLayer(config, rngs=rngs) for _ in range(config.num_layers)])
        relative = config.relative_attention
        self.rel_embeddings = (_param(rngs, (2 * config.att_span, config.hidden_size),
                                      ("relpos_buckets", "embed"), config) if relative else None)
        self.rel_norm = (LayerNorm(config, rngs=rngs) if relative and config.norm_rel_ebd
                         else None)

    @honours_precision
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array | None = None) -> jax.Array:
        """input_ids [b, s] int, attention_mask [b, s] (1/True = token), token_type_ids [b, s] or
        None (zeros) -> last hidden state [b, s, d] in the compute dtype (padding rows included,
        computed as Hugging Face does)."""
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        mask = attention_mask.astype(bool)
        x = self.embeddings(input_ids, token_type_ids, mask)
        pair_mask = mask[:, None, :] & mask[:, :, None]  # [b, s, s]
        rel = None
        if self.rel_embeddings is not None:
            rel = self.rel_embeddings[...].astype(jnp.dtype(self.config.dtype))
            if self.rel_norm is not None:
                rel = self.rel_norm(rel)
        for layer in self.layers:
            x = layer(x, pair_mask, rel)
        return x


class DebertaSequenceClassifier(SequenceClassifier):
    """DebertaV2ForSequenceClassification: ContextPooler (dense on the first token, then
    `pooler_hidden_act`) and a linear classifier; paths `encoder`, `dense`, `out_proj`."""

    trunk = DebertaEncoder

    @staticmethod
    def pooler_activation(config) -> Callable[[jax.Array], jax.Array]:
        return ENCODER_ACTIVATIONS[config.pooler_hidden_act]


class DebertaQuestionAnswering(QuestionAnswering):
    """DebertaV2ForQuestionAnswering: `qa_outputs` on every position -> start / end logits."""

    trunk = DebertaEncoder
