"""Sampling a token from logits: the filters (temperature, then top-k, then top-p: transformers'
order) and the draw, one XLA program on every backend.

`filter_logits` takes one setting for the whole batch (static: a new setting is a new program);
`filter_rows` and `choose_rows` take a setting per row (`stack_rows`), so that rows with different
settings share one program, as `decoding.slots` runs a server's requests. Top-p keeps a token
while the mass of the tokens more likely than it is < top_p; ties stand together; the most likely
always stays. Shapes: b = batch, V = vocab."""
from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from clarifyjax.text.generator import Sampling

TOP_K_CANDIDATES = 64    # a per-row top-k up to this reads `lax.top_k`; above, a bisection
TOP_P_CANDIDATES = 256   # most likely tokens searched first for the top-p nucleus
SAMPLE_BLOCK = 128       # vocabulary entries per block of `draw_categorical`'s two-level search
SMALLEST_TEMPERATURE = float(np.finfo(np.float32).tiny)  # 2**-126, float32's smallest normal
LARGEST_TEMPERATURE = 2.0 ** 125  # its reciprocal (XLA divides by multiplying) is still normal


def scale_by_temperature(logits: jax.Array, temperature) -> jax.Array:
    """logits / temperature in float32 (a number, or one per row [b]) such that no temperature
    > 0 overflows: [b, V].

    Each row's largest logit is subtracted first (the distribution does not change), so a tiny
    temperature sends every other logit to -inf: the argmax, the limit as T -> 0. Temperatures
    are clipped to [SMALLEST_TEMPERATURE, LARGEST_TEMPERATURE] (XLA flushes subnormals to zero;
    above 2**125 the distribution is already uniform in float32). Rows at temperature 1 are
    left as they are."""
    logits = logits.astype(jnp.float32)
    per_row = not isinstance(temperature, (int, float))
    if not per_row and temperature == 1.0:
        return logits
    top = jnp.max(logits, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)  # a row of -inf stays -inf, not NaN
    if per_row:
        scale = jnp.clip(temperature.astype(jnp.float32), SMALLEST_TEMPERATURE,
                         LARGEST_TEMPERATURE)[:, None]
        return jnp.where(temperature[:, None] == 1.0, logits, (logits - top) / scale)
    scale = np.float32(min(max(float(temperature), SMALLEST_TEMPERATURE), LARGEST_TEMPERATURE))
    return (logits - top) / scale


def largest(logits: jax.Array, n: int) -> jax.Array:
    """The n largest logits of every row, descending: [b, V] -> [b, n].

    Never slice `lax.top_k`'s output (take the k-th largest as the min of these, or gather it):
    XLA:CPU rewrites a sliced top_k into a sort of the whole row."""
    return jax.lax.top_k(logits, n)[0]


def top_p_threshold(descending: jax.Array, log_total: jax.Array,
                    top_p) -> tuple[jax.Array, jax.Array]:
    """The smallest logit top-p keeps among descending [b, n] (the row's n largest), given
    log_total [b, 1] (the row's logsumexp) and top_p (a number or [b, 1]) -> ([b, 1], [b]
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


def _as_float(key: jax.Array) -> jax.Array:
    """The float32 whose bits are max(key, 0): key -1 stands for "below every probability"."""
    return jax.lax.bitcast_convert_type(jnp.maximum(key, 0), jnp.float32)


def kth_largest_by_bisection(logits: jax.Array, k) -> jax.Array:
    """The k-th largest logit of every row, ties counted (`lax.top_k(logits, k)[0][..., -1]`)
    without sorting: [b, V], k a number or [b, 1] -> [b, 1]. The largest key t with
    count(keys >= t) >= k is the k-th largest's own key: 32 halvings of the int32 key range."""
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


def top_p_threshold_by_bisection(logits: jax.Array, log_total: jax.Array,
                                 top_p) -> jax.Array:
    """The top-p threshold of every row without sorting: [b, V], [b, 1], top_p a number or
    [b, 1] -> [b, 1].

    Probabilities are >= 0, so their int32 bit patterns are in their order: 30 halvings of that
    key range (one masked sum over the row each) find the least probability kept. Tokens of
    different logits can share a probability (exp(logit - logsumexp) rounds them together);
    where the least kept probability is such a group, it is split by logit (`_split_tie`)."""
    probs = jnp.exp(logits - log_total)

    def halve(_, bounds):  # invariant: mass_above(hi) < top_p <= mass_above(lo), lo < hi
        lo, hi = bounds
        mid = lo + (hi - lo) // 2  # keys lie in [-1, 0x3F800000]: no overflow
        mass = jnp.sum(jnp.where(probs > _as_float(mid), probs, 0.0), axis=-1, keepdims=True)
        below = mass < top_p
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
        return jnp.where(split, kth_largest_by_bisection(jnp.where(tied, logits, -jnp.inf), k),
                         low)

    return jax.lax.cond(jnp.any(split), resolve, lambda: low)


