"""What a sampling step draws from, and the draw: `filter_logits` (temperature, then top-k,
then top-p, transformers' order) and `sample_categorical` (one uniform per row, inverse CDF).

Neither sorts the vocabulary: the thresholds come from the few largest logits of each row
(`top_k_values`, `lax.top_k`), or, where those do not settle a top-p threshold, from bisections
of the float32 bit patterns; on a CPU, a top-p threshold over the whole row comes from the
radix-selection kernel of `native` instead (the bisections' masked sums are slow in XLA:CPU).

Shapes: b = batch, V = vocab.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from clarifyjax.core import native

TOP_P_CANDIDATES = 256  # most likely tokens searched first for the top-p nucleus


def top_p_threshold(descending: jax.Array, log_total: jax.Array,
                    top_p) -> tuple[jax.Array, jax.Array]:
    """The smallest logit kept by top-p: descending [b, n] logits (the n most likely of the row),
    log_total [b, 1] = logsumexp of the whole row, top_p a number or [b, 1] -> ([b, 1], [b]
    whether the n cover top_p)."""
    probs = jnp.exp(descending - log_total)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    kept = jnp.where(mass_before < top_p, descending, jnp.inf)
    covered = jnp.sum(probs, axis=-1, keepdims=True) >= top_p
    return jnp.min(kept, axis=-1, keepdims=True), covered[:, 0]


def _ordered_keys(x: jax.Array) -> jax.Array:
    """float32 -> int32 keys in the same order (-inf lowest): sign-magnitude bits made two's
    complement, so that integer bisection walks the floats in order."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


PARTIAL_SUMS = 16  # a bisection pass sums a row as this many interleaved partial sums


