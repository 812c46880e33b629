"""Decoder-only language models in Flax NNX: one decoder for Llama (1/2/3, Vicuna), Mistral, Qwen2,
Qwen3, OPT and Falcon, driven by a frozen `CausalLMConfig` (switches listed above it; read from
a Hugging Face config.json by `causal_lm_map.config_from_hf`), with a preallocated KV cache.
Its layers are in `causal_lm_layers`. Positions come from the attention mask, so a left- or
right-padded batch gives every row the logits it would have alone.

Shapes: b = batch, t = query length, s = key length, H = hidden, E = embedding width, n = heads,
k = key/value heads, g = n / k, d = head_dim, F = feed-forward, V = vocab, L = cache length."""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import numpy as np
import jax.numpy as jnp
from flax import nnx

from clarifyjax.models.causal_lm_layers import (CAUSAL_LM_ACTIVATIONS, Block, Norm,
                                                normal_param, positions_from_mask, rope_tables)
from clarifyjax.models.state import set_dtype_fields

NORMS = ("rms", "layer")
POSITIONS = ("rope", "learned")
BLOCKS = ("sequential", "post_norm", "parallel")
ROPE_TYPES = ("default", "linear", "llama3")


# The families differ only in switches of this config:
#   * norm "rms" (Llama family) or "layer" (OPT, Falcon: with a bias);
#   * positions "rope" (sin/cos in float32, optional `llama3` / `linear` frequency scaling) or
#     "learned" (OPT: a table indexed by position + 2);
#   * feed-forward gated (silu(x W_gate) * x W_up) or plain (act(x W_up + b));
#   * block "sequential" (x += attn(norm(x)); x += mlp(norm(x))), "post_norm" (OPT-350m:
#     x = norm(x + attn(x)); x = norm(x + mlp(x))) or "parallel" (Falcon: x += attn(n1(x)) +
#     mlp(n2(x)), n2 = n1 when the layer has one norm);
#   * q/k RMSNorm before RoPE (Qwen3), q/k/v and output biases, a sliding window (Mistral),
#     projections between the embedding width and the hidden width (OPT project_in/project_out),
#     a final norm or none, tied or separate output embedding.
# Kernels are stored [in, out] (attention [H, n, d] and [n, d, H]) so that every projection is one
# [b*t, in] x [in, out] matmul.
@dataclasses.dataclass(frozen=True)
class CausalLMConfig:
    """Every switch of the decoder; `causal_lm_map.config_from_hf` fills it from config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    embed_size: int | None = None          # None: hidden_size (OPT's word_embed_proj_dim)
    norm: str = "rms"
    norm_eps: float = 1e-6
    activation: str = "silu"
    gated_mlp: bool = True
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    positions: str = "rope"
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    sliding_window: int | None = None
    block: str = "sequential"
    parallel_norms: int = 1                # "parallel" blocks: 1 shared norm or 2 (attn, mlp)
    final_norm: bool = True
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    dtype: str = "float32"                 # compute dtype
    param_dtype: str = "float32"           # storage dtype

    def __post_init__(self):
        set_dtype_fields(self, "causal LM")
        if self.embed_size is None:
            object.__setattr__(self, "embed_size", self.hidden_size)
        object.__setattr__(self, "eos_token_ids", tuple(int(e) for e in self.eos_token_ids))
        for field, allowed in (("norm", NORMS), ("positions", POSITIONS), ("block", BLOCKS),
                               ("rope_type", ROPE_TYPES),
                               ("activation", tuple(CAUSAL_LM_ACTIVATIONS))):
            if getattr(self, field) not in allowed:
                raise ValueError(f"causal LM config field {field!r} is {getattr(self, field)!r}; "
                                 f"allowed values: {', '.join(allowed)}")
        for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                      "head_dim", "ffn_size", "embed_size", "max_position_embeddings"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"causal LM config field {field!r} must be >= 1, "
                                 f"got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"causal LM config: num_heads {self.num_heads} is not a multiple of "
                             f"num_kv_heads {self.num_kv_heads}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"causal LM config field 'sliding_window' must be >= 1, "
                             f"got {self.sliding_window}")
        self._check_rope()
        if self.parallel_norms not in (1, 2):
            raise ValueError(f"causal LM config field 'parallel_norms' must be 1 or 2, "
                             f"got {self.parallel_norms}")

    def _check_rope(self) -> None:
        """The rotary settings a "rope" model reads: each a finite number in its range (a theta
        of 0 or a scaling factor of 0 would make every rotary angle NaN or infinite)."""
        if self.positions != "rope":
            return
        ranges = {"rope_theta": (0, False)}
        if self.rope_type in ("linear", "llama3"):
            ranges["rope_factor"] = (1, True)
        if self.rope_type == "llama3":
            ranges.update(rope_low_freq_factor=(0, False), rope_high_freq_factor=(0, False),
                          rope_original_max_positions=(1, True))
        for field, (low, closed) in ranges.items():
            value = getattr(self, field)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and (value >= low if closed else value > low)):
                raise ValueError(f"causal LM config field {field!r} must be a finite number "
                                 f"{'>=' if closed else '>'} {low}, got {value!r}")
        if self.rope_type == "llama3" and self.rope_high_freq_factor <= self.rope_low_freq_factor:
            raise ValueError("causal LM config: rope_high_freq_factor must be greater than "
                             "rope_low_freq_factor")

    @property
    def pad_id(self) -> int:
        """The id written after a row's end: pad, else the first EOS, else 0 (as transformers)."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        return self.eos_token_ids[0] if self.eos_token_ids else 0