def top_p_threshold_searched(logits: jax.Array, top_p,
                             settled: jax.Array | None = None) -> jax.Array:
    """Each row's top-p threshold [b, 1] (top_p a number or [b, 1]) of logits [b, V]: from the
    TOP_P_CANDIDATES most likely tokens where they reach top_p, by bisection of the whole row in
    the other rows. `settled` [b, 1] (optional) marks rows whose threshold is not used (top-p
    off): they never call for the bisection. The candidates are not searched when no row's can
    reach top_p (n times the row's largest probability is below it: a flat row)."""
    log_total = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    n = min(TOP_P_CANDIDATES, logits.shape[-1])
    if n == logits.shape[-1]:
        return top_p_threshold(largest(logits, n), log_total, top_p)[0]
    settled = jnp.zeros((logits.shape[0], 1), bool) if settled is None else settled

    def bisection():
        return top_p_threshold_by_bisection(logits, log_total, top_p)

    def candidates():
        threshold, covered = top_p_threshold(largest(logits, n), log_total, top_p)
        done = covered[:, None] | settled
        return jax.lax.cond(jnp.all(done), lambda: threshold,
                            lambda: jnp.where(done, threshold, bisection()))

    peak = jnp.exp(jnp.max(logits, axis=-1, keepdims=True) - log_total)
    return jax.lax.cond(jnp.any((n * peak >= top_p) & ~settled), candidates, bisection)


def filter_logits(logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, bisect: bool = False) -> jax.Array:
    """The logits sampled from, one setting for the batch: [b, V] -> [b, V] float32, -inf
    outside the support. Top-k keeps every token >= the k-th largest (ties stay); top-p then
    looks for the nucleus among top-k's kept tokens when there are at most TOP_P_CANDIDATES of
    them, else as `top_p_threshold_searched`. `bisect=True` finds both thresholds by bisection
    of the whole row instead: the same tokens kept."""
    logits = scale_by_temperature(logits, temperature)
    descending = None
    if top_k > 0:
        k = min(top_k, logits.shape[-1])
        if bisect:
            kth = kth_largest_by_bisection(logits, k)
        else:
            descending = largest(logits, k)
            kth = jnp.min(descending, axis=-1, keepdims=True)
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        if bisect:
            log_total = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
            threshold = top_p_threshold_by_bisection(logits, log_total, top_p)
        elif descending is not None and descending.shape[-1] <= TOP_P_CANDIDATES:
            # the nucleus lies among top-k's kept tokens (where they do not cover top_p, the
            # threshold is their smallest: every token top-k kept stays)
            log_total = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
            threshold = top_p_threshold(descending, log_total, top_p)[0]
        else:
            threshold = top_p_threshold_searched(logits, top_p)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return logits


def stack_rows(rows: Sequence[Sampling], seeds: Sequence[int]) -> dict[str, np.ndarray]:
    """Per-row settings as [b] arrays for `filter_rows` / `choose_rows`: greedy (temperature 0),
    temperature, top_k, top_p, min_new_tokens and seed (a row's key is key(seed), its step t's
    fold_in(key, t)). A field left None is off; a greedy row's filters are off."""
    def column(name, off, dtype):
        return np.array([off if s.greedy or getattr(s, name) is None else getattr(s, name)
                         for s in rows], dtype)

    return {"greedy": np.array([s.greedy for s in rows], bool),
            "temperature": column("temperature", 1.0, np.float32),
            "top_k": column("top_k", 0, np.int32), "top_p": column("top_p", 1.0, np.float32),
            "min_new_tokens": np.array([s.min_new_tokens or 0 for s in rows], np.int32),
            "seed": np.asarray(seeds, np.uint32).reshape(len(rows))}


def _top_k_rows(logits: jax.Array, k: jax.Array) -> jax.Array:
    """Each row's top-k ([b] int32, 0 = off) applied: -inf below its k-th largest (ties kept)."""
    n = min(TOP_K_CANDIDATES, logits.shape[-1])
    kth = jnp.take_along_axis(largest(logits, n), jnp.clip(k, 1, n)[:, None] - 1, axis=-1)
    beyond = (k > n)[:, None]
    kth = jax.lax.cond(jnp.any(beyond),
                       lambda: jnp.where(beyond, kth_largest_by_bisection(logits, k[:, None]),
                                         kth),
                       lambda: kth)
    kth = jnp.where(k[:, None] > 0, kth, -jnp.inf)
    return jnp.where(logits < kth, -jnp.inf, logits)


