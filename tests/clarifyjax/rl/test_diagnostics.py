"""What a PPO run reports beside its means (clarifyjax.rl.diagnostics, the update's metrics and the
rollouts' group baseline), against scipy and numpy written here."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from clarifyjax.rl import ppo
from clarifyjax.rl.diagnostics import mean_se, paired_gain, question_stats, t_interval
from clarifyjax.rl.rollout import group_baseline


@pytest.mark.parametrize("n", [2, 3, 5, 12, 31, 40])
def test_t_interval_and_standard_error_equal_scipys(n):
    x = np.random.default_rng(n).normal(0.3, 1.2, n)
    low, high = t_interval(x)
    ref = stats.t.interval(0.95, n - 1, loc=x.mean(), scale=stats.sem(x))
    assert (low, high) == pytest.approx(ref, rel=1e-5)
    assert mean_se(x)[1] == pytest.approx(stats.sem(x))


def test_paired_gain_is_the_mean_and_standard_error_of_the_differences():
    rng = np.random.default_rng(0)
    before = rng.normal(size=64)
    after = before + 0.2 + rng.normal(scale=0.1, size=64)
    gain, se = paired_gain(before, after)
    assert gain == pytest.approx(np.mean(after - before))
    assert se == pytest.approx(stats.sem(after - before))
    with pytest.raises(ValueError, match="same situations"):
        paired_gain(before, after[:-1])
    assert np.isnan(mean_se([1.0])[1]) and np.isnan(mean_se([])[0])


def test_question_stats_name_a_collapsed_policy():
    qs = ["What are you?"] * 7 + ["Why  did you go?", "What are you?\n"]
    s = question_stats(qs)
    assert s["distinct"] == 2 and s["top"][0] == ["What are you?", 8]
    assert s["top_share"] == pytest.approx(8 / 9)
    assert s["mean_words"] == pytest.approx((8 * 3 + 4) / 9)
    assert s["top5_share"] == 1.0 and s["distinct_share"] == pytest.approx(2 / 9)
    # distinct-2 against nltk's n-grams: 5 distinct bigrams ("What are", "are you?" and the other
    # question's 3) of 8 * 2 + 3 = 19
    from nltk.util import ngrams

    grams = [g for q in qs for g in ngrams(q.split(), 2)]
    assert s["distinct_2"] == pytest.approx(len(set(grams)) / len(grams)) == pytest.approx(5 / 19)
    spread = question_stats([f"q{i} a b" for i in range(20)])
    assert spread["top_share"] == 0.05 and spread["top5_share"] == 0.25
    assert spread["distinct_2"] == pytest.approx(21 / 40)  # "a b" repeats


def test_group_baseline_is_leave_one_out():
    r = np.array([1.0, 2.0, 3.0, 10.0, 10.0, 13.0])
    got = group_baseline(r, 3)
    want = [1 - 2.5, 2 - 2.0, 3 - 1.5, 10 - 11.5, 10 - 11.5, 13 - 10]
    assert got == pytest.approx(want)
    assert group_baseline(r + 100.0, 3) == pytest.approx(want)  # the situation's level cancels
    with pytest.raises(ValueError, match="groups of 4"):
        group_baseline(r, 4)


def test_explained_variance_and_the_ratios_range():
    rng = np.random.default_rng(1)
    returns = rng.normal(size=(4, 6)).astype(np.float32)
    mask = np.ones((4, 6), np.float32)
    mask[0, 4:] = 0
    m = mask > 0
    assert float(ppo.explained_variance(jnp.asarray(returns), jnp.asarray(returns), mask)) == 1.0
    values = returns + rng.normal(scale=0.5, size=returns.shape).astype(np.float32)
    want = 1 - np.var((returns - values)[m]) / np.var(returns[m])
    assert float(ppo.explained_variance(values, returns, mask)) == pytest.approx(want, rel=1e-5)
    logp = rng.normal(size=(4, 6)).astype(np.float32)
    old = logp + rng.normal(scale=0.1, size=logp.shape).astype(np.float32)
    _, metrics = ppo.policy_loss(logp, old, np.ones_like(logp), mask)
    ratio = np.exp(logp - old)[m]
    assert float(metrics["ratio_min"]) == pytest.approx(ratio.min(), rel=1e-5)
    assert float(metrics["ratio_max"]) == pytest.approx(ratio.max(), rel=1e-5)
    assert float(metrics["approx_kl_k3"]) == pytest.approx(np.mean(ratio - 1 - np.log(ratio)),
                                                          rel=1e-4)
