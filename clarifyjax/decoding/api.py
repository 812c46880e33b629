"""Jitted sampling from a `T5` or a decoder-only `CausalLM` with its KV cache, and
teacher-forced scoring of given targets.

`generate` encodes once, then runs ONE `lax.while_loop` over `T5.decode_step`, carrying the
functional `DecodeCache`, until every row has emitted EOS or `max_new_tokens` are out. The model
goes in as `nnx.split(model)`: the graph definition and the sampling settings are static
arguments of a module-level jitted function, so calls with the same shapes and settings reuse
one compiled program (`clarifyjax.core.traces` counts the traces).

A `CausalLM` takes the same calls (`generate` and `score` dispatch on the model's type): the
prompts, left- or right-padded, are left-aligned and padded on the left to a bucket length
(`clarifyjax.core.buckets`), prefilled into a preallocated cache whose length is bucketed too, and
ONE `lax.while_loop` over `CausalLM.decode_step` samples until every row has emitted an EOS
(any of `config.eos_token_ids`) or a `stop_token_ids` token, so a stream of batches compiles a
handful of programs.

PPO needs the log-probability of each sampled token under the distribution it was drawn from
(after temperature, top-k, top-p); at temperature 1 with no truncation that equals `score`.

Shapes: b = batch, s = source length, n = max_new_tokens, t = target length, V = vocab.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from clarifyjax.core import buckets

from clarifyjax.core import traces
from clarifyjax.models.causal_lm import CausalLM, left_align
from clarifyjax.models.t5 import T5, shift_right

class Generation(NamedTuple):
    """tokens [b, n] int32 (pad after EOS); logprobs [b, n] float32 (0 where mask is 0);
    mask [b, n] int32: 1 up to and including the EOS."""
    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array


TOP_P_CANDIDATES = 256  # most likely tokens searched first for the top-p nucleus


def _top_p_threshold(descending: jax.Array, log_total: jax.Array,
                     top_p: float) -> tuple[jax.Array, jax.Array]:
    """The smallest logit kept by top-p: descending [b, n] logits (the n most likely of the row),
    log_total [b, 1] = logsumexp of the whole row -> ([b, 1], [b] whether the n cover top_p)."""
    probs = jnp.exp(descending - log_total)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    kept = jnp.where(mass_before < top_p, descending, jnp.inf)
    return jnp.min(kept, axis=-1, keepdims=True), jnp.sum(probs, axis=-1) >= top_p


def _ordered_keys(x: jax.Array) -> jax.Array:
    """float32 -> int32 keys in the same order (-inf lowest): sign-magnitude bits made two's
    complement, so that integer bisection walks the floats in order."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def _top_p_threshold_by_bisection(logits: jax.Array, log_total: jax.Array,
                                  top_p: float) -> jax.Array:
    """The top-p threshold of every row without sorting: [b, V], [b, 1] -> [b, 1].

    A token is kept when the mass of the tokens strictly more likely than it is < top_p; that
    mass only falls as the logit rises, so the kept tokens are those whose key is >= the smallest
    key k with mass(> k) < top_p, found by 32 halvings of the int32 key range (one masked sum
    over the row each), which costs far less than sorting a large vocabulary per row
    (benchmarks/results/t5.json has the measured decode costs).
    """
    keys = _ordered_keys(logits)
    probs = jnp.exp(logits - log_total)

    def mass_above(k):  # [b, 1] -> [b, 1]
        return jnp.sum(jnp.where(keys > k, probs, 0.0), axis=-1, keepdims=True)

    def halve(_, bounds):  # invariant: mass_above(hi) < top_p <= mass_above(lo), lo < hi
        lo, hi = bounds
        mid = (lo & hi) + ((lo ^ hi) >> 1)  # floor((lo + hi) / 2) without int32 overflow
        below = mass_above(mid) < top_p
        return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

    hi = jnp.max(keys, axis=-1, keepdims=True)  # nothing is above the largest logit: mass 0
    lo = jnp.full_like(hi, jnp.iinfo(jnp.int32).min)  # everything is above: mass 1 >= top_p
    _, smallest = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    return jnp.min(jnp.where(keys >= smallest, logits, jnp.inf), axis=-1, keepdims=True)


