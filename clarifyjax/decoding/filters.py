"""What a sampling step draws from, and the draw: `filter_logits` (temperature, then top-k,
then top-p, transformers' order) and `sample_categorical` (one uniform per row, inverse CDF).

Neither sorts the vocabulary: on accelerators the thresholds come from `lax.top_k`; on CPU,
where `lax.top_k` is a sort of the row, from bisections of the float32 bit patterns.

Shapes: b = batch, V = vocab.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

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
                  top_p: float = 1.0, bisect: bool | None = None) -> jax.Array:
    """The logits actually sampled from: [b, V] float32 -> [b, V], -inf outside the support.

    Temperature first, then top-k (keep the k largest), then top-p (keep the smallest set of
    most likely tokens whose probability reaches top_p; the most likely token always stays).

    Neither sorts the vocabulary (a per-row sort of a 32k vocabulary can cost more than the
    model's own decoding step). On accelerators, top-k is `lax.top_k` and top-p looks for the
    nucleus among the TOP_P_CANDIDATES most likely tokens (`lax.top_k`), bisecting for the
    threshold over the whole row (`_top_p_threshold_by_bisection`) only when, in some row, those
    do not reach top_p. On CPU, where `lax.top_k` is a sort, both thresholds are bisections.
    `bisect` picks the way explicitly (True: bisections, False: `lax.top_k`); None (the
    default) picks by backend as above. Both keep the same tokens.
    """
    logits = logits.astype(jnp.float32) / jnp.float32(temperature)
    slow_sort = _sorting_is_slow() if bisect is None else bool(bisect)
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
