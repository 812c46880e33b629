"""SaGE (Semantic Graph Entropy), vectorized over questions and jitted; imports jax alone. As the
reference code computes it (docs/originals.md), per question with k texts, W = their cosines:

    s_i = 1e-20 + sum_{j != i} max(W_ij, 0);  p_i = s_i^alpha / sum_l s_l^alpha  (alpha = 10)
    H = -sum_i p_i log p_i / log k;  lambda = mean of W_ij over pairs i < j;  SaGE = lambda * H

Five identical vectors give 1, orthogonal ones 0. Questions of different sizes share a call
through a mask; `groups` reproduces the reference's collapsing of identical strings (opt-in)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

EPSILON = 1e-20  # the reference's floor on a node's strength
DEFAULT_ALPHA = 10.0
# alpha * log(strength) must stay finite in float32 for strengths down to EPSILON (log = -46): far
# below the overflow at ~7e36; beyond ~1e6 the entropy only amplifies float32 rounding anyway.
ALPHA_MAX = 1e6
# Cosines computed in float32 reach 1 + 1.2e-7 (the SaGE pairs files hold 1.0000001192): tolerated
# and clipped; anything further outside [-1, 1] is not a cosine.
SIMILARITY_TOLERANCE = 1e-5
BLOCK = 32  # questions per step of the jitted loop (see _in_blocks)


def _real(dtype) -> jnp.dtype:
    """The float type the metric computes in for inputs of `dtype`: float32, or float64 for
    float64 inputs while `jax.enable_x64` is on (otherwise JAX has already made them float32)."""
    return jnp.promote_types(dtype, jnp.float32)


def _concrete(value, name: str):
    """`value` as a Python int/float, or None while it is traced under jit (no value to check)."""
    if isinstance(value, jax.core.Tracer):
        return None
    if not isinstance(value, (str, bytes)) and jnp.ndim(value) == 0:
        number = value.item() if hasattr(value, "item") else value
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            return number
    raise ValueError(f"{name} must be a number, got {value!r}")


# Which arguments are checked, and when: docs/api/metric.md, "Argument checks".
def check_number(value, name: str, low: float, high: float, *, low_open: bool = False,
                 integer: bool = False):
    """`value` if it is a finite number in [low, high] ((low, high] with low_open), else a
    ValueError naming `name` (e.g. "alpha" or "--alpha"); traced values pass unchecked.

    Examples:
      >>> check_number(0.5, "chunk_size", 1, 2**31 - 1, integer=True)
      Traceback (most recent call last):
      ValueError: chunk_size must be an integer in [1, 2147483647], got 0.5"""
    number = _concrete(value, name)
    if number is None:
        return value
    inside = low < number <= high if low_open else low <= number <= high  # False for NaN and inf
    whole = not integer or (inside and number == int(number))
    if not (inside and whole):
        kind = "an integer" if integer else "a finite number"
        show = lambda x: str(int(x)) if float(x).is_integer() else f"{x:g}"  # noqa: E731
        raise ValueError(f"{name} must be {kind} in {'(' if low_open else '['}{show(low)}, {show(high)}], "
                         f"got {value!r}")
    return int(number) if integer else value


def check_alpha(alpha, name: str = "alpha"):
    """alpha, the exponent of the strengths: finite, in (0, ALPHA_MAX] (0 makes p uniform and
    negative values reverse the metric; neither is SaGE).

    Examples:
      >>> check_alpha(0.0, "--alpha")
      Traceback (most recent call last):
      ValueError: --alpha must be a finite number in (0, 1000000], got 0.0"""
    return check_number(alpha, name, 0.0, ALPHA_MAX, low_open=True)


def check_weight(weight, name: str = "weight"):
    """The answers' weight in a blend: in [0, 1] (a convex mix of two cosines stays a cosine).

    Examples:
      >>> check_weight(1.5, "--rot-weight")
      Traceback (most recent call last):
      ValueError: --rot-weight must be a finite number in [0, 1], got 1.5"""
    return check_number(weight, name, 0.0, 1.0)


def _real_array(value, name: str, embeddings: bool = False) -> jax.Array:
    """`value` (integers or floats) in the metric's float type (`_real`), else a ValueError naming
    it; `embeddings`: also [batch, n, d] with d >= 1 (a zero-width vector has no direction)."""
    try:
        x = jnp.asarray(value)
    except (TypeError, ValueError):  # strings, objects, ragged lists
        got = f"dtype {value.dtype}" if hasattr(value, "dtype") else type(value).__name__
        raise ValueError(f"{name} must be an array of real numbers, got {got}") from None
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise ValueError(f"{name} must hold real numbers (integer or float), got dtype {x.dtype}")
    if embeddings and (x.ndim != 3 or x.shape[-1] == 0):
        raise ValueError(f"{name} must be [batch, n, d] with d >= 1, got shape {x.shape}")
    return x.astype(_real(x.dtype))


def _gram(x: jax.Array) -> jax.Array:
    """[b, n, d] -> [b, n, n] inner products of each question's vectors: a batched dot. On XLA:CPU (jax
    0.10) it and the alternatives all go to the YNNPACK backend, where, measured on 100,000 x 5 x 384 in
    blocks of BLOCK questions, the dot beats a broadcast multiply-and-reduce (with or without a lanes
    split of d) by about 1.4x; forms that slice pairs out (the C(n, 2) upper triangle, shifted copies)
    leave YNNPACK and run 2-8x slower (benchmarks/results/sage_pipeline.json, metric.profile)."""
    return jnp.einsum("bid,bjd->bij", x, x, precision=jax.lax.Precision.HIGHEST)


# Squared norms inside this range give float32 products that neither overflow nor lose precision.
_SAFE_SQ_NORM = (2.0 ** -60, 2.0 ** 60)


def _cosines(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(cosines [b, n, n] in [-1, 1], squared norms [b, n]) from one Gram matrix; a vector whose
    squared norm is 0 (or not finite) gets 0 similarity."""
    gram = _gram(x)
    sq_norm = jnp.diagonal(gram, axis1=-2, axis2=-1)
    good = jnp.isfinite(sq_norm) & (sq_norm > 0)
    inv = jnp.where(good, jax.lax.rsqrt(jnp.where(good, sq_norm, 1.0)), 0.0)
    sim = jnp.clip(gram * inv[:, :, None] * inv[:, None, :], -1.0, 1.0)
    return jnp.where(good[:, :, None] & good[:, None, :], sim, 0.0), sq_norm


