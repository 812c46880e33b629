"""The statistics of the experiments: bootstrap intervals, correlations, entropy and Krippendorff's
alpha, in numpy alone (the tests compare them with scipy and the `krippendorff` package).
`bootstrap_interval` is `scipy.stats.bootstrap`'s algorithm step for step, so the same seed gives
the same interval."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist

import numpy as np

METHODS = ("BCa", "percentile", "basic")


def _ndtr(x: np.ndarray) -> np.ndarray:
    """The standard normal CDF (scipy.special.ndtr)."""
    flat = [0.5 * math.erfc(-v / math.sqrt(2.0)) if math.isfinite(v) else (1.0 if v > 0 else 0.0)
            if not math.isnan(v) else math.nan for v in np.ravel(np.asarray(x, np.float64))]
    return np.asarray(flat, np.float64).reshape(np.shape(x))


def _ndtri(p: float) -> float:
    """The standard normal quantile function (scipy.special.ndtri), infinite at 0 and 1."""
    if math.isnan(p):
        return math.nan
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return math.inf
    return NormalDist().inv_cdf(p)


# `scipy.stats.bootstrap`'s algorithm, step for step, so that the same seed gives the same interval:
# the resamples are `np.random.default_rng(seed).integers(0, n, (resamples, n))` drawn at once
# (scipy's `rng_integers` with `batch=None`), the statistic is computed on each row of indices
# (paired samples share their indices, as `paired=True`), and the interval is the percentile, basic
# or BCa one (BCa: bias correction from the share of resampled statistics below and at the estimate,
# acceleration from the jackknife, Efron & Tibshirani 14.3 and 15.4) at the linear quantiles. A
# resample on which a statistic is undefined (a correlation of a constant) gives NaN, and then so
# does the interval, as scipy's.
def bootstrap_interval(statistic: Callable[[np.ndarray], np.ndarray], n: int, *, resamples: int = 9999,
                       seed: int = 0, confidence: float = 0.95, method: str = "BCa") -> tuple[float, float]:
    """The two-sided interval of `statistic` over `n` paired observations.

    statistic: [..., m] integer indices of observations -> [...] values (it gathers its own data,
    so several paired columns resample together). NaN, NaN when n < 2."""
    if method not in METHODS:
        raise ValueError(f"bootstrap method must be one of {', '.join(METHODS)}, got {method!r}")
    if n < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    index = rng.integers(0, n, (resamples, n))
    with np.errstate(invalid="ignore", divide="ignore"):
        theta_b = np.asarray(statistic(index), np.float64)
        alpha = (1.0 - confidence) / 2.0
        levels = np.array([alpha, 1.0 - alpha])
        if method == "BCa":
            levels = _bca_levels(statistic, n, theta_b, alpha)
        if np.isnan(theta_b).any() or np.isnan(levels).any():
            return math.nan, math.nan
        low, high = np.quantile(theta_b, levels)
        if method == "basic":
            theta = float(statistic(np.arange(n)))
            low, high = 2 * theta - high, 2 * theta - low
    return float(low), float(high)


def _bca_levels(statistic, n: int, theta_b: np.ndarray, alpha: float) -> np.ndarray:
    theta = float(statistic(np.arange(n)))
    share = (np.count_nonzero(theta_b < theta) + np.count_nonzero(theta_b <= theta)) / (2 * theta_b.size)
    z0 = _ndtri(float(share))
    jackknife = np.array([np.delete(np.arange(n), i) for i in range(n)])  # [n, n - 1]
    theta_i = np.asarray(statistic(jackknife), np.float64)
    u = (n - 1) * (theta_i.mean() - theta_i)
    a_hat = 1 / 6 * (np.sum(u ** 3) / n ** 3) / (np.sum(u ** 2) / n ** 2) ** 1.5
    z_alpha = _ndtri(alpha)
    levels = []
    for z in (z_alpha, -z_alpha):
        num = z0 + z
        levels.append(_ndtr(np.float64(z0 + num / (1 - a_hat * num))))
    return np.array(levels, np.float64)


def finite_pairs(*columns: Sequence[float]) -> list[np.ndarray]:
    """The columns restricted to the rows where every one of them is finite (float64)."""
    arrays = [np.asarray(c, np.float64) for c in columns]
    keep = np.logical_and.reduce([np.isfinite(a) for a in arrays])
    return [a[keep] for a in arrays]


def mean_interval(values: Sequence[float], **settings) -> dict:
    """mean, its bootstrap interval and the count, over the finite values."""
    (x,) = finite_pairs(values)
    if x.size == 0:
        return {"mean": None, "low": None, "high": None, "n": 0}
    low, high = bootstrap_interval(lambda i: x[i].mean(axis=-1), x.size, **settings)
    return {"mean": float(x.mean()), "low": _number(low), "high": _number(high), "n": int(x.size)}


def paired_difference(a: Sequence[float], b: Sequence[float], **settings) -> dict:
    """mean(a - b) over the rows where both are finite, with its bootstrap interval."""
    x, y = finite_pairs(a, b)
    d = x - y
    if d.size == 0:
        return {"mean": None, "low": None, "high": None, "n": 0}
    low, high = bootstrap_interval(lambda i: d[i].mean(axis=-1), d.size, **settings)
    return {"mean": float(d.mean()), "low": _number(low), "high": _number(high), "n": int(d.size)}


def _number(value: float):
    return None if value is None or not math.isfinite(value) else float(value)


def pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r along the last axis, clipped to [-1, 1], NaN for a constant; in scipy.stats.pearsonr's
    order of operations (each centred column scaled by its largest entry before its norm), so
    that a resample holding the sample's values in another order gives the same float as scipy's."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    constant = np.all(x == x[..., :1], axis=-1) | np.all(y == y[..., :1], axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        xm = x - x.mean(axis=-1, keepdims=True)
        ym = y - y.mean(axis=-1, keepdims=True)
        xmax = np.max(np.abs(xm), axis=-1, keepdims=True)
        ymax = np.max(np.abs(ym), axis=-1, keepdims=True)
        normx = xmax * np.linalg.vector_norm(xm / xmax, axis=-1, keepdims=True)
        normy = ymax * np.linalg.vector_norm(ym / ymax, axis=-1, keepdims=True)
        r = np.clip(np.vecdot(xm / normx, ym / normy, axis=-1), -1.0, 1.0)
    return np.where(constant, np.nan, r)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1 along the last axis, ties given their mean rank (scipy.stats.rankdata)."""
    x = np.asarray(x, np.float64)
    flat = x.reshape(-1, x.shape[-1])
    out = np.empty_like(flat)
    for r, row in enumerate(flat):
        s = np.sort(row)
        out[r] = (np.searchsorted(s, row, "left") + np.searchsorted(s, row, "right") + 1) / 2.0
    return out.reshape(x.shape)


def spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho along the last axis: Pearson's r of the average ranks."""
    return pearson(average_ranks(x), average_ranks(y))


CORRELATIONS = {"pearson": pearson, "spearman": spearman}


def correlation(x: Sequence[float], y: Sequence[float], kind: str = "pearson", **settings) -> dict:
    """The correlation of the finite pairs, with the bootstrap interval of the paired resamples."""
    a, b = finite_pairs(x, y)
    fn = CORRELATIONS[kind]
    if a.size < 2:
        return {"r": None, "low": None, "high": None, "n": int(a.size)}
    low, high = bootstrap_interval(lambda i: fn(a[i], b[i]), a.size, **settings)
    return {"r": _number(float(fn(a, b))), "low": _number(low), "high": _number(high), "n": int(a.size)}


def binary_entropy(yes: int, no: int) -> float:
    """The entropy in bits of a Y/N count (NaN without labels)."""
    total = yes + no
    if total == 0:
        return math.nan
    return float(-sum(p * math.log2(p) for p in (yes / total, no / total) if p > 0))


def krippendorff_alpha(data: np.ndarray) -> float:
    """Krippendorff's alpha, nominal, of [raters, units] labels (NaN: missing): 1 - D_o / D_e over
    the coincidence matrix of the units with two or more labels."""
    data = np.asarray(data, np.float64)
    values = np.unique(data[np.isfinite(data)])
    index = {v: k for k, v in enumerate(values)}
    o = np.zeros((len(values), len(values)))
    for unit in data.T:
        labels = [index[v] for v in unit[np.isfinite(unit)]]
        m = len(labels)
        if m < 2:
            continue
        counts = np.bincount(labels, minlength=len(values)).astype(np.float64)
        o += (np.outer(counts, counts) - np.diag(counts)) / (m - 1)
    n_c = o.sum(axis=1)
    n = n_c.sum()
    disagree = o.sum() - np.trace(o)
    expected = (n_c.sum() ** 2 - (n_c ** 2).sum()) / (n - 1) if n > 1 else 0.0
    return math.nan if expected == 0 else float(1.0 - disagree / expected)
