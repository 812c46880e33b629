"""Independent references for sage_jax.metric (test_sage_metric, test_sage_bench).

Written independently of the jitted code: one loop per question, float64, the definition of
docs/originals.md, SaGE; the collapsing reference keys a dict by text, as the reference code keys its graph
nodes. `random_questions` draws batches of questions with a spread of consistency levels.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

ALPHA = 10.0


# ----------------------------------------------------------------------------- numpy references


def numpy_sage(vectors: np.ndarray, alpha: float = ALPHA) -> float:
    """docs/originals.md, SaGE for one question, one node per text. vectors [k, d]."""
    k = len(vectors)
    if k < 2:
        return math.nan
    v = np.asarray(vectors, np.float64)
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    w = v @ v.T
    s = np.array([1e-20 + sum(max(w[i, j], 0.0) for j in range(k) if j != i) for i in range(k)])
    p = s ** alpha / np.sum(s ** alpha)
    h = -sum(pi * math.log(pi) for pi in p if pi > 0) / math.log(k)
    lam = np.mean([w[i, j] for i in range(k) for j in range(i + 1, k)])
    return float(lam * h)


def collapsed_reference(keys: list, pair_rows: list[tuple[int, int, float]], alpha: float = ALPHA) -> float:
    """The reference's graph keyed by text, from pair rows (i, j, weight) over positions.

    Strength of a node = sum over the pair rows touching any of its members (one 1e-20 per member);
    lambda = the reference's `avg`, the mean weight of every pair row (rows between identical texts
    included).
    """
    if len(keys) < 2:
        return math.nan
    strength: dict = defaultdict(float)
    for key in keys:
        strength[key] += 1e-20
    for i, j, w in pair_rows:
        strength[keys[i]] += max(w, 0.0)
        strength[keys[j]] += max(w, 0.0)
    k = len(strength)
    if k == 1:
        return 0.0  # all texts identical: the reference's "perfect agreement scores 0"
    s = np.array(list(strength.values()), np.float64)
    p = s ** alpha / np.sum(s ** alpha)
    h = -sum(pi * math.log(pi) for pi in p if pi > 0) / math.log(k)
    lam = np.mean([w for _, _, w in pair_rows])
    return float(lam * h)


def cosine_pair_rows(vectors: np.ndarray) -> list[tuple[int, int, float]]:
    v = np.asarray(vectors, np.float64)
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    return [(i, j, float(v[i] @ v[j])) for i in range(len(v)) for j in range(i + 1, len(v))]


def random_questions(rng, batch: int, n_max: int, d: int, with_groups: bool):
    """Questions with n in 1..n_max, a spread of consistency levels, and (optionally) duplicates."""
    n = rng.integers(1, n_max + 1, size=batch)
    mask = np.arange(n_max)[None, :] < n[:, None]
    base = rng.normal(size=(batch, 1, d))
    noise_scale = rng.choice([0.05, 0.3, 1.0, 3.0, 30.0], size=(batch, 1, 1))
    if with_groups:
        # Texts are drawn from a few distinct "strings": equal group ids share one vector.
        groups = rng.integers(0, rng.integers(1, n_max + 1, size=(batch, 1)), size=(batch, n_max))
        group_vecs = base + noise_scale * rng.normal(size=(batch, n_max, d))
        emb = np.take_along_axis(group_vecs, groups[:, :, None], axis=1)
    else:
        groups = None
        emb = base + noise_scale * rng.normal(size=(batch, n_max, d))
    emb = emb.astype(np.float32)
    emb[~mask] = 0.0
    return emb, mask, (None if groups is None else groups.astype(np.int32)), n
