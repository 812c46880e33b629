"""Generation from a `T5`: encode once, then ONE `lax.while_loop` over `T5.decode_step` (state
`T5LoopState`) until every row has emitted EOS or `max_new_tokens` are out.

The model goes in as `nnx.split(model)`, its graph and settings static arguments of a module-level
jitted function, so calls of the same shapes and settings reuse one program (traced as "generate").
Shapes: b = batch, s = source length, n = max_new_tokens."""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from clarifyjax.core import traces
from clarifyjax.decoding.step import (
    Generation,
    choose_token,
    empty_outputs,
    record_step,
)
from clarifyjax.models.t5 import T5, DecodeCache
from clarifyjax.text.generator import Sampling


class T5LoopState(NamedTuple):
    """The carry of the T5 generation loop (b = batch, n = max_new_tokens)."""
    step: jax.Array       # int32 scalar: tokens chosen so far (= the next decoder position)
    done: jax.Array       # [b] bool: the row has emitted EOS
    last: jax.Array       # [b] int32: the token fed to the next decoder step
    cache: DecodeCache
    tokens: jax.Array     # [b, n] int32
    logprobs: jax.Array   # [b, n] float32
    mask: jax.Array       # [b, n] int32
    rng: jax.Array


def generate_t5(model: T5, input_ids: jax.Array, attention_mask: jax.Array, rng: jax.Array,
                settings: Sampling) -> Generation:
    """Sample continuations of input_ids [b, s] (attention_mask [b, s], int32 both, checked by
    `api.generate`) with `settings` -> `Generation` [b, n]."""
    graphdef, state = nnx.split(model)
    return _t5_loop(graphdef, state, input_ids, attention_mask, rng, settings=settings)


@functools.partial(jax.jit, static_argnames=("graphdef", "settings"))
def _t5_loop(graphdef, state, input_ids, attention_mask, rng, *,
             settings: Sampling) -> Generation:
    traces.note("generate")
    model: T5 = nnx.merge(graphdef, state)
    c = model.config
    b = input_ids.shape[0]
    cache = model.init_cache(model.encode(input_ids, attention_mask), attention_mask,
                             settings.max_new_tokens)

    def cond(s: T5LoopState):
        return (s.step < settings.max_new_tokens) & ~jnp.all(s.done)

    def body(s: T5LoopState) -> T5LoopState:
        logits, cache = model.decode_step(s.last, s.cache, s.step)
        token, token_logp, rng = choose_token(logits, s.step, s.rng, (c.eos_token_id,), settings)
        alive = ~s.done
        token = jnp.where(alive, token, c.pad_token_id).astype(jnp.int32)
        tokens, logprobs, mask = record_step(s.tokens, s.logprobs, s.mask, s.step, token,
                                             token_logp, alive)
        done = s.done | (token == c.eos_token_id)
        return T5LoopState(s.step + 1, done, token, cache, tokens, logprobs, mask, rng)

    start = T5LoopState(jnp.int32(0), jnp.zeros((b,), bool),
                        jnp.full((b,), c.decoder_start_token_id, jnp.int32), cache,
                        *empty_outputs(b, settings, c.pad_token_id), rng)
    end = jax.lax.while_loop(cond, body, start)
    return Generation(end.tokens, end.logprobs, end.mask)