def _kth_largest_by_bisection(logits: jax.Array, k: int) -> jax.Array:
    """The k-th largest logit of every row, ties counted (what `lax.top_k(logits, k)[0][..., -1]`
    gives), without sorting: [b, V] -> [b, 1]. The largest key t with count(keys >= t) >= k is
    the k-th largest's own key; 32 halvings of the int32 key range, one compare-and-count over
    the row each."""
    keys = _ordered_keys(logits)

    def halve(_, bounds):  # invariant: count(keys >= lo) >= k > count(keys >= hi), lo < hi
        lo, hi = bounds
        mid = (lo & hi) + ((lo ^ hi) >> 1)
        enough = jnp.sum(keys >= mid, axis=-1, keepdims=True) >= k
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo = jnp.full((logits.shape[0], 1), jnp.iinfo(jnp.int32).min, jnp.int32)
    hi = jnp.max(keys, axis=-1, keepdims=True) + 1  # nothing is at or above it
    smallest, _ = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    return jnp.min(jnp.where(keys >= smallest, logits, jnp.inf), axis=-1, keepdims=True)


def _sorting_is_slow() -> bool:
    """XLA:CPU runs `lax.top_k` as a sort of the row: 142 ms for [128, 8192] against 14 ms for
    the bisections above (measured on this 2-core CPU). Accelerators have fast top-k kernels."""
    return jax.default_backend() == "cpu"


def filter_logits(logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0) -> jax.Array:
    """The logits actually sampled from: [b, V] float32 -> [b, V], -inf outside the support.

    Temperature first, then top-k (keep the k largest), then top-p (keep the smallest set of
    most likely tokens whose probability reaches top_p; the most likely token always stays).

    Neither sorts the vocabulary (a per-row sort of a 32k vocabulary can cost more than the
    model's own decoding step). On accelerators, top-k is `lax.top_k` and top-p looks for the
    nucleus among the TOP_P_CANDIDATES most likely tokens (`lax.top_k`), bisecting for the
    threshold over the whole row (`_top_p_threshold_by_bisection`) only when, in some row, those
    do not reach top_p. On CPU, where `lax.top_k` is a sort, both thresholds are bisections.
    """
    logits = logits.astype(jnp.float32) / jnp.float32(temperature)
    slow_sort = _sorting_is_slow()
    if top_k > 0:
        k = min(top_k, logits.shape[-1])
        kth = (_kth_largest_by_bisection(logits, k) if slow_sort
               else jax.lax.top_k(logits, k)[0][..., -1:])
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0 and slow_sort:
        log_total = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        threshold = _top_p_threshold_by_bisection(logits, log_total, top_p)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    elif top_p < 1.0:
        log_total = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        n = min(TOP_P_CANDIDATES, logits.shape[-1])
        threshold, covered = _top_p_threshold(jax.lax.top_k(logits, n)[0], log_total, top_p)
        if n < logits.shape[-1]:
            threshold = jax.lax.cond(
                jnp.all(covered), lambda: threshold,
                lambda: _top_p_threshold_by_bisection(logits, log_total, top_p))
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return logits


SAMPLE_BLOCK = 128  # vocabulary entries per block of `sample_categorical`'s two-level search


def _first_above(cumulative: jax.Array, target: jax.Array, weights: jax.Array) -> jax.Array:
    """Index of the first entry of nondecreasing `cumulative` [b, n] above target [b, 1], never
    one with weight 0: where float rounding leaves none above, the last positive-weight entry."""
    n = cumulative.shape[-1]
    first = jnp.sum(cumulative <= target, axis=-1)
    last_positive = n - 1 - jnp.argmax((weights > 0)[..., ::-1], axis=-1)
    return jnp.minimum(first, last_positive).astype(jnp.int32)


