"""T5 encoder-decoder in Flax NNX, both families, with a functional KV cache for decoding.

* v1.0 (t5-large, Delphi): relu, embeddings tied, decoder output rescaled by d_model**-0.5;
* v1.1 / flan-t5: gated-gelu, separate `lm_head`, no rescale.
Every public method runs its matmuls at `T5Config.precision` (JAX's default, or "highest", as
PyTorch computes a float32 T5).
Shapes: b = batch, s = source length, t = target length, m = d_model, L = cache length, V = vocab."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from clarifyjax.models.state import check_precision, honours_precision, set_dtype_fields

from clarifyjax.models.t5_layers import (RelativePositionBias, RMSNorm, T5DecoderLayer,
                                         T5EncoderLayer, make_param, parse_feed_forward_proj)

_REQUIRED_HF_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")


# transformers 5 decouples v1.0's two switches (its configs always say `tie_word_embeddings: true`
# and carry `scale_decoder_outputs`), so this config has both: `tie_word_embeddings` (one matrix or
# two) and `scale_decoder_outputs` (default: the same as `tie_word_embeddings`, as in transformers 4).
@dataclasses.dataclass(frozen=True)
class T5Config:
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int | None = None  # None: same as num_layers
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    tie_word_embeddings: bool = True
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int | None = None  # None: pad_token_id
    dtype: str = "float32"        # compute dtype
    param_dtype: str = "float32"  # storage dtype of the parameters
    scale_decoder_outputs: bool | None = None  # None: same as tie_word_embeddings
    precision: str = "default"  # of every matmul (`state.PRECISIONS`); not part of config.json

    def __post_init__(self):
        parse_feed_forward_proj(self.feed_forward_proj)  # ValueError naming the field
        set_dtype_fields(self, "T5")
        check_precision(self, "T5")
        if self.num_decoder_layers is None:
            object.__setattr__(self, "num_decoder_layers", self.num_layers)
        if self.decoder_start_token_id is None:
            object.__setattr__(self, "decoder_start_token_id", self.pad_token_id)
        if self.scale_decoder_outputs is None:
            object.__setattr__(self, "scale_decoder_outputs", self.tie_word_embeddings)
        for field in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers",
                      "num_heads", "relative_attention_num_buckets",
                      "relative_attention_max_distance"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"T5 config field {field!r} must be >= 1, got {getattr(self, field)}")

    @property
    def is_gated_act(self) -> bool:
        return parse_feed_forward_proj(self.feed_forward_proj)[0]

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides) -> T5Config:
        """From a Hugging Face T5 `config.json` dict; `overrides` (e.g. dtype) win.

        `tie_word_embeddings` is taken as written, but transformers 5 writes `true` even for
        untied v1.1 models: `load_t5` decides it from the tensors (a separate lm_head.weight).
        """
        model_type = hf.get("model_type", "t5")
        if model_type not in ("t5", "mt5"):
            raise ValueError(f"config.json: model_type is {model_type!r}, expected 't5' (or 'mt5')")
        missing = [k for k in _REQUIRED_HF_FIELDS if k not in hf]
        if missing:
            raise ValueError(f"config.json: missing T5 fields {missing}")
        names = {f.name for f in dataclasses.fields(cls)} - {"dtype", "param_dtype", "precision"}
        kwargs = {k: hf[k] for k in names if k in hf and hf[k] is not None}
        eos = kwargs.get("eos_token_id")
        if isinstance(eos, (list, tuple)):  # transformers allows several; we stop on the first
            kwargs["eos_token_id"] = int(eos[0])
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_hf(self) -> dict:
        """A config.json dict that transformers 5 `T5ForConditionalGeneration` accepts."""
        gated, act = parse_feed_forward_proj(self.feed_forward_proj)
        return {
            "architectures": ["T5ForConditionalGeneration"],
            "model_type": "t5",
            "is_encoder_decoder": True,
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "d_kv": self.d_kv,
            "d_ff": self.d_ff,
            "num_layers": self.num_layers,
            "num_decoder_layers": self.num_decoder_layers,
            "num_heads": self.num_heads,
            "relative_attention_num_buckets": self.relative_attention_num_buckets,
            "relative_attention_max_distance": self.relative_attention_max_distance,
            "dropout_rate": self.dropout_rate,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "initializer_factor": 1.0,
            "feed_forward_proj": self.feed_forward_proj,
            "dense_act_fn": act,
            "is_gated_act": gated,
            "tie_word_embeddings": self.tie_word_embeddings,
            "scale_decoder_outputs": self.scale_decoder_outputs,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": self.eos_token_id,
            "decoder_start_token_id": self.decoder_start_token_id,
            "use_cache": True,
            "dtype": self.param_dtype,
        }


class DecodeCache(NamedTuple):
    """Functional decoding state (plain arrays, so it threads through `lax.while_loop`).

    self_k, self_v: per decoder layer, [b, h, L, d] keys/values of the positions decoded so far;
    cross_k, cross_v: per decoder layer, [b, h, s, d] projections of the encoder output;
    encoder_mask: [b, s] bool.
    One array per layer, not one stacked array: XLA:CPU copies a layer's slice of a stacked
    cache out on every step, a cache-sized copy per layer per token.
    """
    self_k: tuple[jax.Array, ...]
    self_v: tuple[jax.Array, ...]
    cross_k: tuple[jax.Array, ...]
    cross_v: tuple[jax.Array, ...]
    encoder_mask: jax.Array


# The relative position bias of each stack is made once (it belongs to the stack's first layer in
# Hugging Face checkpoints) and shared by all its layers.
class _Stack(nnx.Module):
    """Relative position bias, the layers and the final norm of the encoder or the decoder."""

    def __init__(self, config: T5Config, layer: type, num_layers: int, *, bidirectional: bool,
                 rngs: nnx.Rngs):
        c = config
        self.relative_bias = RelativePositionBias(
            c.relative_attention_num_buckets, c.relative_attention_max_distance, c.num_heads,
            c.d_model, bidirectional=bidirectional, param_dtype=c.param_dtype, rngs=rngs)
        self.layers = nnx.List([layer(c, rngs=rngs) for _ in range(num_layers)])
        self.final_norm = RMSNorm(c.d_model, c.layer_norm_epsilon, dtype=c.dtype,
                                  param_dtype=c.param_dtype)
        self.dropout = nnx.Dropout(c.dropout_rate)


class T5Encoder(_Stack):
    def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
        super().__init__(config, T5EncoderLayer, config.num_layers, bidirectional=True, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        """Embedded inputs x [b, s, m], mask [b, s] -> [b, s, m]."""
        kw = dict(deterministic=deterministic, rngs=rngs)
        positions = jnp.arange(x.shape[1])
        bias = self.relative_bias(positions, positions)
        attn_mask = mask.astype(bool)[:, None, None, :]
        x = self.dropout(x, **kw)
        for layer in self.layers:
            x = layer(x, bias, attn_mask, **kw)
        return self.dropout(self.final_norm(x), **kw)


class T5Decoder(_Stack):
    def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
        super().__init__(config, T5DecoderLayer, config.num_decoder_layers, bidirectional=False,
                         rngs=rngs)

    def __call__(self, x: jax.Array, encoder_hidden: jax.Array, encoder_mask: jax.Array,
                 decoder_mask: jax.Array | None, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        """Embedded targets x [b, t, m], encoder_hidden [b, s, m], encoder_mask [b, s],
        decoder_mask [b, t] or None -> [b, t, m]."""
        kw = dict(deterministic=deterministic, rngs=rngs)
        t = x.shape[1]
        positions = jnp.arange(t)
        bias = self.relative_bias(positions, positions)
        self_mask = (positions[None, :] <= positions[:, None])[None, None]  # [1, 1, t, t] causal
        if decoder_mask is not None:
            self_mask = self_mask & decoder_mask.astype(bool)[:, None, None, :]
        cross_mask = encoder_mask.astype(bool)[:, None, None, :]
        x = self.dropout(x, **kw)
        for layer in self.layers:
            x = layer(x, encoder_hidden, bias, self_mask, cross_mask, **kw)
        return self.dropout(self.final_norm(x), **kw)


class T5(nnx.Module):
    """T5ForConditionalGeneration in NNX. Dropout is active only with deterministic=False."""

    def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
        c = self.config = config
        self.embedding = make_param(rngs, 1.0, (c.vocab_size, c.d_model), ("vocab", "embed"),
                                    c.param_dtype)
        self.encoder = T5Encoder(c, rngs=rngs)
        self.decoder = T5Decoder(c, rngs=rngs)
        if not c.tie_word_embeddings:
            self.lm_head = make_param(rngs, 1.0, (c.d_model, c.vocab_size), ("embed", "vocab"),
                                      c.param_dtype)

    # -- pieces -------------------------------------------------------------------------------
    def embed(self, ids: jax.Array) -> jax.Array:
        """ids [...] int -> [..., m] in the compute dtype."""
        return jnp.take(self.embedding[...], ids, axis=0).astype(self.config.dtype)

    @honours_precision
    def logits(self, hidden: jax.Array) -> jax.Array:
        """Final decoder hidden [..., m] -> logits [..., V] float32."""
        c = self.config
        if c.scale_decoder_outputs:
            hidden = hidden * jnp.asarray(c.d_model ** -0.5, hidden.dtype)
        if c.tie_word_embeddings:
            return jnp.einsum("...m,vm->...v", hidden, self.embedding[...].astype(c.dtype),
                              preferred_element_type=jnp.float32)
        return jnp.einsum("...m,mv->...v", hidden, self.lm_head[...].astype(c.dtype),
                          preferred_element_type=jnp.float32)

    @staticmethod
    def _check_rngs(deterministic: bool, rngs) -> None:
        if not deterministic and rngs is None:
            raise ValueError("T5: deterministic=False (dropout) needs rngs with a 'dropout' stream")

    # -- public API -----------------------------------------------------------------------------
    @honours_precision
    def encode(self, input_ids: jax.Array, attention_mask: jax.Array, *,
               deterministic: bool = True, rngs: nnx.Rngs | None = None) -> jax.Array:
        """input_ids [b, s] int, attention_mask [b, s] (1 = token) -> encoder hidden [b, s, m]."""
        self._check_rngs(deterministic, rngs)
        return self.encoder(self.embed(input_ids), attention_mask, deterministic=deterministic,
                            rngs=rngs)

    @honours_precision
    def decode(self, decoder_input_ids: jax.Array, encoder_hidden: jax.Array,
               encoder_mask: jax.Array, decoder_attention_mask: jax.Array | None = None, *,
               return_hidden: bool = False, deterministic: bool = True,
               rngs: nnx.Rngs | None = None):
        """decoder_input_ids [b, t], encoder_hidden [b, s, m], encoder_mask [b, s],
        decoder_attention_mask [b, t] or None (causal only)
        -> logits [b, t, V] float32, or (logits, final hidden [b, t, m]) with return_hidden."""
        self._check_rngs(deterministic, rngs)
        hidden = self.decoder(self.embed(decoder_input_ids), encoder_hidden, encoder_mask,
                              decoder_attention_mask, deterministic=deterministic, rngs=rngs)
        logits = self.logits(hidden)
        return (logits, hidden) if return_hidden else logits

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 decoder_input_ids: jax.Array, decoder_attention_mask: jax.Array | None = None,
                 *, deterministic: bool = True, rngs: nnx.Rngs | None = None) -> jax.Array:
        """input_ids/attention_mask [b, s], decoder_input_ids [b, t] (already shifted right,
        starting with decoder_start_token_id), decoder_attention_mask [b, t] or None
        -> logits [b, t, V] float32."""
        encoder_hidden = self.encode(input_ids, attention_mask, deterministic=deterministic,
                                     rngs=rngs)
        return self.decode(decoder_input_ids, encoder_hidden, attention_mask,
                           decoder_attention_mask, deterministic=deterministic, rngs=rngs)

    @honours_precision
    def init_cache(self, encoder_hidden: jax.Array, encoder_mask: jax.Array,
                   max_length: int) -> DecodeCache:
        """encoder_hidden [b, s, m], encoder_mask [b, s] -> an empty cache for `max_length`
        decoder positions, with every layer's cross-attention keys/values precomputed."""
        c = self.config
        b = encoder_hidden.shape[0]
        cross = [layer.cross_attention.project_key_value(encoder_hidden)
                 for layer in self.decoder.layers]
        shape = (b, c.num_heads, int(max_length), c.d_kv)
        layers = range(c.num_decoder_layers)
        return DecodeCache(
            self_k=tuple(jnp.zeros(shape, c.dtype) for _ in layers),
            self_v=tuple(jnp.zeros(shape, c.dtype) for _ in layers),
            cross_k=tuple(k for k, _ in cross), cross_v=tuple(v for _, v in cross),
            encoder_mask=encoder_mask.astype(bool))

    @honours_precision
    def decode_step(self, token_ids: jax.Array, cache: DecodeCache, position: jax.Array, *,
                    return_hidden: bool = False):
        """Feed token_ids [b] at decoder `position` (int scalar, < L) given the cache holding
        positions < `position` -> (logits [b, V] float32, updated cache), or with return_hidden
        (logits, hidden [b, m], cache)."""
        max_length = cache.self_k[0].shape[2]
        position = jnp.asarray(position, jnp.int32)
        keys = jnp.arange(max_length)
        bias = self.decoder.relative_bias(position[None], keys)  # [1, h, 1, L]
        self_mask = (keys <= position)[None, None, None, :]
        cross_mask = cache.encoder_mask[:, None, None, :]
        x = self.embed(token_ids)[:, None, :]
        self_k, self_v = list(cache.self_k), list(cache.self_v)
        for i, layer in enumerate(self.decoder.layers):
            x, self_k[i], self_v[i] = layer.step(x, bias, self_mask, cross_mask, self_k[i],
                                                 self_v[i], cache.cross_k[i], cache.cross_v[i],
                                                 position)
        hidden = self.decoder.final_norm(x)[:, 0]
        cache = cache._replace(self_k=tuple(self_k), self_v=tuple(self_v))
        logits = self.logits(hidden)
        return (logits, hidden, cache) if return_hidden else (logits, cache)


def shift_right(target_ids: jax.Array, start_token_id: int) -> jax.Array:
    """[b, t] -> [b, t]: start token, then the targets without their last position."""
    start = jnp.full(target_ids.shape[:-1] + (1,), start_token_id, target_ids.dtype)
    return jnp.concatenate([start, target_ids[..., :-1]], axis=-1)