# Scale: the cosine ignores a vector's length, and so does this code: each vector is divided by its
# largest |entry| before the products, so entries of 1e30 or 1e-30 (or a mix) give the same scores
# as unit vectors instead of overflowing float32. Memory is O(batch * n^2 + batch * n * d): one Gram
# matrix per question of the rescaled vectors, normalized by its diagonal.
def _rescaled_cosines(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The cosines of vectors first divided by their largest |entry| (every entry in [-1, 1],
    every nonzero squared norm in [1, d]), and `ok`: the vector is finite."""
    ok = jnp.all(jnp.isfinite(x), axis=-1)
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    usable = ok[..., None] & (scale > 0)
    return _cosines(jnp.where(usable, x / jnp.where(usable, scale, 1.0), 0.0))[0], ok


def pairwise_cosine(embeddings: jax.Array, mask: jax.Array | None = None
                    ) -> tuple[jax.Array, jax.Array]:
    """Cosine similarity of every pair of texts of each question.

    Args:
      embeddings: [batch, n, d] float.
      mask: [batch, n] bool, the positions whose cosines are used (None: all).

    Returns:
      (similarity [batch, n, n] float32 in [-1, 1], ok [batch, n] bool): `ok` is False for vectors
      holding a NaN/inf; their rows and columns of `similarity` are 0, as are an all-zero vector's.
      At masked positions `ok` may also be False for a finite vector.

    Examples:
      >>> similarity, ok = jax.jit(pairwise_cosine)(jnp.array([[[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]]]))  # or eagerly
      >>> print(similarity[0], ok)
      [[1. 0. 1.]
       [0. 1. 0.]
       [1. 0. 1.]] [[ True  True  True]]"""
    x = _real_array(embeddings, "embeddings", True)
    mask = _default_mask(x.shape[:2], mask)
    # The cosine is scale-invariant, float32 products are not: 1e20^2 overflows to inf and
    # 1e-30^2 underflows to 0. One Gram matrix of the vectors as they are serves when every used
    # squared norm is in the safe range; otherwise (a zero, tiny, huge or non-finite vector) the
    # cosines are computed again on rescaled vectors, a pass that ordinary embeddings never pay.
    sim, sq_norm = _cosines(x)
    safe = (sq_norm >= _SAFE_SQ_NORM[0]) & (sq_norm <= _SAFE_SQ_NORM[1])
    sim, ok = jax.lax.cond(jnp.all(safe | ~mask), lambda: (sim, jnp.isfinite(sq_norm)),
                           lambda: _rescaled_cosines(x))
    return sim.astype(_real(x.dtype)), ok


def blend_similarity(sim_answers: jax.Array, sim_rots: jax.Array, weight: float = 0.8) -> jax.Array:
    """The reference's `use_rots` edge weights: weight * cos(answers) + (1 - weight) * cos(RoTs),
    of sim_answers and sim_rots [batch, n, n] -> [batch, n, n]; weight in [0, 1].

    Examples:
      >>> print(blend_similarity(jnp.ones((1, 2, 2)), jnp.zeros((1, 2, 2)), weight=0.75))
      [[[0.75 0.75]
        [0.75 0.75]]]"""
    weight = check_weight(weight)
    sim_answers = _real_array(sim_answers, "sim_answers")
    sim_rots = _real_array(sim_rots, "sim_rots")
    if sim_answers.shape != sim_rots.shape:
        raise ValueError(f"sim_answers {sim_answers.shape} and sim_rots {sim_rots.shape} differ")
    return weight * sim_answers + (1.0 - weight) * sim_rots


def _default_mask(shape: tuple[int, ...], mask: jax.Array | None) -> jax.Array:
    if mask is None:
        return jnp.ones(shape, dtype=bool)
    mask = jnp.asarray(mask)
    if mask.shape != shape:
        raise ValueError(f"mask must be [batch, n] = {shape}, got {mask.shape}")
    if not (mask.dtype == bool or jnp.issubdtype(mask.dtype, jnp.integer) or jnp.issubdtype(mask.dtype, jnp.floating)):
        raise ValueError(f"mask must hold booleans or 0 / 1, got dtype {mask.dtype}")
    wrong = [] if mask.dtype == bool or isinstance(mask, jax.core.Tracer) else jnp.argwhere((mask != 0) & (mask != 1))
    if len(wrong):
        i, j = (int(v) for v in wrong[0])
        raise ValueError(f"mask must hold booleans or 0 / 1; mask[{i}, {j}] = {mask[i, j].item()!r}")
    return mask.astype(bool)


# `groups` reproduces the reference's collapsing of identical strings: docs/api/metric.md, "groups".
def _check_groups(groups: jax.Array | None, shape: tuple[int, ...]) -> jax.Array | None:
    if groups is None:
        return None
    groups = jnp.asarray(groups)
    if groups.shape != shape:
        raise ValueError(f"groups must be [batch, n] = {shape}, got {groups.shape}")
    if not jnp.issubdtype(groups.dtype, jnp.integer):
        raise ValueError(f"groups must hold integer ids, got dtype {groups.dtype}")
    return groups


# Precision, bad vectors (NaN scores) and the range: docs/api/metric.md, "Precision and bad vectors".
def _sage_core(similarity: jax.Array, valid: jax.Array, groups: jax.Array | None,
               alpha: jax.Array) -> jax.Array:
    """SaGE from similarities. similarity [b, n, n], valid [b, n] bool, groups [b, n] or None -> [b]."""
    n = similarity.shape[-1]
    sim = similarity.astype(_real(similarity.dtype))
    eye = jnp.eye(n, dtype=bool)[None]
    pair = valid[:, :, None] & valid[:, None, :] & ~eye                      # [b, n, n]
    # Not a cosine (NaN, inf, or beyond [-1, 1] by more than float32 rounding): the question is
    # skipped, not scored outside SaGE's range.
    usable = jnp.abs(sim) <= 1.0 + SIMILARITY_TOLERANCE                          # False for NaN
    bad = jnp.any(pair & ~usable, axis=(-2, -1))                             # [b]
    w = jnp.where(pair & usable, jnp.clip(sim, -1.0, 1.0), 0.0)
    # Symmetrize: the reference has one undirected edge per pair.
    w = 0.5 * (w + jnp.swapaxes(w, -1, -2))
    strength = EPSILON + jnp.sum(jnp.maximum(w, 0.0), axis=-1)               # [b, n]

    if groups is None:
        same = eye & valid[:, :, None]                                        # node = position
    else:
        same = (groups[:, :, None] == groups[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    earlier = jnp.tril(jnp.ones((n, n), dtype=bool), k=-1)[None]            # j < i
    # The first valid member of each group stands for the group.
    representative = valid & ~jnp.any(same & earlier, axis=-1)              # [b, n]
    k = jnp.sum(representative, axis=-1).astype(sim.dtype)                   # [b] distinct nodes
    n_valid = jnp.sum(valid, axis=-1)

    # p over nodes in log space: s^alpha under/overflows float32 (1e-20^10 = 1e-200).
    group_strength = jnp.sum(jnp.where(same, strength[:, None, :], 0.0), axis=-1)  # [b, n]
    logits = jnp.where(representative, alpha * jnp.log(group_strength), -jnp.inf)
    log_norm = jax.nn.logsumexp(jnp.where(representative, logits, -1e30), axis=-1, keepdims=True)
    log_p = jnp.where(representative, logits - log_norm, 0.0)
    p = jnp.where(representative, jnp.exp(log_p), 0.0)
    entropy = -jnp.sum(p * log_p, axis=-1)                                   # [b]
    log_k = jnp.log(jnp.maximum(k, 2.0))
    h = entropy / log_k

    # lambda: the mean of W over the n_valid(n_valid - 1)/2 pairs of valid positions (with groups
    # too: the reference's `avg` counts the edges between identical texts).
    n_pairs = n_valid.astype(sim.dtype) * (n_valid - 1).astype(sim.dtype) / 2.0
    lam = 0.5 * jnp.sum(w, axis=(-2, -1)) / jnp.maximum(n_pairs, 1.0)

    score = jnp.clip(lam * h, -1.0, 1.0)  # |lam| <= 1 and H <= 1 but for float32 rounding
    score = jnp.where(k >= 2, score, jnp.where(n_valid >= 2, 0.0, jnp.nan))  # k = 1: collapsed
    return jnp.where(bad | ~((alpha > 0) & (alpha <= ALPHA_MAX)), jnp.nan, score)  # a traced bad alpha


def _in_blocks(fn, arrays: tuple, block: int = BLOCK) -> jax.Array:
    """fn(*arrays) for [batch, ...] arrays (None allowed), `block` questions at a time -> [batch].

    XLA on CPU runs one huge batch of tiny [n, d] x [d, n] products poorly (7x slower on 100,000 x 5
    x 384 than in blocks of 32); a loop over cache-sized blocks of questions keeps each block's
    vectors in cache while they are used. Each step slices the inputs in place (dynamic_slice), so
    nothing is padded."""
    batch = next(a for a in arrays if a is not None).shape[0]
    n_blocks, rest = divmod(batch, block)
    if n_blocks <= 1:
        return fn(*arrays)
    take = lambda start, size: tuple(  # noqa: E731
        None if a is None else jax.lax.dynamic_slice_in_dim(a, start, size) for a in arrays)

    def body(i, out):
        return jax.lax.dynamic_update_slice_in_dim(out, fn(*take(i * block, block)), i * block, 0)

    dtype = _real(next(a for a in arrays if a is not None).dtype)
    out = jax.lax.fori_loop(0, n_blocks, body, jnp.zeros((n_blocks * block,), dtype))
    if rest:
        out = jnp.concatenate([out, fn(*take(n_blocks * block, rest))])
    return out


def _from_embeddings(embeddings, mask, groups, alpha):
    sim, ok = pairwise_cosine(embeddings, mask)
    # A bad vector at a valid position poisons the question: NaN, counted as skipped.
    bad = jnp.any(mask & ~ok, axis=-1)
    return jnp.where(bad, jnp.nan, _sage_core(sim, mask, groups, alpha))


def _from_blend(answers, rots, mask, groups, alpha, weight):
    sim_a, ok_a = pairwise_cosine(answers, mask)
    sim_r, ok_r = pairwise_cosine(rots, mask)
    bad = jnp.any(mask & ~(ok_a & ok_r), axis=-1)
    score = _sage_core(blend_similarity(sim_a, sim_r, weight), mask, groups, alpha)
    return jnp.where(bad | ~((weight >= 0) & (weight <= 1)), jnp.nan, score)


@jax.jit
def _sage_from_similarity_jit(similarity, mask, groups, alpha):
    return _in_blocks(lambda s, m, g: _sage_core(s, m, g, alpha), (similarity, mask, groups))


@jax.jit
def _sage_jit(embeddings, mask, groups, alpha):
    return _in_blocks(lambda e, m, g: _from_embeddings(e, m, g, alpha), (embeddings, mask, groups))


@jax.jit
def _sage_blend_jit(answers, rots, mask, groups, alpha, weight):
    return _in_blocks(lambda a, r, m, g: _from_blend(a, r, m, g, alpha, weight), (answers, rots, mask, groups))


def sage_blend(answer_embeddings: jax.Array, rot_embeddings: jax.Array, mask: jax.Array | None = None, *,
               weight: float = 0.8, alpha: float = DEFAULT_ALPHA, groups: jax.Array | None = None
               ) -> jax.Array:
    """SaGE with the reference's `use_rots` edges: weight * cos(answers) + (1 - weight) * cos(RoTs).

    Args:
      answer_embeddings, rot_embeddings: [batch, n, d] (position i = the answer and the rule of
        thumb of paraphrase i).
      mask: [batch, n] bool; a position counts when both its texts are there.
      weight: in [0, 1]; alpha: in (0, ALPHA_MAX].
      groups: optional [batch, n] int (e.g. identical answers); see `sage_from_similarity`.
    Returns:
      [batch] float32 in [-1, 1]; NaN as in `sage`, for either embedding.

    Examples:
      >>> answers, rots = jnp.ones((1, 3, 2)), jnp.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]])
      >>> print([round(float(s), 4) for s in sage_blend(answers, rots, weight=0.8)])
      [0.7838]"""
    answer_embeddings = _real_array(answer_embeddings, "answer_embeddings", True)
    rot_embeddings = _real_array(rot_embeddings, "rot_embeddings", True)
    if answer_embeddings.shape[:2] != rot_embeddings.shape[:2]:
        raise ValueError(f"answer {answer_embeddings.shape} and RoT {rot_embeddings.shape} embeddings "
                         "must both be [batch, n, d] with the same batch and n")
    mask = _default_mask(answer_embeddings.shape[:2], mask)
    groups = _check_groups(groups, answer_embeddings.shape[:2])
    real = _real(answer_embeddings.dtype)
    return _sage_blend_jit(answer_embeddings, rot_embeddings, mask, groups, jnp.asarray(check_alpha(alpha), real),
                           jnp.asarray(check_weight(weight), real))


def sage_from_similarity(similarity: jax.Array, mask: jax.Array | None = None, *,
                         alpha: float = DEFAULT_ALPHA, groups: jax.Array | None = None) -> jax.Array:
    """SaGE of each question from its pairwise similarities (edge weights).

    Args:
      similarity: [batch, n, n] float; only the off-diagonal entries between valid positions are
        read (the matrix is symmetrized).
      mask: [batch, n] bool or 0 / 1 (values checked when concrete); None means all valid.
      alpha: exponent of the strengths (10), in (0, ALPHA_MAX]; traced under jit, outside it: NaN.
      groups: optional [batch, n] int, equal ids within a row = identical text; reproduces the
        reference's collapsing of identical strings (docs/api/metric.md, "groups").

    Returns:
      [batch] float32 in [-1, 1]; NaN for rows with fewer than 2 valid texts or a similarity that
      is non-finite or outside [-1, 1] (beyond SIMILARITY_TOLERANCE).

    Examples:
      >>> similarity = jnp.array([[[1.0, 0.5, 0.5], [0.5, 1.0, 0.5], [0.5, 0.5, 1.0]]])
      >>> print([round(float(s), 4) for s in sage_from_similarity(similarity)])  # lambda 0.5, H 1
      [0.5]"""
    similarity = _real_array(similarity, "similarity")
    if similarity.ndim != 3 or similarity.shape[-1] != similarity.shape[-2]:
        raise ValueError(f"similarity must be [batch, n, n], got shape {similarity.shape}")
    mask = _default_mask(similarity.shape[:2], mask)
    groups = _check_groups(groups, similarity.shape[:2])
    return _sage_from_similarity_jit(similarity, mask, groups,
                                     jnp.asarray(check_alpha(alpha), _real(similarity.dtype)))


def sage(embeddings: jax.Array, mask: jax.Array | None = None, *, alpha: float = DEFAULT_ALPHA,
         groups: jax.Array | None = None) -> jax.Array:
    """SaGE of each question from its text embeddings (cosine similarities).

    Args:
      embeddings: [batch, n, d] integers or floats, d >= 1 (checked eagerly and under jit).
      mask: [batch, n] bool or 0 / 1 (values checked when concrete); None means all valid.
      alpha: exponent of the strengths (10), in (0, ALPHA_MAX]; traced under jit, outside it: NaN.
      groups: optional [batch, n] int; see `sage_from_similarity`.

    Returns:
      [batch] float32 in [-1, 1], whatever the scale of the vectors; NaN for rows with fewer than 2
      valid texts or a valid text whose vector holds a NaN/inf. An all-zero vector has cosine 0
      with every text (finite score).

    Examples:
      >>> same, split = [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]
      >>> print([round(float(s), 4) for s in sage(jnp.array([same, split]))])
      [1.0, 0.2103]"""
    embeddings = _real_array(embeddings, "embeddings", True)
    mask = _default_mask(embeddings.shape[:2], mask)
    groups = _check_groups(groups, embeddings.shape[:2])
    return _sage_jit(embeddings, mask, groups, jnp.asarray(check_alpha(alpha), _real(embeddings.dtype)))


@jax.jit
def _mean_sage_jit(scores):
    finite = ~jnp.isnan(scores)
    count = jnp.sum(finite)
    mean = jnp.sum(jnp.where(finite, scores, 0.0)) / jnp.where(count > 0, count, jnp.nan)
    return mean, jnp.sum(~finite).astype(jnp.int32)


def mean_sage(scores: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean of per-question scores, ignoring NaN (the skipped questions).

    Args:
      scores: [batch] float, each NaN or in [-1, 1]. Strings, bools and complex numbers are a
        ValueError, eagerly and under jit (True is no score of 1). Concrete scores holding an inf
        or a value outside [-1, 1] (beyond SIMILARITY_TOLERANCE) are a ValueError: no SaGE score
        is either, and averaging one in would report a number outside the metric's range.
    Returns:
      (mean, n_skipped): float32 scalar (NaN if every score is NaN) and int32 scalar.

    Examples:
      >>> print(*mean_sage(jnp.array([0.5, jnp.nan, 1.0])))  # the mean of 0.5 and 1.0; 1 skipped
      0.75 1"""
    scores = _real_array(scores, "scores").astype(jnp.float32)
    if scores.ndim != 1:
        raise ValueError(f"scores must be [batch], got shape {scores.shape}")
    traced = isinstance(scores, jax.core.Tracer)  # NaN compares False below
    wrong = [] if traced else jnp.flatnonzero(jnp.abs(scores) > 1.0 + SIMILARITY_TOLERANCE)
    if len(wrong):
        raise ValueError(f"scores must be NaN or in [-1, 1]; scores[{int(wrong[0])}] = {float(scores[wrong[0]])} "
                         f"({len(wrong)} such value{'s' if len(wrong) > 1 else ''})")
    return _mean_sage_jit(scores)


