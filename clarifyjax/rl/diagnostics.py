"""What a PPO run's evaluation reports beside its means: their noise, and a policy's collapse.

Pure numpy over per-situation arrays and question texts, so that the training loop, the seed study
(`benchmarks/ppo_seeds.py`) and research code compute them the same way:

* `mean_se`: a mean over dev situations and its standard error (sample std / sqrt(n)).
* `paired_gain`: the gain of a policy over its start on the same situations, with the standard
  error of the per-situation differences (the situations' own difficulty cancels out).
* `question_stats`: how many distinct questions, their mean length in words, the most frequent
  ones and the share of the situations that receive the single most common question, so that a
  policy that asks "What are you?" of everything is named as such.
* `t_interval`: a 95% interval of a mean over a few seeds (Student's t).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (scipy.stats.t.ppf(0.975,
# df)); beyond 30, the normal's 1.96 is within 2%.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060,
         2.056, 2.052, 2.048, 2.045, 2.042)


def mean_se(values) -> tuple[float, float]:
    """(mean, standard error of the mean) over the finite values; SE is NaN for fewer than 2."""
    x = np.asarray(values, np.float64).ravel()
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan
    se = float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else math.nan
    return float(np.mean(x)), se


def paired_gain(before, after) -> tuple[float, float]:
    """(mean of after - before, its standard error) over the situations both score."""
    before, after = np.asarray(before, np.float64), np.asarray(after, np.float64)
    if before.shape != after.shape:
        raise ValueError(f"paired_gain: before {before.shape} and after {after.shape} must score "
                         "the same situations")
    return mean_se(after - before)


def t_interval(values, level: float = 0.95) -> tuple[float, float]:
    """The 95% Student's t interval of the mean of a few values (e.g. one gain per seed)."""
    if level != 0.95:
        raise ValueError("t_interval: only the 95% level is tabulated")
    mean, se = mean_se(values)
    n = int(np.isfinite(np.asarray(values, np.float64)).sum())
    if n < 2:
        return math.nan, math.nan
    q = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    return mean - q * se, mean + q * se


def question_stats(questions: Sequence[str], top: int = 5) -> dict:
    """Distinct questions, their mean length in words, the `top` most frequent (text, count), and
    the share of the rows that got the single most common question."""
    texts = [" ".join(str(q).split()) for q in questions]
    if not texts:
        return {"distinct": 0, "mean_words": math.nan, "top": [], "top_share": math.nan}
    counts = Counter(texts)
    ranked = counts.most_common(top)
    return {"distinct": len(counts),
            "mean_words": float(np.mean([len(t.split()) for t in texts])),
            "top": [[text, n] for text, n in ranked],
            "top_share": ranked[0][1] / len(texts)}