def _top_p_rows(logits: jax.Array, top_p: jax.Array) -> jax.Array:
    """Each row's top-p ([b] float32, 1 = off) applied."""
    off = (top_p >= 1.0)[:, None]
    threshold = top_p_threshold_searched(logits, top_p[:, None], settled=off)
    return jnp.where(logits < jnp.where(off, -jnp.inf, threshold), -jnp.inf, logits)


def filter_rows(logits: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
    """`filter_logits` with each row's own settings (`stack_rows`): [b, V] -> [b, V] float32.
    Top-k and top-p run only when some row asks for them."""
    logits = scale_by_temperature(logits, rows["temperature"])
    logits = jax.lax.cond(jnp.any(rows["top_k"] > 0),
                          lambda: _top_k_rows(logits, rows["top_k"]), lambda: logits)
    return jax.lax.cond(jnp.any(rows["top_p"] < 1.0),
                        lambda: _top_p_rows(logits, rows["top_p"]), lambda: logits)


def row_uniforms(seed: jax.Array, step: jax.Array) -> jax.Array:
    """One uniform in [0, 1) per row from fold_in(key(seed), step): [b], [b] -> [b, 1]."""
    def one(s, t):
        return jax.random.uniform(jax.random.fold_in(jax.random.key(s), t), (1,), jnp.float32)
    return jax.vmap(one)(seed, step)


def choose_rows(logits: jax.Array, rows: dict[str, jax.Array], step: jax.Array,
                eos_ids: Sequence[int]) -> tuple[jax.Array, jax.Array]:
    """Each row's token from its logits [b, V] at its own step [b] (tokens chosen so far) ->
    (token [b] int32, its log-prob [b] under the distribution it was drawn from). EOS ids are
    impossible before each row's min_new_tokens. A greedy row takes the argmax and the log-prob
    of the model's own distribution; a sampled row draws with its own key, so that its sample
    depends on its seed and step only. A batch of greedy rows skips the filters."""
    logits = logits.astype(jnp.float32)
    if eos_ids:
        is_eos = jnp.isin(jnp.arange(logits.shape[-1]), jnp.asarray(eos_ids, jnp.int32))
        early = (step < rows["min_new_tokens"])[:, None]
        logits = jnp.where(is_eos[None] & early, -jnp.inf, logits)
    argmax = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def at(x, token):
        return jnp.take_along_axis(x, token[:, None], axis=-1)[:, 0]

    def greedy():
        return argmax, at(logits, argmax) - jax.nn.logsumexp(logits, axis=-1)

    def sampled():
        filtered = filter_rows(logits, rows)
        token, log_total = draw_categorical(row_uniforms(rows["seed"], step), filtered)
        greedy_token, greedy_logp = greedy()
        return (jnp.where(rows["greedy"], greedy_token, token),
                jnp.where(rows["greedy"], greedy_logp, at(filtered, token) - log_total))

    return jax.lax.cond(jnp.all(rows["greedy"]), greedy, sampled)


def _first_above(cumulative: jax.Array, target: jax.Array, weights: jax.Array) -> jax.Array:
    """Index of the first entry of nondecreasing `cumulative` [b, n] above target [b, 1], never
    one with weight 0: where float rounding leaves none above, the last positive-weight entry."""
    n = cumulative.shape[-1]
    first = jnp.sum(cumulative <= target, axis=-1)
    last_positive = n - 1 - jnp.argmax((weights > 0)[..., ::-1], axis=-1)
    return jnp.minimum(first, last_positive).astype(jnp.int32)


def sample_categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One draw per row from softmax(logits): [b, V] float -> [b] int32 (-inf = never drawn),
    with ONE uniform per row (`jax.random.categorical` draws a Gumbel variate per entry)."""
    uniform = jax.random.uniform(key, (logits.shape[0], 1), jnp.float32)
    return draw_categorical(uniform, logits)[0]


def draw_categorical(uniform: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The inverse-CDF draw at given uniforms [b, 1] in [0, 1): logits [b, V] -> (token [b]
    int32, the row's logsumexp [b], from the same exponentials). The search is two-level
    (blocks of SAMPLE_BLOCK entries, then inside the chosen block), so that no cumulative sum
    runs over the whole vocabulary and float32 sums stay exact enough."""
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