def sage_chunked(embeddings, mask=None, *, groups=None, similarity=None, rot_embeddings=None,
                 blend_weight: float = 0.8, alpha: float = DEFAULT_ALPHA, chunk_size: int = 8192,
                 on_chunk=None) -> jax.Array:
    """Stream any number of questions through one compiled shape, `chunk_size` at a time.

    The inputs may live on the host (numpy arrays, memory maps): only one chunk is on the device at a
    time, and the last chunk is padded (its padding rows are masked and dropped).

    Args:
      embeddings: [N, n, d], or None when `similarity` is given.
      mask: [N, n] bool or None (all valid).
      groups: [N, n] int or None.
      similarity: [N, n, n] precomputed edge weights instead of embeddings.
      rot_embeddings: [N, n, d] RoT embeddings: blend with `embeddings` (`sage_blend`).
      blend_weight: weight of the answers' cosine in the blend, in [0, 1].
      alpha: exponent of the strengths, in (0, ALPHA_MAX].
      chunk_size: questions per compiled call, an integer >= 1.
      on_chunk: optional callback(n_done, n_total) after each chunk (a progress bar).

    Returns:
      [N] float32 scores.

    Examples:
      >>> same, split = [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]
      >>> x = jnp.array([same, split, split, same])
      >>> print([round(float(s), 4) for s in sage_chunked(x, chunk_size=2, on_chunk=print)])
      2 4
      4 4
      [1.0, 0.2103, 0.2103, 1.0]"""
    if (embeddings is None) == (similarity is None):
        raise ValueError("give exactly one of embeddings [N, n, d] and similarity [N, n, n]")
    if rot_embeddings is not None and (embeddings is None or rot_embeddings.shape[:2] != embeddings.shape[:2]):
        raise ValueError("rot_embeddings need answer embeddings of the same [N, n]")
    if rot_embeddings is not None:  # dtypes and widths from the first rows (a memory map stays put)
        _real_array(rot_embeddings[:1], "rot_embeddings", True)
    source = embeddings if similarity is None else similarity
    if len(source.shape) != 3:
        raise ValueError(f"expected a 3-d array [N, n, ...], got shape {tuple(source.shape)}")
    _real_array(source[:1], "embeddings" if similarity is None else "similarity", similarity is None)
    total, n = source.shape[0], source.shape[1]
    if mask is not None:
        _default_mask((total, n), mask)  # its shape and values, once
    chunk_size = min(check_number(chunk_size, "chunk_size", 1, 2**31 - 1, integer=True), max(total, 1))
    real = _real(jnp.asarray(source[:0]).dtype)
    alpha = jnp.asarray(check_alpha(alpha), real)
    blend_weight = check_weight(blend_weight, "blend_weight")
    outputs = []
    _pad_rows = lambda x, rows: jnp.concatenate(  # noqa: E731
        [x, jnp.zeros((rows - x.shape[0],) + x.shape[1:], x.dtype)]) if rows > x.shape[0] else x
    for start in range(0, total, chunk_size):
        stop = min(start + chunk_size, total)
        rows = stop - start
        x = _pad_rows(jnp.asarray(source[start:stop]), chunk_size)
        m = (jnp.ones((rows, n), bool) if mask is None else jnp.asarray(mask[start:stop]).astype(bool))
        m = _pad_rows(m, chunk_size)
        g = None if groups is None else _pad_rows(jnp.asarray(groups[start:stop]), chunk_size)
        if rot_embeddings is not None:
            r = _pad_rows(jnp.asarray(rot_embeddings[start:stop]), chunk_size)
            out = _sage_blend_jit(x, r, m, g, alpha, jnp.asarray(blend_weight, real))
        elif similarity is None:
            out = _sage_jit(x, m, g, alpha)
        else:
            out = _sage_from_similarity_jit(x, m, g, alpha)
        outputs.append(out[:rows])
        if on_chunk is not None:
            on_chunk(stop, total)
    if not outputs:
        return jnp.zeros((0,), real)
    return jnp.concatenate(outputs)