def sample_categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One draw per row from softmax(logits): [b, V] float -> [b] int32 (-inf = never drawn).

    Inverse-CDF sampling with ONE uniform per row: `jax.random.categorical` draws a Gumbel
    variate per vocabulary entry, and generating that many random bits is a sizeable share of a
    small model's decoding step. The search is two-level (blocks of SAMPLE_BLOCK entries,
    then inside the chosen block) so that no cumulative sum runs over the whole vocabulary:
    sums stay short, exact enough in float32, and cheap on every backend.
    """
    b, v = logits.shape
    blocks = -(-v // SAMPLE_BLOCK)
    logits = logits.astype(jnp.float32)
    weights = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))      # [b, V], max = 1
    weights = jnp.pad(weights, ((0, 0), (0, blocks * SAMPLE_BLOCK - v)))
    weights = weights.reshape(b, blocks, SAMPLE_BLOCK)
    block_mass = jnp.sum(weights, axis=-1)                                   # [b, blocks]
    block_cum = jnp.cumsum(block_mass, axis=-1)
    target = jax.random.uniform(key, (b, 1), jnp.float32) * block_cum[:, -1:]
    block = _first_above(block_cum, target, block_mass)                      # [b]
    previous = jnp.take_along_axis(block_cum, jnp.maximum(block - 1, 0)[:, None], axis=-1)
    before = jnp.where(block[:, None] > 0, previous, 0.0)                    # [b, 1]
    inside = jnp.take_along_axis(weights, block[:, None, None], axis=1)[:, 0]  # [b, SAMPLE_BLOCK]
    offset = _first_above(jnp.cumsum(inside, axis=-1), target - before, inside)
    return block * SAMPLE_BLOCK + offset


def _check_sampling(max_new_tokens, min_new_tokens, temperature, top_k, top_p) -> None:
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


def _choose(logits, step, rng, eos_ids, min_new_tokens, greedy, temperature, top_k, top_p):
    """One decoding step's choice: logits [b, V] -> (token [b] int32, its log-prob [b] under
    the distribution it was drawn from, rng). EOS ids are impossible before `min_new_tokens`."""
    if min_new_tokens > 0:
        vocab = jnp.arange(logits.shape[-1])
        is_eos = jnp.isin(vocab, jnp.asarray(eos_ids, jnp.int32))
        logits = jnp.where(is_eos & (step < min_new_tokens), -jnp.inf, logits)
    if greedy:  # log-probs under the model's own (temperature 1) distribution
        token = jnp.argmax(logits, axis=-1)
    else:
        rng, key = jax.random.split(rng)
        logits = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
        token = sample_categorical(key, logits)
    # log_softmax at the chosen token only: no [b, V] array written per step
    token_logp = (jnp.take_along_axis(logits, token[:, None], axis=-1)[:, 0]
                  - jax.nn.logsumexp(logits, axis=-1))
    return token.astype(jnp.int32), token_logp, rng


def _record(tokens, logprobs, mask, step, token, token_logp, alive):
    """Write one step's column into the [b, n] outputs."""
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, step))
    logprobs = jax.lax.dynamic_update_slice(
        logprobs, jnp.where(alive, token_logp, 0.0)[:, None], (0, step))
    mask = jax.lax.dynamic_update_slice(mask, alive.astype(jnp.int32)[:, None], (0, step))
    return tokens, logprobs, mask


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "min_new_tokens",
                                             "greedy", "temperature", "top_k", "top_p"))
