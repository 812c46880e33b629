"""Building blocks of the T5 encoder-decoder in Flax NNX: norm, attention, feed-forward, blocks.

Conventions (shared with `t5.py`):
  b = batch, t = query length, s = key length, m = d_model, h = heads, d = d_kv, f = d_ff.
  Parameters are stored in `param_dtype` and cast to the compute `dtype` when used; the layer
  norm, the attention softmax and the logits are computed in float32.
  Every parameter carries logical axis names (`nnx.with_partitioning`), mapped onto a mesh by
  `clarifyjax.core.sharding`. Eager sharding is off: names are metadata until a mesh is chosen.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

# feed_forward_proj values, as in transformers' T5Config: "{act}" or "gated-{act}".
# "gated-gelu" is the tanh approximation (transformers maps it to gelu_new); plain "gelu" is exact.
T5_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,
}
FEED_FORWARD_PROJ = ("relu", "gelu", "gelu_new", "silu",
                     "gated-relu", "gated-gelu", "gated-gelu_new", "gated-silu")


def parse_feed_forward_proj(value: str) -> tuple[bool, str]:
    """"gated-gelu" -> (True, "gelu_new"), "relu" -> (False, "relu"); ValueError otherwise."""
    if value not in FEED_FORWARD_PROJ:
        raise ValueError(f"T5 config field 'feed_forward_proj' is {value!r}; allowed values: "
                         f"{', '.join(FEED_FORWARD_PROJ)}")
    gated = value.startswith("gated-")
    act = value.split("-", 1)[1] if gated else value
    return gated, ("gelu_new" if value == "gated-gelu" else act)


def make_param(rngs: nnx.Rngs, std: float, shape: tuple[int, ...], names: tuple[str | None, ...],
               param_dtype) -> nnx.Param:
    """A normal(0, std) parameter annotated with logical axis `names`."""
    init = nnx.with_partitioning(nnx.initializers.normal(std), names, eager_sharding=False)
    return nnx.Param(init(rngs.params(), shape, param_dtype))


class RMSNorm(nnx.Module):
    """T5's layer norm: scale only, no mean subtraction, no bias; computed in float32."""

    def __init__(self, size: int, eps: float, *, dtype, param_dtype):
        init = nnx.with_partitioning(nnx.initializers.ones, ("embed",), eager_sharding=False)
        self.scale = nnx.Param(init(jax.random.key(0), (size,), param_dtype))
        self.eps, self.dtype = eps, dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        """[..., m] -> [..., m] in the compute dtype."""
        x32 = x.astype(jnp.float32)
        variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        y = x32 * jax.lax.rsqrt(variance + self.eps)
        return (self.scale[...].astype(jnp.float32) * y).astype(self.dtype)


def relative_position_bucket(relative_position: jax.Array, *, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> jax.Array:
    """Mesh-TensorFlow's bucketing of `key_position - query_position` (int array, any shape).

    Small distances get one bucket each, larger ones logarithmic bins up to `max_distance`; the
    float32 operations follow transformers' order so that the integer buckets agree exactly.
    """
    buckets = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).astype(relative_position.dtype) * num_buckets
        relative_position = jnp.abs(relative_position)
    else:
        relative_position = -jnp.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    # max(., 1) keeps log finite where the small branch is taken anyway.
    ratio = jnp.maximum(relative_position, 1).astype(jnp.float32) / jnp.float32(max_exact)
    large = max_exact + (jnp.log(ratio) / jnp.float32(math.log(max_distance / max_exact))
                         * jnp.float32(num_buckets - max_exact)).astype(relative_position.dtype)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(is_small, relative_position, large)


class RelativePositionBias(nnx.Module):
    """Learned scalar bias per (bucket, head), made once per stack and shared by its layers."""

    def __init__(self, num_buckets: int, max_distance: int, num_heads: int, d_model: int, *,
                 bidirectional: bool, param_dtype, rngs: nnx.Rngs):
        self.embedding = make_param(rngs, d_model ** -0.5, (num_buckets, num_heads),
                                    ("relpos_buckets", "heads"), param_dtype)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional

    def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
        """query_positions [t], key_positions [s] (int) -> bias [1, h, t, s] float32."""
        relative = key_positions[None, :].astype(jnp.int32) - query_positions[:, None].astype(jnp.int32)
        buckets = relative_position_bucket(relative, bidirectional=self.bidirectional,
                                           num_buckets=self.num_buckets,
                                           max_distance=self.max_distance)
        values = jnp.take(self.embedding[...].astype(jnp.float32), buckets, axis=0)  # [t, s, h]
        return jnp.transpose(values, (2, 0, 1))[None]


