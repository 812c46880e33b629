"""What the T5 and the causal-LM generation loops share: their output (`Generation`) and one
step's work: `choose_token` (the token and its log-prob under the distribution it was drawn
from, as the loop's static `Sampling` says) and `record_step` (write that column of the output).

PPO needs the log-probability of each sampled token under the distribution it was drawn from
(after temperature, top-k, top-p); at temperature 1 with no truncation that equals `score`.

Shapes: b = batch, n = max_new_tokens, V = vocab.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from clarifyjax.decoding.sampling import draw_categorical, filter_logits
from clarifyjax.text.generator import Sampling


class Generation(NamedTuple):
    """tokens [b, n] int32 (pad after EOS); logprobs [b, n] float32 (0 where mask is 0);
    mask [b, n] int32: 1 up to and including the EOS."""
    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array


def choose_token(logits: jax.Array, step: jax.Array, rng: jax.Array, eos_ids: Sequence[int],
                 settings: Sampling) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decoding step's choice: logits [b, V] -> (token [b] int32, its log-prob [b] under
    the distribution it was drawn from, rng). EOS ids are impossible before `min_new_tokens`.
    Greedy: the argmax, log-probs under the model's own (temperature 1) distribution, rng
    unused. Sampling: one key split off rng per step."""
    if settings.min_new_tokens > 0:
        vocab = jnp.arange(logits.shape[-1])
        is_eos = jnp.isin(vocab, jnp.asarray(eos_ids, jnp.int32))
        logits = jnp.where(is_eos & (step < settings.min_new_tokens), -jnp.inf, logits)
    if settings.greedy:
        token = jnp.argmax(logits, axis=-1)
        log_total = jax.nn.logsumexp(logits, axis=-1)
    else:
        rng, key = jax.random.split(rng)
        logits = filter_logits(logits, temperature=settings.temperature, top_k=settings.top_k,
                               top_p=settings.top_p)
        uniform = jax.random.uniform(key, (logits.shape[0], 1), jnp.float32)
        token, log_total = draw_categorical(uniform, logits)  # as `sample_categorical(key, .)`
    # log_softmax at the chosen token only: no [b, V] array written per step
    token_logp = jnp.take_along_axis(logits, token[:, None], axis=-1)[:, 0] - log_total
    return token.astype(jnp.int32), token_logp, rng


def record_step(tokens: jax.Array, logprobs: jax.Array, mask: jax.Array, step: jax.Array,
                token: jax.Array, token_logp: jax.Array,
                alive: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Write one step's column into the [b, n] outputs: token [b], its log-prob [b] (0 where the
    row is no longer alive), and alive [b] bool as the mask."""
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, step))
    logprobs = jax.lax.dynamic_update_slice(
        logprobs, jnp.where(alive, token_logp, 0.0)[:, None], (0, step))
    mask = jax.lax.dynamic_update_slice(mask, alive.astype(jnp.int32)[:, None], (0, step))
    return tokens, logprobs, mask


def empty_outputs(batch: int, settings: Sampling,
                  pad_id: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The [b, n] outputs before the first step: tokens all `pad_id`, logprobs 0, mask 0."""
    n = settings.max_new_tokens
    return (jnp.full((batch, n), pad_id, jnp.int32), jnp.zeros((batch, n), jnp.float32),
            jnp.zeros((batch, n), jnp.int32))