def _generate(graphdef, state, input_ids, attention_mask, rng, *, max_new_tokens: int,
              min_new_tokens: int, greedy: bool, temperature: float, top_k: int,
              top_p: float) -> Generation:
    traces.note("generate")
    model: T5 = nnx.merge(graphdef, state)
    c = model.config
    b = input_ids.shape[0]
    cache = model.init_cache(model.encode(input_ids, attention_mask), attention_mask,
                             max_new_tokens)

    def cond(carry):
        step, done = carry[0], carry[1]
        return (step < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        step, done, last, cache, tokens, logprobs, mask, rng = carry
        logits, cache = model.decode_step(last, cache, step)
        token, token_logp, rng = _choose(logits, step, rng, (c.eos_token_id,), min_new_tokens,
                                         greedy, temperature, top_k, top_p)
        alive = ~done
        token = jnp.where(alive, token, c.pad_token_id).astype(jnp.int32)
        tokens, logprobs, mask = _record(tokens, logprobs, mask, step, token, token_logp, alive)
        done = done | (token == c.eos_token_id)
        return step + 1, done, token, cache, tokens, logprobs, mask, rng

    carry = (jnp.int32(0), jnp.zeros((b,), bool),
             jnp.full((b,), c.decoder_start_token_id, jnp.int32), cache,
             jnp.full((b, max_new_tokens), c.pad_token_id, jnp.int32),
             jnp.zeros((b, max_new_tokens), jnp.float32),
             jnp.zeros((b, max_new_tokens), jnp.int32), rng)
    _, _, _, _, tokens, logprobs, mask, _ = jax.lax.while_loop(cond, body, carry)
    return Generation(tokens, logprobs, mask)


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
    _check_sampling(max_new_tokens, min_new_tokens, temperature, top_k, top_p)
    if not greedy and rng is None:
        raise ValueError("generate: sampling (greedy=False) needs an rng key")
    if rng is None:
        rng = jax.random.key(0)
    if greedy:  # the sampling settings do not change the program: one compile for all
        temperature, top_k, top_p = 1.0, 0, 1.0
    settings = dict(max_new_tokens=int(max_new_tokens), min_new_tokens=int(min_new_tokens),
                    greedy=bool(greedy), temperature=float(temperature), top_k=int(top_k),
                    top_p=float(top_p))
    input_ids = jnp.asarray(input_ids, jnp.int32)
    attention_mask = jnp.asarray(attention_mask, jnp.int32)
    if input_ids.shape != attention_mask.shape or input_ids.ndim != 2:
        raise ValueError(f"generate: input_ids {input_ids.shape} and attention_mask "
                         f"{attention_mask.shape} must be the same [batch, length] shape")
    graphdef, state = nnx.split(model)
    if isinstance(model, CausalLM):
        c = model.config
        prefix = None
        if prefix_ids is not None:
            prefix = jnp.asarray(prefix_ids, jnp.int32).reshape(-1)
            if prefix.shape[0] == 0:
                raise ValueError("generate: prefix_ids is empty (leave it out instead)")
            if bool(jnp.any(jnp.sum(attention_mask, axis=1) == 0)):
                raise ValueError("generate: with prefix_ids, every row needs at least one "
                                 "token of its own after the prefix")
            ids, mask = _pad_left_to_bucket(prefix[None], jnp.ones_like(prefix)[None])
            prefix = (ids[0], mask[0])
        if c.positions == "learned":  # a learned table has no row past its end (take clamps)
            longest = int(jnp.max(jnp.sum(attention_mask, axis=1))) + int(max_new_tokens)
            longest += 0 if prefix_ids is None else len(prefix_ids)
            if longest > c.max_position_embeddings:
                raise ValueError(f"generate: prompt + max_new_tokens reach {longest} tokens, "
                                 f"past the model's max_position_embeddings "
                                 f"{c.max_position_embeddings}")
        input_ids, attention_mask = _pad_left_to_bucket(input_ids, attention_mask)
        prompt_width = input_ids.shape[1] + (0 if prefix is None else prefix[0].shape[0])
        cache_length = buckets.bucket_length(prompt_width + int(max_new_tokens))
        return _generate_causal(graphdef, state, input_ids, attention_mask, rng, prefix,
                                cache_length=cache_length,
                                stop_ids=tuple(int(t) for t in stop_token_ids), **settings)
    if stop_token_ids:
        raise ValueError("generate: stop_token_ids is for causal LMs; a T5 stops at its EOS")
    if prefix_ids is not None:
        raise ValueError("generate: prefix_ids is for causal LMs")
    return _generate(graphdef, state, input_ids, attention_mask, rng, **settings)


def _pad_left_to_bucket(ids: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Pad [b, s] on the left to the bucket length of s (mask 0), so prompt lengths repeat. The
    fine buckets: prefill is compute-bound, and a caller that bucketed its own way (LocalLM)
    keeps its width (powers of two padded its 96 columns to 128)."""
    extra = buckets.bucket_length(ids.shape[1], buckets.FINE_BUCKETS) - ids.shape[1]
    if extra == 0:
        return ids, mask
    return jnp.pad(ids, ((0, 0), (extra, 0))), jnp.pad(mask, ((0, 0), (extra, 0)))


class _CausalLoop(NamedTuple):
    """The carry of `_generate_causal`'s while_loop (b = batch, n = max_new_tokens, V = vocab)."""
    step: jax.Array       # int32 scalar: tokens chosen so far
    done: jax.Array       # [b] bool: the row has emitted an EOS or stop token
    logits: jax.Array     # [b, V] float32: the model's logits for the next token
    cache: Any            # causal_lm.KVCache
    tokens: jax.Array     # [b, n] int32
    logprobs: jax.Array   # [b, n] float32
    mask: jax.Array       # [b, n] int32
    rng: jax.Array


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "min_new_tokens",
                                             "greedy", "temperature", "top_k", "top_p",
                                             "cache_length", "stop_ids"))