def _project(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x [b, t, m] @ kernel [m, h, d] -> [b, h, t, d].

    The product is formed as [b, t, h, d] and only the (small) activation is transposed: asking
    XLA:CPU for [b, h, t, d] directly made it transpose the whole kernel on every call, which in
    a decoding loop is a weight-sized copy per projection per step.
    """
    return jnp.swapaxes(jnp.einsum("btm,mhd->bthd", x, kernel), 1, 2)


class T5Attention(nnx.Module):
    """Multi-head attention without the 1/sqrt(d) scaling (T5 folds it into the weights)."""

    def __init__(self, d_model: int, num_heads: int, d_kv: int, dropout_rate: float, *,
                 dtype, param_dtype, rngs: nnx.Rngs):
        inner = num_heads * d_kv
        names_in, names_out = ("embed", "heads", "kv"), ("heads", "kv", "embed")
        self.query = make_param(rngs, (d_model * d_kv) ** -0.5, (d_model, num_heads, d_kv),
                                names_in, param_dtype)
        self.key = make_param(rngs, d_model ** -0.5, (d_model, num_heads, d_kv), names_in,
                              param_dtype)
        self.value = make_param(rngs, d_model ** -0.5, (d_model, num_heads, d_kv), names_in,
                                param_dtype)
        self.out = make_param(rngs, inner ** -0.5, (num_heads, d_kv, d_model), names_out,
                              param_dtype)
        self.dropout = nnx.Dropout(dropout_rate)
        self.dtype = dtype

    def project_query(self, x: jax.Array) -> jax.Array:
        """[b, t, m] -> [b, h, t, d]."""
        return _project(x, self.query[...].astype(self.dtype))

    def project_key_value(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """[b, s, m] -> keys, values, each [b, h, s, d]."""
        return (_project(x, self.key[...].astype(self.dtype)),
                _project(x, self.value[...].astype(self.dtype)))

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array | None,
               mask: jax.Array, *, deterministic: bool = True,
               rngs: nnx.Rngs | None = None) -> jax.Array:
        """q [b, h, t, d], k/v [b, h, s, d], bias [1|b, h, t, s] float32 or None,
        mask [b|1, 1, t|1, s] bool (True = may attend) -> [b, t, m]."""
        scores = jnp.einsum("bhtd,bhsd->bhts", q, k, preferred_element_type=jnp.float32)
        if bias is not None:
            scores = scores + bias
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1)
        weights = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        context = jnp.einsum("bhts,bhsd->bthd", weights.astype(self.dtype), v)
        b, t, h, d = context.shape
        # [b, t, h*d] @ [h*d, m]: one plain matmul, the kernel read in its stored layout
        return context.reshape(b, t, h * d) @ self.out[...].astype(self.dtype).reshape(h * d, -1)

    def __call__(self, x: jax.Array, source: jax.Array, bias: jax.Array | None, mask: jax.Array,
                 *, deterministic: bool = True, rngs: nnx.Rngs | None = None) -> jax.Array:
        """Attention of x [b, t, m] over source [b, s, m] -> [b, t, m]."""
        k, v = self.project_key_value(source)
        return self.attend(self.project_query(x), k, v, bias, mask, deterministic=deterministic,
                           rngs=rngs)


class T5FeedForward(nnx.Module):
    """wo(act(wi x)) (v1.0, "relu") or wo(act(wi_0 x) * wi_1 x) (v1.1, "gated-gelu")."""

    def __init__(self, d_model: int, d_ff: int, feed_forward_proj: str, dropout_rate: float, *,
                 dtype, param_dtype, rngs: nnx.Rngs):
        self.gated, act = parse_feed_forward_proj(feed_forward_proj)
        self.activation = T5_ACTIVATIONS[act]
        n_in = 2 if self.gated else 1
        self.wi = nnx.List([make_param(rngs, d_model ** -0.5, (d_model, d_ff), ("embed", "mlp"),
                                       param_dtype) for _ in range(n_in)])
        self.wo = make_param(rngs, d_ff ** -0.5, (d_ff, d_model), ("mlp", "embed"), param_dtype)
        self.dropout = nnx.Dropout(dropout_rate)
        self.dtype = dtype

    def __call__(self, x: jax.Array, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        """[b, t, m] -> [b, t, m]."""
        h = self.activation(x @ self.wi[0][...].astype(self.dtype))
        if self.gated:
            h = h * (x @ self.wi[1][...].astype(self.dtype))
        h = self.dropout(h, deterministic=deterministic, rngs=rngs)
        return h @ self.wo[...].astype(self.dtype)


class _Sublayers(nnx.Module):
    """The norms, attentions and feed-forward of one T5 layer, with cross-attention for the
    decoder; built in one order (self-attention, cross-attention, feed-forward) so that a seed
    gives the same weights in either stack."""

    def __init__(self, config, *, cross_attention: bool, rngs: nnx.Rngs):
        c = config
        kw = dict(dtype=c.dtype, param_dtype=c.param_dtype)

        def attention():
            return T5Attention(c.d_model, c.num_heads, c.d_kv, c.dropout_rate, **kw, rngs=rngs)

        self.self_attention_norm = RMSNorm(c.d_model, c.layer_norm_epsilon, **kw)
        self.self_attention = attention()
        if cross_attention:
            self.cross_attention_norm = RMSNorm(c.d_model, c.layer_norm_epsilon, **kw)
            self.cross_attention = attention()
        self.mlp_norm = RMSNorm(c.d_model, c.layer_norm_epsilon, **kw)
        self.mlp = T5FeedForward(c.d_model, c.d_ff, c.feed_forward_proj, c.dropout_rate, **kw,
                                 rngs=rngs)
        self.dropout = nnx.Dropout(c.dropout_rate)


class T5EncoderLayer(_Sublayers):
    """Pre-norm self-attention and feed-forward, each with a residual connection."""

    def __init__(self, config, *, rngs: nnx.Rngs):
        super().__init__(config, cross_attention=False, rngs=rngs)

    def __call__(self, x: jax.Array, bias: jax.Array, mask: jax.Array, *,
                 deterministic: bool = True, rngs: nnx.Rngs | None = None) -> jax.Array:
        """x [b, s, m], bias [1, h, s, s], mask [b, 1, 1, s] -> [b, s, m]."""
        kw = dict(deterministic=deterministic, rngs=rngs)
        h = self.self_attention_norm(x)
        x = x + self.dropout(self.self_attention(h, h, bias, mask, **kw), **kw)
        return x + self.dropout(self.mlp(self.mlp_norm(x), **kw), **kw)


class T5DecoderLayer(_Sublayers):
    """Causal self-attention, cross-attention over the encoder output, feed-forward."""

    def __init__(self, config, *, rngs: nnx.Rngs):
        super().__init__(config, cross_attention=True, rngs=rngs)

    def __call__(self, x: jax.Array, encoder_hidden: jax.Array, bias: jax.Array,
                 self_mask: jax.Array, cross_mask: jax.Array, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        """x [b, t, m], encoder_hidden [b, s, m], bias [1, h, t, t], self_mask [b, 1, t, t],
        cross_mask [b, 1, 1, s] -> [b, t, m]."""
        kw = dict(deterministic=deterministic, rngs=rngs)
        h = self.self_attention_norm(x)
        x = x + self.dropout(self.self_attention(h, h, bias, self_mask, **kw), **kw)
        h = self.cross_attention_norm(x)
        x = x + self.dropout(self.cross_attention(h, encoder_hidden, None, cross_mask, **kw), **kw)
        return x + self.dropout(self.mlp(self.mlp_norm(x), **kw), **kw)

    def step(self, x: jax.Array, bias: jax.Array, self_mask: jax.Array, cross_mask: jax.Array,
             cache_k: jax.Array, cache_v: jax.Array, cross_k: jax.Array, cross_v: jax.Array,
             position: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One decoding position with this layer's cache.

        x [b, 1, m]; bias [1, h, 1, L]; self_mask [1, 1, 1, L]; cross_mask [b, 1, 1, s];
        cache_k/cache_v [b, h, L, d] (this layer's own arrays: updated in place, read without a
        copy); cross_k/cross_v [b, h, s, d]; position: int scalar.
        Returns (x [b, 1, m], cache_k, cache_v) with `position` written.
        """
        h = self.self_attention_norm(x)
        k, v = self.self_attention.project_key_value(h)  # [b, h, 1, d]
        at = (0, 0, position, 0)
        cache_k = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype), at)
        cache_v = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype), at)
        q = self.self_attention.project_query(h)
        x = x + self.self_attention.attend(q, cache_k, cache_v, bias, self_mask)
        h = self.cross_attention_norm(x)
        q = self.cross_attention.project_query(h)
        x = x + self.cross_attention.attend(q, cross_k, cross_v, None, cross_mask)
        return x + self.mlp(self.mlp_norm(x)), cache_k, cache_v