# --------------------------------------------------------------------------- the model


class KVCache(NamedTuple):
    """Decoding state, plain arrays (threads through `lax.while_loop`).

    keys, values: per layer, [b, k, L, d], preallocated; written with dynamic_update_slice.
      One array per layer: XLA:CPU copies a layer's slice out of a stacked cache every step.
    start: [b] int32, the first valid slot of each row's own tokens (prompts are stored
      left-aligned to the prompt length P, so the pad slots of a row come first).
    positions: [b] int32, the position of each row's next token (its number of tokens so far).
    index: int32 scalar, the slot the next token is written to (the same for every row).
    prefix_start, prefix_end: int32 scalars, the slots [prefix_start, prefix_end) of a prefix
      that every row shares (`prefill_after_prefix`), at positions 0.. before each row's own
      tokens; both 0 without one.
    """
    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    start: jax.Array
    positions: jax.Array
    index: jax.Array
    prefix_start: jax.Array = np.int32(0)
    prefix_end: jax.Array = np.int32(0)


def left_align(input_ids: jax.Array, attention_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Move each row's tokens to the end of the row (left padding), keeping their order: works
    for left-, right- or any padding. [b, t] -> ([b, t], [b, t])."""
    mask = attention_mask.astype(jnp.int32)
    order = jnp.argsort(mask, axis=-1, stable=True)  # pads (0) first, tokens in order
    return (jnp.take_along_axis(input_ids, order, axis=-1),
            jnp.take_along_axis(mask, order, axis=-1))


class CausalLM(nnx.Module):
    """A decoder-only LM: `model(input_ids, attention_mask)` -> logits [b, t, V] float32."""

    def __init__(self, config: CausalLMConfig, *, rngs: nnx.Rngs):
        c = self.config = config
        p = c.param_dtype
        self.embedding = normal_param(rngs, 1.0, (c.vocab_size, c.embed_size),
                                      ("vocab", "embed"), p)
        if c.positions == "learned":  # OPT: rows 0, 1 unused by real tokens (offset 2)
            self.position_embedding = normal_param(
                rngs, 0.02, (c.max_position_embeddings + 2, c.hidden_size), ("length", "embed"), p)
        if c.embed_size != c.hidden_size:
            self.project_in = normal_param(rngs, c.embed_size ** -0.5,
                                           (c.embed_size, c.hidden_size), ("embed", "mlp"), p)
            self.project_out = normal_param(rngs, c.hidden_size ** -0.5,
                                            (c.hidden_size, c.embed_size), ("mlp", "embed"), p)
        self.layers = nnx.List([Block(c, rngs=rngs) for _ in range(c.num_layers)])
        if c.final_norm:
            self.final_norm = Norm(c.hidden_size, c.norm, c.norm_eps, ("embed",), dtype=c.dtype,
                                   param_dtype=p)
        if not c.tie_word_embeddings:
            self.lm_head = normal_param(rngs, c.embed_size ** -0.5,
                                        (c.embed_size, c.vocab_size), ("embed", "vocab"), p)

    # -- pieces -------------------------------------------------------------------------------
    def embed(self, ids: jax.Array, positions: jax.Array) -> jax.Array:
        """ids, positions [b, t] -> [b, t, H] in the compute dtype."""
        c = self.config
        x = jnp.take(self.embedding[...], ids, axis=0).astype(c.dtype)
        if c.embed_size != c.hidden_size:
            x = x @ self.project_in[...].astype(c.dtype)
        if c.positions == "learned":
            x = x + jnp.take(self.position_embedding[...], positions + 2, axis=0).astype(c.dtype)
        return x

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Last layer's output [..., H] -> logits [..., V] float32 (final norm, projection)."""
        c = self.config
        if c.final_norm:
            hidden = self.final_norm(hidden)
        if c.embed_size != c.hidden_size:
            hidden = hidden @ self.project_out[...].astype(c.dtype)
        if c.tie_word_embeddings:
            return jnp.einsum("...e,ve->...v", hidden, self.embedding[...].astype(c.dtype),
                              preferred_element_type=jnp.float32)
        return jnp.einsum("...e,ev->...v", hidden, self.lm_head[...].astype(c.dtype),
                          preferred_element_type=jnp.float32)

    def _rope(self, positions: jax.Array):
        return rope_tables(self.config, positions) if self.config.positions == "rope" \
            else (None, None)

    def _window(self, mask: jax.Array, query_pos: jax.Array, key_pos: jax.Array) -> jax.Array:
        """Restrict mask [b, t, s] to keys less than sliding_window positions back."""
        w = self.config.sliding_window
        if w is None:
            return mask
        return mask & (query_pos[:, :, None] - key_pos[:, None, :] < w)

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array):
        """input_ids, attention_mask [b, t] -> (last layer's output [b, t, H],
        per layer (k, v) [b, t, k, d])."""
        t = input_ids.shape[1]
        valid = attention_mask.astype(bool)
        positions = positions_from_mask(attention_mask)
        causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
        mask = self._window(causal[None] & valid[:, None, :], positions, positions)
        cos, sin = self._rope(positions)
        x = self.embed(input_ids, positions)
        kvs = []
        for layer in self.layers:
            x, kv = layer(x, cos, sin, mask)
            kvs.append(kv)
        return x, kvs

    # -- public API ----------------------------------------------------------------------------
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """input_ids [b, t] int, attention_mask [b, t] (1 = token, padding on either side)
        -> logits [b, t, V] float32 (rows at pad positions are meaningless)."""
        return self.logits(self.hidden_states(input_ids, attention_mask)[0])

    def init_cache(self, batch: int, max_length: int) -> KVCache:
        """An empty cache of `max_length` slots for `batch` rows."""
        c = self.config
        shape = (int(batch), c.num_kv_heads, int(max_length), c.head_dim)
        zeros = tuple(jnp.zeros(shape, c.dtype) for _ in range(c.num_layers))
        return KVCache(zeros, tuple(jnp.zeros(shape, c.dtype) for _ in range(c.num_layers)),
                       jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32),
                       jnp.int32(0))

    def prefill(self, input_ids: jax.Array, attention_mask: jax.Array,
                cache: KVCache) -> tuple[jax.Array, KVCache]:
        """Run the prompts input_ids [b, P] (any padding, every row >= 1 token) into an empty
        `cache` of L >= P slots -> (logits of each row's last token [b, V] float32, cache)."""
        ids, mask = left_align(input_ids, attention_mask)
        hidden, kvs = self.hidden_states(ids, mask)
        P = ids.shape[1]
        keys = tuple(jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, 0, 0, 0))
                     for ck, (k, _) in zip(cache.keys, kvs))
        values = tuple(jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, 0, 0, 0))
                       for cv, (_, v) in zip(cache.values, kvs))
        lengths = jnp.sum(mask, axis=-1).astype(jnp.int32)
        cache = KVCache(keys, values, (P - lengths).astype(jnp.int32), lengths, jnp.int32(P))
        return self.logits(hidden[:, -1]), cache

    def prefill_after_prefix(self, prefix_ids: jax.Array, prefix_mask: jax.Array,
                             input_ids: jax.Array, attention_mask: jax.Array,
                             cache: KVCache) -> tuple[jax.Array, KVCache]:
        """`prefill` of the prompts prefix + input_ids[i] for a prefix that every row shares:
        the prefix [p] (prefix_mask [p], any padding) runs once, not once per row, and each
        row's own tokens [b, t] (any padding, every row >= 1 token) attend to its keys. The
        cache holds the prefix in slots [0, p) (its pads first) and each row's own tokens at the
        end of slots [p, p + t); `decode_step` reads both ranges (`KVCache.prefix_start/end`).

        A long shared prompt (a few-shot template) costs one prefix run plus b * t rows, where
        `prefill` costs b * (p + t) rows and attention over (p + t)^2 per row.
        """
        p_ids, p_mask = left_align(prefix_ids[None], prefix_mask[None])
        _, prefix_kvs = self.hidden_states(p_ids, p_mask)             # per layer [1, k, p, d]
        ids, mask = left_align(input_ids, attention_mask)
        b, t = ids.shape
        p = p_ids.shape[1]
        p_len = jnp.sum(p_mask).astype(jnp.int32)
        valid = mask.astype(bool)
        positions = (positions_from_mask(mask) + p_len) * mask            # [b, t]
        key_pos = jnp.concatenate([jnp.broadcast_to(positions_from_mask(p_mask), (b, p)),
                                   positions], axis=1)                    # [b, p + t]
        causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
        attend = jnp.concatenate(
            [jnp.broadcast_to(p_mask.astype(bool)[:, None, :], (b, t, p)),
             causal[None] & valid[:, None, :]], axis=-1)                   # [b, t, p + t]
        attend = self._window(attend, positions, key_pos)
        cos, sin = self._rope(positions)
        x = self.embed(ids, positions)
        keys, values = [], []
        for layer, (pk, pv), ck, cv in zip(self.layers, prefix_kvs, cache.keys, cache.values):
            # slots [0, p + t): every row's prefix keys are the shared ones; the layer writes the
            # row's own keys at slot p and attends over them all
            shape = (b, pk.shape[1], p + t, pk.shape[3])
            first = (jnp.zeros(shape, ck.dtype).at[:, :, :p].set(pk.astype(ck.dtype)),
                     jnp.zeros(shape, cv.dtype).at[:, :, :p].set(pv.astype(cv.dtype)))
            x, (k, v) = layer(x, cos, sin, attend, first, p)
            keys.append(jax.lax.dynamic_update_slice(ck, k, (0, 0, 0, 0)))
            values.append(jax.lax.dynamic_update_slice(cv, v, (0, 0, 0, 0)))
        own = jnp.sum(mask, axis=-1).astype(jnp.int32)
        cache = KVCache(tuple(keys), tuple(values), (p + t - own).astype(jnp.int32), own + p_len,
                        jnp.int32(p + t), (p - p_len).astype(jnp.int32), jnp.int32(p))
        return self.logits(x[:, -1]), cache

    def hidden_after_prefixes(self, prefix_ids: jax.Array, prefix_mask: jax.Array,
                              row_prefix: jax.Array, input_ids: jax.Array,
                              attention_mask: jax.Array) -> jax.Array:
        """Last layer's output [b, t, H] of rows that continue one of several prefixes: each
        prefix [D, p] (prefix_mask, any padding, every row >= 1 token) runs once, and row i's own
        tokens input_ids[i] (attention_mask [b, t], padded without gaps, >= 1 token) attend to
        prefix row_prefix[i]'s keys and to their own, as `prefill_after_prefix` with one prefix.
        The choices of a multiple-choice question share its context this way."""
        p_ids, p_mask = left_align(prefix_ids, prefix_mask)
        _, prefix_kvs = self.hidden_states(p_ids, p_mask)             # per layer [D, k, p, d]
        b, t = input_ids.shape
        p = p_ids.shape[1]
        row_mask = p_mask[row_prefix]                                   # [b, p]
        p_len = jnp.sum(row_mask, axis=-1).astype(jnp.int32)
        valid = attention_mask.astype(bool)
        positions = (positions_from_mask(attention_mask) + p_len[:, None]) * attention_mask
        key_pos = jnp.concatenate([positions_from_mask(row_mask), positions], axis=1)
        causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
        attend = jnp.concatenate([jnp.broadcast_to(row_mask.astype(bool)[:, None, :], (b, t, p)),
                                  causal[None] & valid[:, None, :]], axis=-1)  # [b, t, p + t]
        attend = self._window(attend, positions, key_pos)
        cos, sin = self._rope(positions)
        x = self.embed(input_ids, positions)
        for layer, (pk, pv) in zip(self.layers, prefix_kvs):
            shape = (b, pk.shape[1], p + t, pk.shape[3])
            first = (jnp.zeros(shape, pk.dtype).at[:, :, :p].set(pk[row_prefix]),
                     jnp.zeros(shape, pv.dtype).at[:, :, :p].set(pv[row_prefix]))
            x, _ = layer(x, cos, sin, attend, first, p)
        return x

    def decode_step(self, token_ids: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """Feed token_ids [b] at slot `cache.index` -> (logits [b, V] float32, cache advanced)."""
        L = cache.keys[0].shape[2]
        slots = jnp.arange(L)[None, :]
        positions = cache.positions[:, None]                                   # [b, 1]
        in_prefix = (slots >= cache.prefix_start) & (slots < cache.prefix_end)  # [1, L]
        key_pos = jnp.where(slots < cache.prefix_end, slots - cache.prefix_start,
                            slots - cache.start[:, None]
                            + (cache.prefix_end - cache.prefix_start))        # [b, L]
        mask = (in_prefix | ((slots >= cache.start[:, None])
                             & (slots <= cache.index)))[:, None, :]            # [b, 1, L]
        mask = self._window(mask, positions, key_pos)
        cos, sin = self._rope(positions)
        x = self.embed(token_ids[:, None], positions)
        keys, values = [], []
        for layer, k, v in zip(self.layers, cache.keys, cache.values):
            x, (k, v) = layer(x, cos, sin, mask, (k, v), cache.index)
            keys.append(k)
            values.append(v)
        cache = KVCache(tuple(keys), tuple(values), cache.start, cache.positions + 1,
                        cache.index + 1, cache.prefix_start, cache.prefix_end)
        return self.logits(x[:, 0]), cache