def _split_rows(x: jax.Array, fill) -> jax.Array:
    """[b, V] -> [b, PARTIAL_SUMS, ceil(V / PARTIAL_SUMS)], the row padded with `fill` (a value
    that no pass counts), made once before a bisection's passes."""
    b, v = x.shape
    m = -(-v // PARTIAL_SUMS)
    x = jnp.pad(x, ((0, 0), (0, m * PARTIAL_SUMS - v)), constant_values=fill)
    return x.reshape(b, PARTIAL_SUMS, m)


def _sum_split(x: jax.Array) -> jax.Array:
    """[b, PARTIAL_SUMS, m] -> [b, 1]: the slices added elementwise, then the sum of the result.

    XLA:CPU sums a row in one vector accumulator, one dependent add after another, so a pass over
    a 32k row waited on add latency (4.7 us for a plain sum of 32000 floats, on this host); the
    slices' elementwise adds are independent, and the chain is PARTIAL_SUMS times shorter."""
    total = x[:, 0]
    for j in range(1, x.shape[1]):
        total = total + x[:, j]
    return jnp.sum(total, axis=-1, keepdims=True)


def _row_by_row(fn, logits: jax.Array, *row_args) -> jax.Array:
    """fn(logits [b, V], *row_args [b, 1]) -> [b, 1], on a CPU one row at a time.

    A bisection reads the whole [b, V] array 32 times; at b = 128 and V = 32k that is 16 MB of
    logits (and as much of probabilities) per pass, far beyond the CPU's caches, so every pass
    streams from memory. One row (128 KB) stays in cache for all 32 passes: measured on this
    2-core host at [128, 32000], top-p's bisection took 168 ms for the whole batch and 46 ms row
    by row. On an accelerator the batch runs at once (a sequential loop over rows would only add
    launches)."""
    if jax.default_backend() != "cpu" or logits.shape[0] == 1:
        return fn(logits, *row_args)
    b = logits.shape[0]
    row_args = [jnp.broadcast_to(jnp.asarray(a), (b, 1)) for a in row_args]
    out = jax.lax.map(lambda xs: fn(xs[0][None], *(a[None] for a in xs[1:]))[0],
                      (logits, *row_args))
    return out.reshape(b, 1)


def top_p_threshold_by_bisection(logits: jax.Array, log_total: jax.Array,
                                 top_p) -> jax.Array:
    """The top-p threshold of every row without sorting: [b, V], [b, 1], top_p a number or
    [b, 1] -> [b, 1].

    A token is kept when the mass of the tokens more likely than it (a larger logit) is < top_p.
    Probabilities are >= 0, so their int32 bit patterns are in their order: 30 halvings of that
    key range (one masked sum over the row each) find the least probability kept, which costs
    far less than sorting a large vocabulary per row. Tokens of different logits can share a
    probability (exp(logit - logsumexp) rounds them together); where the least kept probability
    is such a group, the group is split by logit as the rule says (`_split_tie`). On a CPU it
    runs row by row (`_row_by_row`), each row's passes in cache.
    """
    return _row_by_row(_top_p_bisection, logits, log_total, top_p)


def _as_float(key: jax.Array) -> jax.Array:
    """The float32 whose bits are max(key, 0): key -1 stands for "below every probability"."""
    return jax.lax.bitcast_convert_type(jnp.maximum(key, 0), jnp.float32)


def _top_p_bisection(logits: jax.Array, log_total: jax.Array, top_p) -> jax.Array:
    probs = jnp.exp(logits - log_total)
    parts = _split_rows(probs, 0.0)

    def mass_above(key):  # [b, 1] -> [b, 1]
        return _sum_split(jnp.where(parts > _as_float(key)[..., None], parts, 0.0))

    def halve(_, bounds):  # invariant: mass_above(hi) < top_p <= mass_above(lo), lo < hi
        lo, hi = bounds
        mid = lo + (hi - lo) // 2  # keys lie in [-1, 0x3F800000]: no overflow
        below = mass_above(mid) < top_p
        return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

    # nothing is above the largest probability (mass 0); everything with mass is above key -1
    hi = jax.lax.bitcast_convert_type(jnp.max(probs, axis=-1, keepdims=True), jnp.int32)
    lo = jnp.full_like(hi, -1)
    _, smallest = jax.lax.fori_loop(0, 30, halve, (lo, hi))  # hi - lo < 2**30 to start
    least = jnp.min(jnp.where(probs >= _as_float(smallest), probs, jnp.inf), axis=-1,
                    keepdims=True)
    return _split_tie(logits, probs, least, top_p)


def _split_tie(logits: jax.Array, probs: jax.Array, least: jax.Array, top_p) -> jax.Array:
    """The logit threshold of top-p, given the least probability kept `least` [b, 1]: the
    smallest logit of the tokens of that probability, or, where they have different logits, the
    K-th largest of those, K the most of them that the rule keeps (each adds `least` to the mass
    of the tokens more likely than the next: K = ceil((top_p - mass above least) / least))."""
    tied = probs == least
    low = jnp.min(jnp.where(tied, logits, jnp.inf), axis=-1, keepdims=True)
    high = jnp.max(jnp.where(tied, logits, -jnp.inf), axis=-1, keepdims=True)
    split = high > low

    def resolve():
        above = jnp.sum(jnp.where(probs > least, probs, 0.0), axis=-1, keepdims=True)
        count = jnp.sum(tied, axis=-1, keepdims=True)
        ratio = jnp.where(least > 0, (top_p - above) / jnp.where(least > 0, least, 1.0), count)
        k = jnp.clip(jnp.ceil(ratio), 1, count).astype(jnp.int32)
        return jnp.where(split, _kth_bisection(jnp.where(tied, logits, -jnp.inf), k), low)

    return jax.lax.cond(jnp.any(split), resolve, lambda: low)


def kth_largest_by_bisection(logits: jax.Array, k) -> jax.Array:
    """The k-th largest logit of every row, ties counted (what `lax.top_k(logits, k)[0][..., -1]`
    gives), without sorting: [b, V], k a number or [b, 1] -> [b, 1]. The largest key t with count(keys >= t) >= k is
    the k-th largest's own key; 32 halvings of the int32 key range, one compare-and-count over
    the row each; on a CPU row by row (`_row_by_row`)."""
    return _row_by_row(_kth_bisection, logits, k)


def _kth_bisection(logits: jax.Array, k) -> jax.Array:
    keys = _ordered_keys(logits)
    parts = _split_rows(keys, jnp.iinfo(jnp.int32).min)  # never counted: every mid > lo

    def halve(_, bounds):  # invariant: count(keys >= lo) >= k > count(keys >= hi), lo < hi
        lo, hi = bounds
        mid = (lo & hi) + ((lo ^ hi) >> 1)
        enough = _sum_split((parts >= mid[..., None]).astype(jnp.int32)) >= k
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo = jnp.full((logits.shape[0], 1), jnp.iinfo(jnp.int32).min, jnp.int32)
    hi = jnp.max(keys, axis=-1, keepdims=True) + 1  # nothing is at or above it
    smallest, _ = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    return jnp.min(jnp.where(keys >= smallest, logits, jnp.inf), axis=-1, keepdims=True)


def _cpu_kernels() -> bool:
    """Whether the program being traced runs `native`'s kernels (a CPU, and built)."""
    return jax.default_backend() == "cpu" and native.available()


def top_k_values(logits: jax.Array, n: int) -> jax.Array:
    """The n largest logits of every row, descending: [b, V] -> [b, n]; on a CPU by `native`'s
    one-pass kernel where it could be built (about 1 ms for n = 10 at [128, 32000]), elsewhere
    by `lax.top_k`.

    Never slice `lax.top_k`'s output (take the k-th largest as the row's min of these, or
    gather it): a sliced `lax.top_k` is rewritten by XLA:CPU into a sort of the whole row (2.4 s
    for [128, 32000]) instead of its TopK call (7-14 ms; a pruned search over the blocks with the
    largest maxima measured slower still, 14 ms), and a sort is what the earlier bisections of
    this module were written to avoid.
    """
    if _cpu_kernels():
        return native.largest_values(logits, n)
    return jax.lax.top_k(logits, n)[0]


SMALLEST_TEMPERATURE = float(np.finfo(np.float32).tiny)  # 2**-126, float32's smallest normal
LARGEST_TEMPERATURE = 2.0 ** 125  # its reciprocal (XLA divides by multiplying) is still normal


def scale_by_temperature(logits: jax.Array, temperature: float) -> jax.Array:
    """logits / temperature in float32, computed so that no temperature > 0 overflows: [b, V].

    Each row's largest logit is subtracted first (the softmax, top-k and top-p do not change),
    so the scaled logits are <= 0 and the largest is exactly 0: a tiny temperature sends the
    others to -inf, which is the limit of the distribution as T -> 0 (the argmax; tied maxima
    share it). A temperature below float32's smallest normal number (`SMALLEST_TEMPERATURE`,
    about 1.18e-38; 5e-324 or a float32 subnormal such as 1e-40) is used as that number, since
    XLA flushes subnormals to zero; one above `LARGEST_TEMPERATURE` (2**125, about 4.3e37) as
    that one, where the distribution is already uniform in float32 (the limit as T -> infinity).
    """
    logits = logits.astype(jnp.float32)
    temperature = float(temperature)
    if temperature == 1.0:
        return logits
    top = jnp.max(logits, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)  # a row of -inf stays -inf, not NaN
    scale = np.float32(min(max(temperature, SMALLEST_TEMPERATURE), LARGEST_TEMPERATURE))
    return (logits - top) / scale


def filter_logits(logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, bisect: bool = False) -> jax.Array:
    """The logits actually sampled from: [b, V] float32 -> [b, V], -inf outside the support.

    Temperature first (`scale_by_temperature`: no temperature > 0 overflows), then top-k (keep
    the k largest), then top-p (keep the smallest set of most likely tokens whose probability
    reaches top_p; the most likely token always stays).

    Neither sorts the vocabulary (a per-row sort of a 32k vocabulary can cost more than the
    model's own decoding step). The top-k threshold is the smallest of `top_k_values`; top-p
    looks for the nucleus among the top-k kept tokens when top-k is on (at most
    TOP_P_CANDIDATES of them), else among the TOP_P_CANDIDATES most likely tokens, bisecting for
    the threshold over the whole row (`top_p_threshold_by_bisection`) only when, in some row,
    those do not reach top_p. `bisect=True` finds both thresholds by bisections of the whole
    row instead; both ways keep the same tokens.
    """
    logits = scale_by_temperature(logits, temperature)
    descending = None
    if top_k > 0:
        k = min(top_k, logits.shape[-1])
        if bisect:
            kth = kth_largest_by_bisection(logits, k)
        else:
            descending = top_k_values(logits, k)
            kth = jnp.min(descending, axis=-1, keepdims=True)
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        logits = jnp.where(logits < _top_p_cut(logits, top_p, descending, bisect),
                           -jnp.inf, logits)
    return logits


def _top_p_cut(logits: jax.Array, top_p: float, descending: jax.Array | None,
               bisect: bool) -> jax.Array:
    """filter_logits' top-p threshold [b, 1] of logits [b, V] (after top-k, whose kept values,
    descending, are `descending` [b, k] when top-k ran by `top_k_values`)."""
    if bisect:
        log_total = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        return top_p_threshold_by_bisection(logits, log_total, top_p)
    if descending is not None and descending.shape[-1] <= TOP_P_CANDIDATES:
        # every kept token is >= the smallest of them, and the ones tied with it share its
        # value: the nucleus found among them is the row's (when they do not cover top_p, the
        # threshold is their smallest, which keeps every token top-k kept)
        log_total = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        return top_p_threshold(descending, log_total, top_p)[0]
    return top_p_threshold_searched(logits, top_p)


def top_p_threshold_searched(logits: jax.Array, top_p,
                             settled: jax.Array | None = None) -> jax.Array:
    """Each row's top-p threshold [b, 1] (top_p a number or [b, 1]) of logits [b, V].
    `settled` [b, 1] (optional) marks rows whose threshold the caller does not use (top-p off).

    On a CPU, by the radix-selection kernel of `native` (about 6 ms at [128, 32000]) where it
    could be built. Elsewhere from the TOP_P_CANDIDATES most likely tokens where they reach
    top_p, by bisection of the whole row in the other rows (settled rows never call for it).
    The candidate search (`lax.top_k` of 256 at [128, 32000]: 21 ms on this host) is skipped
    when no row's candidates can reach top_p: they hold at most n times the row's largest
    probability (a flat row, a nucleus of thousands)."""
    if _cpu_kernels():
        return native.nucleus_threshold(logits, top_p)
    log_total = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    n = min(TOP_P_CANDIDATES, logits.shape[-1])
    if n == logits.shape[-1]:
        return top_p_threshold(top_k_values(logits, n), log_total, top_p)[0]
    settled = jnp.zeros((logits.shape[0], 1), bool) if settled is None else settled

    def bisection():
        return top_p_threshold_by_bisection(logits, log_total, top_p)

    def candidates():
        threshold, covered = top_p_threshold(top_k_values(logits, n), log_total, top_p)
        done = covered[:, None] | settled
        return jax.lax.cond(jnp.all(done), lambda: threshold,
                            lambda: jnp.where(done, threshold, bisection()))

    largest = jnp.exp(jnp.max(logits, axis=-1, keepdims=True) - log_total)
    may_cover = (n * largest >= top_p) & ~settled
    return jax.lax.cond(jnp.any(may_cover), candidates, bisection)


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

    Inverse-CDF sampling with ONE uniform per row (`draw_categorical`): `jax.random.categorical`
    draws a Gumbel variate per vocabulary entry, and generating that many random bits is a
    sizeable share of a small model's decoding step.
    """
    uniform = jax.random.uniform(key, (logits.shape[0], 1), jnp.float32)
    return draw_categorical(uniform, logits)[0]


def draw_categorical(uniform: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The inverse-CDF draw of `sample_categorical` at given uniforms [b, 1] in [0, 1): logits
    [b, V] -> (token [b] int32, log of the row's total mass [b], its logsumexp, from the same
    exponentials, so that a step that needs the drawn token's log-prob takes one pass of exp).

    The search is two-level (blocks of SAMPLE_BLOCK entries, then inside the chosen block) so
    that no cumulative sum runs over the whole vocabulary: sums stay short, exact enough in
    float32, and cheap on every backend.
    """
    b, v = logits.shape
    blocks = -(-v // SAMPLE_BLOCK)
    logits = logits.astype(jnp.float32)
    top = jnp.max(logits, axis=-1, keepdims=True)
    weights = jnp.exp(logits - top)                                           # [b, V], max = 1
    weights = jnp.pad(weights, ((0, 0), (0, blocks * SAMPLE_BLOCK - v)))
    weights = weights.reshape(b, blocks, SAMPLE_BLOCK)
    block_mass = jnp.sum(weights, axis=-1)                                   # [b, blocks]
    block_cum = jnp.cumsum(block_mass, axis=-1)
    target = uniform.astype(jnp.float32) * block_cum[:, -1:]
    block = _first_above(block_cum, target, block_mass)                      # [b]
    previous = jnp.take_along_axis(block_cum, jnp.maximum(block - 1, 0)[:, None], axis=-1)
    before = jnp.where(block[:, None] > 0, previous, 0.0)                    # [b, 1]
    inside = jnp.take_along_axis(weights, block[:, None, None], axis=1)[:, 0]  # [b, SAMPLE_BLOCK]
    offset = _first_above(jnp.cumsum(inside, axis=-1), target - before, inside)
    log_total = top[:, 0] + jnp.log(block_cum[:, -1])
    return block * SAMPLE_BLOCK + offset, log_total
