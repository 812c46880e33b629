"""Building blocks of the decoder-only `causal_lm.CausalLM` in Flax NNX: parameters, norms,
rotary positions, grouped-query attention, the feed-forward and one decoder layer (`Block`).

Every module takes the model's config `c` (a `causal_lm.CausalLMConfig`, not imported here so
that the model file imports this one and not the reverse). Shapes as in `causal_lm`: b = batch,
t = query length, s = key length, H = hidden, n = heads, k = key/value heads, d = head_dim,
F = feed-forward. Kernels are stored [in, out] (attention [H, n, d] and [n, d, H]).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

# Hugging Face `hidden_act` / `activation` names of the decoder families -> jax.
CAUSAL_LM_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}

# --------------------------------------------------------------------------- parameters


def normal_param(rngs: nnx.Rngs, std: float, shape: tuple[int, ...], names: tuple,
                 dtype) -> nnx.Param:
    """A normal(0, std) parameter annotated with logical axis `names` (eager sharding off)."""
    init = nnx.with_partitioning(nnx.initializers.normal(std), names, eager_sharding=False)
    return nnx.Param(init(rngs.params(), shape, dtype))


def constant_param(value: float, shape: tuple[int, ...], names: tuple, dtype) -> nnx.Param:
    init = nnx.with_partitioning(nnx.initializers.constant(value), names, eager_sharding=False)
    return nnx.Param(init(jax.random.key(0), shape, dtype))


class Norm(nnx.Module):
    """RMSNorm (scale only) or LayerNorm (scale and bias), computed in float32."""

    def __init__(self, size: int, kind: str, eps: float, names: tuple, *, dtype, param_dtype):
        self.scale = constant_param(1.0, (size,), names, param_dtype)
        if kind == "layer":
            self.bias = constant_param(0.0, (size,), names, param_dtype)
        self.kind, self.eps, self.dtype = kind, eps, dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        """[..., m] -> [..., m] in the compute dtype."""
        x = x.astype(jnp.float32)
        if self.kind == "layer":
            x = x - jnp.mean(x, axis=-1, keepdims=True)
        y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
        y = y * self.scale[...].astype(jnp.float32)
        if self.kind == "layer":
            y = y + self.bias[...].astype(jnp.float32)
        return y.astype(self.dtype)


# --------------------------------------------------------------------------- positions


def rope_frequencies(config) -> jax.Array:
    """[d/2] float32 inverse frequencies, scaled as transformers' `ROPE_INIT_FUNCTIONS` do."""
    c = config
    d = c.head_dim
    inv = 1.0 / (c.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    if c.rope_type == "linear":
        return inv / c.rope_factor
    if c.rope_type == "llama3":
        low_wavelen = c.rope_original_max_positions / c.rope_low_freq_factor
        high_wavelen = c.rope_original_max_positions / c.rope_high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = jnp.where(wavelen > low_wavelen, inv / c.rope_factor, inv)
        smooth = ((c.rope_original_max_positions / wavelen - c.rope_low_freq_factor)
                  / (c.rope_high_freq_factor - c.rope_low_freq_factor))
        smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return jnp.where(medium, smoothed, scaled)
    return inv


def rope_tables(config, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """positions [b, t] int -> (cos, sin) [b, t, 1, d] float32 (the halves repeated, as HF)."""
    freqs = positions.astype(jnp.float32)[..., None] * rope_frequencies(config)
    angles = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [b, t, heads, d] rotated by `rope_tables` (rotate_half convention), in float32."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """[b, t] (1 = token) -> [b, t] int32: the number of real tokens before each (pads: 0)."""
    mask = attention_mask.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0) * mask


# --------------------------------------------------------------------------- layers


class CausalAttention(nnx.Module):
    """Grouped-query attention (n query heads over k key/value heads)."""

    def __init__(self, c, *, rngs: nnx.Rngs):
        H, n, k, d = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        p = c.param_dtype
        self.query = normal_param(rngs, H ** -0.5, (H, n, d), ("embed", "heads", "kv"), p)
        self.key = normal_param(rngs, H ** -0.5, (H, k, d), ("embed", "heads", "kv"), p)
        self.value = normal_param(rngs, H ** -0.5, (H, k, d), ("embed", "heads", "kv"), p)
        self.out = normal_param(rngs, (n * d) ** -0.5, (n, d, H), ("heads", "kv", "embed"), p)
        if c.qkv_bias:
            self.query_bias = constant_param(0.0, (n, d), ("heads", "kv"), p)
            self.key_bias = constant_param(0.0, (k, d), ("heads", "kv"), p)
            self.value_bias = constant_param(0.0, (k, d), ("heads", "kv"), p)
        if c.out_bias:
            self.out_bias = constant_param(0.0, (H,), ("embed",), p)
        if c.qk_norm:
            self.query_norm = Norm(d, "rms", c.norm_eps, ("kv",), dtype=c.dtype, param_dtype=p)
            self.key_norm = Norm(d, "rms", c.norm_eps, ("kv",), dtype=c.dtype, param_dtype=p)
        self.config = c

    def _project(self, x: jax.Array, name: str) -> jax.Array:
        """[b, t, H] -> [b, t, heads, d] (+ bias)."""
        c = self.config
        kernel = getattr(self, name)[...].astype(c.dtype)
        b, t, _ = x.shape
        y = (x.reshape(b * t, -1) @ kernel.reshape(kernel.shape[0], -1)).reshape(
            b, t, *kernel.shape[1:])
        if c.qkv_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(c.dtype)
        return y

    def project(self, x: jax.Array, cos: jax.Array | None, sin: jax.Array | None):
        """x [b, t, H] -> q [b, t, n, d] (pre-scaled by d**-0.5), k, v [b, t, k, d]."""
        q, k, v = (self._project(x, name) for name in ("query", "key", "value"))
        if self.config.qk_norm:
            q, k = self.query_norm(q), self.key_norm(k)
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q * jnp.asarray(self.config.head_dim ** -0.5, q.dtype), k, v

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """q [b, t, n, d], k/v [b, k, s, d] (the cache's layout), mask [b, t, s] bool (True = may
        attend) -> [b, t, H]."""
        c = self.config
        b, t, n, d = q.shape
        groups = n // c.num_kv_heads
        q = q.reshape(b, t, c.num_kv_heads, groups, d)
        scores = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32)
        scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(c.dtype)
        context = jnp.einsum("bkgts,bksd->btkgd", weights, v).reshape(b * t, n * d)
        out = (context @ self.out[...].astype(c.dtype).reshape(n * d, -1)).reshape(b, t, -1)
        if c.out_bias:
            out = out + self.out_bias[...].astype(c.dtype)
        return out


class CausalFeedForward(nnx.Module):
    """down(act(x gate) * (x up)) when gated, else down(act(x up + b)) + b."""

    def __init__(self, c, *, rngs: nnx.Rngs):
        H, F, p = c.hidden_size, c.ffn_size, c.param_dtype
        if c.gated_mlp:
            self.gate = normal_param(rngs, H ** -0.5, (H, F), ("embed", "mlp"), p)
        self.up = normal_param(rngs, H ** -0.5, (H, F), ("embed", "mlp"), p)
        self.down = normal_param(rngs, F ** -0.5, (F, H), ("mlp", "embed"), p)
        if c.mlp_bias:
            if c.gated_mlp:
                self.gate_bias = constant_param(0.0, (F,), ("mlp",), p)
            self.up_bias = constant_param(0.0, (F,), ("mlp",), p)
            self.down_bias = constant_param(0.0, (H,), ("embed",), p)
        self.config = c

    def _linear(self, x: jax.Array, name: str) -> jax.Array:
        c = self.config
        y = x @ getattr(self, name)[...].astype(c.dtype)
        return y + getattr(self, f"{name}_bias")[...].astype(c.dtype) if c.mlp_bias else y

    def __call__(self, x: jax.Array) -> jax.Array:
        """[b, t, H] -> [b, t, H] (as one [b*t, H] matmul per projection)."""
        c = self.config
        b, t, H = x.shape
        x = x.reshape(b * t, H)
        act = CAUSAL_LM_ACTIVATIONS[c.activation]
        h = act(self._linear(x, "gate")) * self._linear(x, "up") if c.gated_mlp \
            else act(self._linear(x, "up"))
        return self._linear(h, "down").reshape(b, t, H)


class Block(nnx.Module):
    """One decoder layer: attention and feed-forward in the config's `block` arrangement."""

    def __init__(self, c, *, rngs: nnx.Rngs):
        kw = dict(dtype=c.dtype, param_dtype=c.param_dtype)
        self.attention_norm = Norm(c.hidden_size, c.norm, c.norm_eps, ("embed",), **kw)
        self.attention = CausalAttention(c, rngs=rngs)
        if c.block != "parallel" or c.parallel_norms == 2:
            self.mlp_norm = Norm(c.hidden_size, c.norm, c.norm_eps, ("embed",), **kw)
        self.mlp = CausalFeedForward(c, rngs=rngs)
        self.config = c

    def __call__(self, x: jax.Array, cos, sin, mask: jax.Array, cache_kv=None, slot=None,
                 kv_store=None):
        """x [b, t, H], cos/sin [b, t, 1, d] or None, mask [b, t, s] bool.

        Without `cache_kv`, attends over its own t positions (s = t) and returns (x, (k, v)),
        k/v [b, k, t, d]; with `cache_kv` = (keys, values) [b, k, L, d] (s = L), writes its k/v
        at `slot` first and returns (x, (keys, values)) updated. With `kv_store`, a function
        (k, v) [b, k, t, d] -> (keys, values to attend over [b, k, s, d], anything), the layer
        hands its new k/v to it (a cache laid out otherwise, `decoding.slots`) and returns
        (x, that anything).
        """
        c = self.config

        def attention(h):
            q, k, v = self.attention.project(h, cos, sin)
            # [b, k, s, d]: per (row, head) a contiguous [s, d] block, so that the attention
            # products read the cache in place (no per-step transpose of the whole cache)
            k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
            if kv_store is not None:
                k, v, stored = kv_store(k, v)
                return self.attention.attend(q, k, v, mask), stored
            if cache_kv is not None:
                at = (0, 0, slot, 0)
                k = jax.lax.dynamic_update_slice(cache_kv[0], k.astype(cache_kv[0].dtype), at)
                v = jax.lax.dynamic_update_slice(cache_kv[1], v.astype(cache_kv[1].dtype), at)
            return self.attention.attend(q, k, v, mask), (k, v)

        if c.block == "post_norm":
            a, kv = attention(x)
            x = self.attention_norm(x + a)
            return self.mlp_norm(x + self.mlp(x)), kv
        h = self.attention_norm(x)
        a, kv = attention(h)
        if c.block == "parallel":
            return x + a + self.mlp(self.mlp_norm(x) if c.parallel_norms == 2 else h), kv
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), kv


