"""Teacher-forced scoring of given targets, one jitted program per family: `score_t5` (encoder
input, decoder targets) and `score_causal` (prompts, then their continuations in one forward).
`api.score` checks the arguments and picks one. Both return log p(target_ids[:, i] | input,
targets before i): [b, t] float32, 0 where target_mask is 0, and with `greedy=True` also whether
each target token is the argmax there ([b, t] bool, True where target_mask is 0).

Shapes: b = batch, s = source / prompt length, t = target length.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from clarifyjax.core import buckets, traces
from clarifyjax.decoding.causal_loop import pad_left_to_bucket
from clarifyjax.models.causal_lm import CausalLM, left_align
from clarifyjax.models.t5 import T5, shift_right


def score_t5(model: T5, input_ids: jax.Array, attention_mask: jax.Array, target_ids: jax.Array,
             target_mask: jax.Array, *, greedy: bool = False):
    """[b, s] encoder input and [b, t] targets, int32 -> [b, t] float32 log-probs (and, with
    `greedy`, [b, t] bool: the target is the argmax)."""
    graphdef, state = nnx.split(model)
    logp, argmax = _score_t5(graphdef, state, input_ids, attention_mask, target_ids, target_mask)
    return (logp, argmax) if greedy else logp


def score_causal(model: CausalLM, prompt_ids: jax.Array, prompt_mask: jax.Array,
                 target_ids: jax.Array, target_mask: jax.Array, *, greedy: bool = False):
    """[b, s] prompts (left- or right-padded, every row >= 1 token) and [b, t] continuations
    (right-padded), int32 -> [b, t] float32 log-probs (and, with `greedy`, [b, t] bool: the
    target is the argmax). Both widths are padded to buckets, so a stream of batches compiles a
    handful of programs. The last target is never an input: s + t - 1 positions are run."""
    t = target_ids.shape[1]
    prompt_ids, prompt_mask = pad_left_to_bucket(prompt_ids, prompt_mask)
    extra = buckets.bucket_length(t) - t
    target_ids, target_mask = (jnp.pad(a, ((0, 0), (0, extra))) for a in (target_ids, target_mask))
    graphdef, state = nnx.split(model)
    logp, argmax = _score_causal(graphdef, state, prompt_ids, prompt_mask, target_ids, target_mask)
    return (logp[:, :t], argmax[:, :t]) if greedy else logp[:, :t]


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _score_t5(graphdef, state, input_ids, attention_mask, target_ids, target_mask) -> jax.Array:
    traces.note("score")
    model: T5 = nnx.merge(graphdef, state)
    start = model.config.decoder_start_token_id
    decoder_input_ids = shift_right(target_ids, start)
    decoder_mask = shift_right(target_mask, 1)  # the start position is always visible
    logits = model(input_ids, attention_mask, decoder_input_ids, decoder_mask)
    return _target_logp(logits, target_ids, target_mask)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _score_causal(graphdef, state, prompt_ids, prompt_mask, target_ids, target_mask):
    traces.note("score_causal")
    model: CausalLM = nnx.merge(graphdef, state)
    ids, mask = left_align(prompt_ids, prompt_mask)
    P = ids.shape[1]
    # The last target predicts nothing: the sequence run is the prompt and all targets but it.
    hidden, _ = model.hidden_states(jnp.concatenate([ids, target_ids[:, :-1]], axis=1),
                                    jnp.concatenate([mask, target_mask[:, :-1]], axis=1))
    return _target_logp(model.logits(hidden[:, P - 1:]), target_ids, target_mask)


def score_causal_after_prefixes(model: CausalLM, prefix_ids: jax.Array, prefix_mask: jax.Array,
                                row_prefix: jax.Array, input_ids: jax.Array, input_mask: jax.Array,
                                target_ids: jax.Array, target_mask: jax.Array):
    """Rows that continue one of D prefixes [D, p] (row i: prefix row_prefix[i], then its own
    tokens input_ids[i] [t]); target_ids[i, j] is the token after input j, scored where
    target_mask is 1 -> ([b, t] float32 log-probs, [b, t] bool argmax). Each prefix runs once
    for all its rows (`CausalLM.hidden_after_prefixes`)."""
    graphdef, state = nnx.split(model)
    return _score_after_prefixes(graphdef, state, prefix_ids, prefix_mask, row_prefix, input_ids,
                                 input_mask, target_ids, target_mask)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _score_after_prefixes(graphdef, state, prefix_ids, prefix_mask, row_prefix, input_ids,
                          input_mask, target_ids, target_mask):
    traces.note("score_after_prefixes")
    model: CausalLM = nnx.merge(graphdef, state)
    hidden = model.hidden_after_prefixes(prefix_ids, prefix_mask, row_prefix, input_ids,
                                         input_mask)
    return _target_logp(model.logits(hidden), target_ids, target_mask)


def _target_logp(logits, target_ids, target_mask) -> tuple[jax.Array, jax.Array]:
    """([b, t] log-probs of the targets, 0 at padding; [b, t] target == argmax, True at padding)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    token_logp = jnp.take_along_axis(logp, target_ids[..., None], axis=-1)[..., 0]
    kept = target_mask.astype(bool)
    return (jnp.where(kept, token_logp, 0.0),
            ~kept | (jnp.argmax(logits, axis=-1) == target_ids))