def _generate_causal(graphdef, state, input_ids, attention_mask, rng, prefix, *,
                     max_new_tokens: int,
                     min_new_tokens: int, greedy: bool, temperature: float, top_k: int,
                     top_p: float, cache_length: int, stop_ids: tuple[int, ...]) -> Generation:
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

    def cond(s: _CausalLoop):
        return (s.step < max_new_tokens) & ~jnp.all(s.done)

    def body(s: _CausalLoop) -> _CausalLoop:
        token, token_logp, rng = _choose(s.logits, s.step, s.rng, c.eos_token_ids,
                                         min_new_tokens, greedy, temperature, top_k, top_p)
        alive = ~s.done
        token = jnp.where(alive, token, c.pad_id).astype(jnp.int32)
        tokens, logprobs, mask = _record(s.tokens, s.logprobs, s.mask, s.step, token,
                                         token_logp, alive)
        done = s.done | jnp.isin(token, ends)
        logits, cache = model.decode_step(token, s.cache)
        return _CausalLoop(s.step + 1, done, logits, cache, tokens, logprobs, mask, rng)

    start = _CausalLoop(jnp.int32(0), jnp.zeros((b,), bool), logits, cache,
                        jnp.full((b, max_new_tokens), c.pad_id, jnp.int32),
                        jnp.zeros((b, max_new_tokens), jnp.float32),
                        jnp.zeros((b, max_new_tokens), jnp.int32), rng)
    end = jax.lax.while_loop(cond, body, start)
    return Generation(end.tokens, end.logprobs, end.mask)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _score(graphdef, state, input_ids, attention_mask, target_ids, target_mask) -> jax.Array:
    traces.note("score")
    model: T5 = nnx.merge(graphdef, state)
    start = model.config.decoder_start_token_id
    decoder_input_ids = shift_right(target_ids, start)
    decoder_mask = shift_right(target_mask, 1)  # the start position is always visible
    logits = model(input_ids, attention_mask, decoder_input_ids, decoder_mask)
    logp = jax.nn.log_softmax(logits, axis=-1)
    token_logp = jnp.take_along_axis(logp, target_ids[..., None], axis=-1)[..., 0]
    return jnp.where(target_mask.astype(bool), token_logp, 0.0)


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
    graphdef, state = nnx.split(model)
    if isinstance(model, CausalLM):
        t = args[2].shape[1]
        args[0], args[1] = _pad_left_to_bucket(args[0], args[1])
        extra = buckets.bucket_length(t) - t
        args[2], args[3] = (jnp.pad(a, ((0, 0), (0, extra))) for a in args[2:])
        return _score_causal(graphdef, state, *args)[:, :t]
    return _score(graphdef, state, *args)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _score_causal(graphdef, state, prompt_ids, prompt_mask, target_ids, target_mask):
    traces.note("score_causal")
    model: CausalLM = nnx.merge(graphdef, state)
    ids, mask = left_align(prompt_ids, prompt_mask)
    P = ids.shape[1]
    hidden, _ = model.hidden_states(jnp.concatenate([ids, target_ids], axis=1),
                                    jnp.concatenate([mask, target_mask], axis=1))
    logp = jax.nn.log_softmax(model.logits(hidden[:, P - 1:-1]), axis=-1)
    token_logp = jnp.take_along_axis(logp, target_ids[..., None], axis=-1)[..., 0]
    return jnp.where(target_mask.astype(bool), token_logp, 0.0)
