"""Generation from a decoder-only `CausalLM`: prompts left-aligned and left-padded to a bucket length,
prefilled into a preallocated, bucketed cache, then ONE `lax.while_loop` over `decode_step`
(state `CausalLoopState`) until every row emits an EOS or a stop token. A stream of batches
compiles a handful of programs (traced as "generate_causal"); n tokens take n - 1 decoding steps,
the last chosen after the loop. A prefix every prompt shares (`prefix_ids`) runs once per batch.

Shapes: b = batch, s = prompt length, p = prefix length, n = max_new_tokens, V = vocab."""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from clarifyjax.core import buckets, traces
from clarifyjax.decoding.step import (
    Generation,
    choose_token,
    empty_outputs,
    record_step,
)
from clarifyjax.models.causal_lm import CausalLM, KVCache
from clarifyjax.text.generator import Sampling


class CausalLoopState(NamedTuple):
    """The carry of the causal generation loop (b = batch, n = max_new_tokens, V = vocab)."""
    step: jax.Array       # int32 scalar: tokens chosen so far
    done: jax.Array       # [b] bool: the row has emitted an EOS or stop token
    logits: jax.Array     # [b, V] float32: the model's logits for the next token
    cache: KVCache
    tokens: jax.Array     # [b, n] int32
    logprobs: jax.Array   # [b, n] float32
    mask: jax.Array       # [b, n] int32
    rng: jax.Array


def pad_left_to_bucket(ids: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Pad [b, s] on the left to the bucket length of s (mask 0), so prompt lengths repeat. The
    fine buckets: prefill is compute-bound, and a caller that bucketed its own way (LocalLM)
    keeps its width (powers of two padded its 96 columns to 128). Causal scoring pads its
    prompts the same way."""
    extra = buckets.bucket_length(ids.shape[1], buckets.FINE_BUCKETS) - ids.shape[1]
    if extra == 0:
        return ids, mask
    return jnp.pad(ids, ((0, 0), (extra, 0))), jnp.pad(mask, ((0, 0), (extra, 0)))


def generate_causal(model: CausalLM, input_ids: jax.Array, attention_mask: jax.Array,
                    rng: jax.Array, settings: Sampling, *, stop_token_ids: Sequence[int] = (),
                    prefix_ids: Sequence[int] | None = None) -> Generation:
    """Sample continuations of the prompts input_ids [b, s] (attention_mask [b, s], int32 both,
    checked by `api.generate`; left- or right-padded, every row >= 1 token) with `settings` ->
    `Generation` [b, n]. A row stops after any of `config.eos_token_ids` or `stop_token_ids`.
    With `prefix_ids`, row i's prompt is prefix_ids + its own tokens (at least one)."""
    c = model.config
    prefix = None if prefix_ids is None else _bucketed_prefix(prefix_ids, attention_mask)
    if c.positions == "learned":  # a learned table has no row past its end (take clamps)
        longest = int(jnp.max(jnp.sum(attention_mask, axis=1))) + settings.max_new_tokens
        longest += 0 if prefix_ids is None else len(prefix_ids)
        if longest > c.max_position_embeddings:
            raise ValueError(f"generate: prompt + max_new_tokens reach {longest} tokens, "
                             f"past the model's max_position_embeddings "
                             f"{c.max_position_embeddings}")
    input_ids, attention_mask = pad_left_to_bucket(input_ids, attention_mask)
    prompt_width = input_ids.shape[1] + (0 if prefix is None else prefix[0].shape[0])
    cache_length = buckets.bucket_length(prompt_width + settings.max_new_tokens)
    graphdef, state = nnx.split(model)
    return _causal_loop(graphdef, state, input_ids, attention_mask, rng, prefix,
                        settings=settings, cache_length=cache_length,
                        stop_ids=tuple(int(t) for t in stop_token_ids))


def _bucketed_prefix(prefix_ids: Sequence[int],
                     attention_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """prefix_ids, checked, padded on the left to its bucket -> (ids [p], mask [p]) int32."""
    prefix = jnp.asarray(prefix_ids, jnp.int32).reshape(-1)
    if prefix.shape[0] == 0:
        raise ValueError("generate: prefix_ids is empty (leave it out instead)")
    if bool(jnp.any(jnp.sum(attention_mask, axis=1) == 0)):
        raise ValueError("generate: with prefix_ids, every row needs at least one "
                         "token of its own after the prefix")
    ids, mask = pad_left_to_bucket(prefix[None], jnp.ones_like(prefix)[None])
    return ids[0], mask[0]


@functools.partial(jax.jit, static_argnames=("graphdef", "settings", "cache_length",
                                             "stop_ids"))
def _causal_loop(graphdef, state, input_ids, attention_mask, rng, prefix, *,
                 settings: Sampling, cache_length: int,
                 stop_ids: tuple[int, ...]) -> Generation:
    traces.note("generate_causal")
    model: CausalLM = nnx.merge(graphdef, state)
    c = model.config
    b = input_ids.shape[0]
    cache = model.init_cache(b, cache_length)
    if prefix is None:
        logits, cache = model.prefill(input_ids, attention_mask, cache)
    else:  # (prefix ids, prefix mask) [p]: one run of the shared prefix
        logits, cache = model.prefill_after_prefix(*prefix, input_ids, attention_mask, cache)
    ends = jnp.asarray(c.eos_token_ids + stop_ids or (-1,), jnp.int32)

    def cond(s: CausalLoopState):  # the last token is chosen after the loop, with no step
        return (s.step < settings.max_new_tokens - 1) & ~jnp.all(s.done)

    def choose(s: CausalLoopState) -> tuple[CausalLoopState, jax.Array]:
        """The token [b] of step `s.step` from `s.logits`, recorded; logits and cache as they
        were."""
        token, token_logp, rng = choose_token(s.logits, s.step, s.rng, c.eos_token_ids,
                                              settings)
        alive = ~s.done
        token = jnp.where(alive, token, c.pad_id).astype(jnp.int32)
        tokens, logprobs, mask = record_step(s.tokens, s.logprobs, s.mask, s.step, token,
                                             token_logp, alive)
        done = s.done | jnp.isin(token, ends)
        return CausalLoopState(s.step + 1, done, s.logits, s.cache, tokens, logprobs, mask,
                               rng), token

    def body(s: CausalLoopState) -> CausalLoopState:
        s, token = choose(s)
        logits, cache = model.decode_step(token, s.cache)
        return s._replace(logits=logits, cache=cache)

    start = CausalLoopState(jnp.int32(0), jnp.zeros((b,), bool), logits, cache,
                            *empty_outputs(b, settings, c.pad_id), rng)
    # after the loop: the step of the last token, or (every row done early) a step whose
    # column stays padding
    end, _ = choose(jax.lax.while_loop(cond, body, start))
    return Generation(end.tokens, end.logprobs, end.mask)
