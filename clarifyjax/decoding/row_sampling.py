"""Sampling with settings per row: temperature, top-k, top-p, min_new_tokens and the seed are
arrays (`RowSampling`), not static arguments, so that rows with different settings share one
jitted program and a new setting compiles nothing (`decoding.slots` runs every request of a
server in one batch this way).

`choose_rows` is `step.choose_token` for such rows: a greedy row takes the argmax and the
log-prob of the model's own distribution; a sampled row draws from its filtered logits
(`filter_rows`: temperature, then top-k, then top-p, each row as `filters.filter_logits` would
with its own settings) with one uniform from its own key, `fold_in(key(seed), step)`, so that a
row's samples depend on its seed and step only, never on the other rows of the batch.

Shapes: b = batch, V = vocab.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from clarifyjax.decoding.filters import (LARGEST_TEMPERATURE, SMALLEST_TEMPERATURE,
                                         draw_categorical, kth_largest_by_bisection,
                                         top_k_values, top_p_threshold_searched)

TOP_K_CANDIDATES = 64  # a row's top-k up to this comes from `top_k_values`; above, bisection


class RowSampling(NamedTuple):
    """The sampling settings of each row, [b] arrays."""
    greedy: jax.Array       # bool
    temperature: jax.Array  # float32 > 0 (1 for greedy rows)
    top_k: jax.Array        # int32, 0 = off
    top_p: jax.Array        # float32 in (0, 1], 1 = off
    min_new: jax.Array      # int32: no EOS before this many tokens
    seed: jax.Array         # uint32: the row's key is key(seed), its step t's fold_in(key, t)


def scale_rows(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """`filters.scale_by_temperature` with a temperature per row [b]: [b, V] -> [b, V] float32
    (rows at temperature 1 unchanged)."""
    logits = logits.astype(jnp.float32)
    top = jnp.max(logits, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    scale = jnp.clip(temperature.astype(jnp.float32), SMALLEST_TEMPERATURE,
                     LARGEST_TEMPERATURE)[:, None]
    return jnp.where(temperature[:, None] == 1.0, logits, (logits - top) / scale)


def _top_k_rows(logits: jax.Array, k: jax.Array) -> jax.Array:
    """Each row's top-k ([b] int32, 0 = off) applied: -inf below its k-th largest (ties kept)."""
    n = min(TOP_K_CANDIDATES, logits.shape[-1])
    values = top_k_values(logits, n)
    kth = jnp.take_along_axis(values, jnp.clip(k, 1, n)[:, None] - 1, axis=-1)
    large = (k > n)[:, None]
    kth = jax.lax.cond(jnp.any(large),
                       lambda: jnp.where(large, kth_largest_by_bisection(logits, k[:, None]),
                                         kth),
                       lambda: kth)
    kth = jnp.where(k[:, None] > 0, kth, -jnp.inf)
    return jnp.where(logits < kth, -jnp.inf, logits)


def _top_p_rows(logits: jax.Array, top_p: jax.Array) -> jax.Array:
    """Each row's top-p ([b] float32, 1 = off) applied (`top_p_threshold_searched`: the CPU
    kernel, or the TOP_P_CANDIDATES most likely tokens first and a bisection where those do not
    cover it)."""
    off = top_p >= 1.0
    threshold = top_p_threshold_searched(logits, top_p[:, None], settled=off[:, None])
    threshold = jnp.where(off[:, None], -jnp.inf, threshold)
    return jnp.where(logits < threshold, -jnp.inf, logits)


def filter_rows(logits: jax.Array, settings: RowSampling) -> jax.Array:
    """The logits each row samples from: [b, V] -> [b, V] float32, -inf outside its support.
    Top-k and top-p run only when some row asks for them."""
    logits = scale_rows(logits, settings.temperature)
    logits = jax.lax.cond(jnp.any(settings.top_k > 0),
                          lambda: _top_k_rows(logits, settings.top_k), lambda: logits)
    return jax.lax.cond(jnp.any(settings.top_p < 1.0),
                        lambda: _top_p_rows(logits, settings.top_p), lambda: logits)


def row_uniforms(seed: jax.Array, step: jax.Array) -> jax.Array:
    """One uniform in [0, 1) per row from fold_in(key(seed), step): [b], [b] -> [b, 1]."""
    def one(s, t):
        return jax.random.uniform(jax.random.fold_in(jax.random.key(s), t), (1,), jnp.float32)
    return jax.vmap(one)(seed, step)


def choose_rows(logits: jax.Array, settings: RowSampling, step: jax.Array,
                eos_ids: Sequence[int]) -> tuple[jax.Array, jax.Array]:
    """Each row's token from its logits [b, V] at its own step [b] (tokens it has chosen so
    far) -> (token [b] int32, its log-prob [b] under the distribution it was drawn from). EOS
    ids are impossible before each row's `min_new`. A batch of greedy rows skips the filters."""
    logits = logits.astype(jnp.float32)
    if eos_ids:
        is_eos = jnp.isin(jnp.arange(logits.shape[-1]), jnp.asarray(eos_ids, jnp.int32))
        logits = jnp.where(is_eos[None] & (step < settings.min_new)[:, None], -jnp.inf, logits)
    argmax = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def at(x, token):
        return jnp.take_along_axis(x, token[:, None], axis=-1)[:, 0]

    def greedy():
        return argmax, at(logits, argmax) - jax.nn.logsumexp(logits, axis=-1)

    def sampled():
        filtered = filter_rows(logits, settings)
        token, log_total = draw_categorical(row_uniforms(settings.seed, step), filtered)
        greedy_token, greedy_logp = greedy()
        return (jnp.where(settings.greedy, greedy_token, token.astype(jnp.int32)),
                jnp.where(settings.greedy, greedy_logp, at(filtered, token) - log_total))

    return jax.lax.cond(jnp.all(settings.greedy), greedy, sampled)
