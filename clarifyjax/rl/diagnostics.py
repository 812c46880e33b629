"""What a PPO run's evaluation reports beside its means: their noise, and a policy's collapse.

Pure numpy, so the training loop, `benchmarks/ppo_seeds.py` and research code agree: `mean_se`
(mean and standard error), `paired_gain` (a policy's gain over its start on the same situations),
`question_stats` (distinct questions, the shares of the most common one and five, distinct-2:
collapse onto "What are you?" is named and measured) and `t_interval` (a 95% Student's t interval
over a few seeds)."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (scipy.stats.t.ppf(0.975,
# df), to 6 decimals); beyond 30, the Cornish-Fisher expansion around the normal's (error < 1e-7).
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004,
         2.262157, 2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.13145, 2.119905, 2.109816,
         2.100922, 2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529,
         2.051831, 2.048407, 2.04523, 2.042272)
_Z975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df <= len(_T975):
        return _T975[df - 1]
    z, v = _Z975, float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


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
    q = t_quantile_975(n - 1)
    return mean - q * se, mean + q * se


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Distinct n-grams of words over all n-grams of the texts (Li et al., 2016's distinct-n, over
    the whole set): 1 when no n-gram repeats, near 0 when every text is the same."""
    grams = [tuple(words[i:i + n]) for words in (t.split() for t in texts)
             for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else math.nan


def question_stats(questions: Sequence[str], top: int = 5) -> dict:
    """Distinct questions (count and share of the rows), their mean length in words, the `top`
    most frequent (text, count), the shares of the rows that got the single most common question
    and the five most common, and distinct-2 across the set."""
    texts = [" ".join(str(q).split()) for q in questions]
    if not texts:
        return {"distinct": 0, "distinct_share": math.nan, "mean_words": math.nan, "top": [],
                "top_share": math.nan, "top5_share": math.nan, "distinct_2": math.nan}
    counts = Counter(texts)
    ranked = counts.most_common(max(top, 5))
    return {"distinct": len(counts), "distinct_share": len(counts) / len(texts),
            "mean_words": float(np.mean([len(t.split()) for t in texts])),
            "top": [[text, n] for text, n in ranked[:top]],
            "top_share": ranked[0][1] / len(texts),
            "top5_share": sum(n for _, n in ranked[:5]) / len(texts),
            "distinct_2": distinct_n(texts, 2)}
