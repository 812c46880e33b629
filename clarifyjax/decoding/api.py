"""The decoding entry points: `generate` (jitted sampling with a KV cache) and `score`
(teacher-forced log-probs of given targets), for a `T5` or a decoder-only `CausalLM`.

Each checks its arguments and hands them to exactly one function of the model's family:

    generate: T5 -> t5_loop.generate_t5        CausalLM -> causal_loop.generate_causal
    score:    T5 -> scoring.score_t5           CausalLM -> scoring.score_causal

The loops, the per-step choice they share (`step`) and the logit filters (`filters`) live in
those modules.

Shapes: b = batch, s = source length, n = max_new_tokens, t = target length.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from clarifyjax.decoding.causal_loop import generate_causal
from clarifyjax.decoding.scoring import score_causal, score_t5
from clarifyjax.decoding.step import Generation, LoopSettings
from clarifyjax.decoding.t5_loop import generate_t5
from clarifyjax.models.causal_lm import CausalLM
from clarifyjax.models.t5 import T5


def generate(model: T5 | CausalLM, input_ids: jax.Array, attention_mask: jax.Array, *,
             rng: jax.Array | None, max_new_tokens: int, min_new_tokens: int = 0,
             greedy: bool = False, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, stop_token_ids: Sequence[int] = (),
             prefix_ids: Sequence[int] | None = None) -> Generation:
    """Sample continuations of input_ids [b, s] (attention_mask [b, s], 1 = token).

    Returns `Generation` with tokens/logprobs/mask [b, max_new_tokens]: the new tokens only.
    EOS is impossible for the first `min_new_tokens` steps. With greedy=True, `rng` may be None
    and the sampling settings are ignored; logprobs are then those of the model's distribution
    at temperature 1. Sampling applies temperature, then top-k, then top-p (transformers'
    order), in float32, with a fresh key per step.

    For a `CausalLM`, the prompts may be left- or right-padded (every row >= 1 token), a row
    stops after any of `config.eos_token_ids` or `stop_token_ids` (that token included, then
    `config.pad_id`). For a `T5`, `stop_token_ids` must be empty.

    `prefix_ids` (causal LMs): token ids that every prompt starts with, left out of input_ids;
    row i's prompt is prefix_ids + its own tokens (at least one). The prefix runs once for the
    batch (`CausalLM.prefill_after_prefix`) instead of once per row: the same continuations,
    much less prefill work when the rows share a long template.
    """
    settings = _loop_settings(max_new_tokens, min_new_tokens, greedy, temperature, top_k, top_p)
    if not greedy and rng is None:
        raise ValueError("generate: sampling (greedy=False) needs an rng key")
    if rng is None:
        rng = jax.random.key(0)
    input_ids = jnp.asarray(input_ids, jnp.int32)
    attention_mask = jnp.asarray(attention_mask, jnp.int32)
    if input_ids.shape != attention_mask.shape or input_ids.ndim != 2:
        raise ValueError(f"generate: input_ids {input_ids.shape} and attention_mask "
                         f"{attention_mask.shape} must be the same [batch, length] shape")
    if isinstance(model, CausalLM):
        return generate_causal(model, input_ids, attention_mask, rng, settings,
                               stop_token_ids=stop_token_ids, prefix_ids=prefix_ids)
    if stop_token_ids:
        raise ValueError("generate: stop_token_ids is for causal LMs; a T5 stops at its EOS")
    if prefix_ids is not None:
        raise ValueError("generate: prefix_ids is for causal LMs")
    return generate_t5(model, input_ids, attention_mask, rng, settings)


def _loop_settings(max_new_tokens, min_new_tokens, greedy, temperature, top_k,
                   top_p) -> LoopSettings:
    """generate's settings, checked; greedy ones with the sampling fields reset, since they do
    not change the program (one compile for all)."""
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    if not 0 <= min_new_tokens <= max_new_tokens:
        raise ValueError(f"generate: min_new_tokens must be in [0, max_new_tokens], got "
                         f"{min_new_tokens}")
    if temperature <= 0:
        raise ValueError(f"generate: temperature must be > 0 (use greedy=True), got {temperature}")
    if top_k < 0:
        raise ValueError(f"generate: top_k must be >= 0 (0 = off), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"generate: top_p must be in (0, 1], got {top_p}")
    if greedy:
        temperature, top_k, top_p = 1.0, 0, 1.0
    return LoopSettings(max_new_tokens=int(max_new_tokens), min_new_tokens=int(min_new_tokens),
                        greedy=bool(greedy), temperature=float(temperature), top_k=int(top_k),
                        top_p=float(top_p))


def score(model: T5 | CausalLM, input_ids: jax.Array, attention_mask: jax.Array,
          target_ids: jax.Array, target_mask: jax.Array) -> jax.Array:
    """Teacher-forced log p(target_ids[:, i] | input, targets before i): [b, t] float32, 0 where
    target_mask is 0. input_ids/attention_mask [b, s]; target_ids/target_mask [b, t].

    For a `CausalLM`, input_ids are the prompts (left- or right-padded, every row >= 1 token)
    and the targets their continuations (right-padded)."""
    if target_ids.shape != target_mask.shape:
        raise ValueError(f"score: target_ids {target_ids.shape} and target_mask "
                         f"{target_mask.shape} differ in shape")
    args = [jnp.asarray(a, jnp.int32) for a in (input_ids, attention_mask, target_ids,
                                                 target_mask)]
    if isinstance(model, CausalLM):
        return score_causal(model, *args)
    return score_t5(model, *args)
