"""The pure reward math (clarifyjax.reward.jsd): JSD, the defeasibility reward, the normalizer and the
paper's Table 4 quantities, against scipy and plain numpy loops written here.

`jsd` runs eagerly once (on the scipy comparison's rows, unnormalized), as does the normalizer;
the other calls go through one jitted wrapper per function, which compiles one program per shape
where eager dispatch compiles every primitive again for every new shape (seconds in all)."""
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clarifyjax.reward.jsd import (ORIGINAL_BIAS, ORIGINAL_GAIN, RewardNormalizer, average_jsd,
                               defeasibility_reward, flip_rate, jsd, judgment_flips)
from helpers.env import require

JSD = jax.jit(jsd, static_argnames=("axis", "base", "normalize"))
FLIP_RATE = jax.jit(flip_rate)
AVERAGE_JSD = jax.jit(average_jsd)
JUDGMENT_FLIPS = jax.jit(judgment_flips)
DEFEASIBILITY_REWARD = jax.jit(defeasibility_reward)


def _random_distributions(rng, n, k=3, zeros=True):
    p = rng.dirichlet(np.ones(k) * 0.7, size=n)
    if zeros:  # exact zeros in a quarter of the rows: 0 * log 0 must be 0
        drop = rng.random((n, k)) < 0.25
        drop[np.arange(n), rng.integers(0, k, n)] = False
        p = np.where(drop, 0.0, p)
        p /= p.sum(-1, keepdims=True)
    return p


@pytest.mark.reference
def test_jsd_equals_scipy_squared_distance():
    spatial = require("scipy.spatial")
    rng = np.random.default_rng(0)
    p, q = _random_distributions(rng, 1000), _random_distributions(rng, 1000)
    ours = np.asarray(JSD(p, q))
    ref = np.array([spatial.distance.jensenshannon(a, b, base=2) ** 2 for a, b in zip(p, q)])
    assert ours.shape == (1000,)
    np.testing.assert_allclose(ours, ref, atol=1e-6, rtol=0)
    # unnormalized inputs are normalized as scipy does (the original passed raw class probabilities)
    np.testing.assert_allclose(np.asarray(jsd(3.0 * p, 0.5 * q)), ref, atol=1e-6, rtol=0)
    # other axis and natural log
    np.testing.assert_allclose(np.asarray(JSD(p.T, q.T, axis=0, base=None)), ref * math.log(2),
                               atol=1e-6, rtol=0)


def test_jsd_properties():
    rng = np.random.default_rng(1)
    p, q = _random_distributions(rng, 64), _random_distributions(rng, 64)
    np.testing.assert_allclose(np.asarray(JSD(p, q)), np.asarray(JSD(q, p)), atol=1e-7)
    np.testing.assert_allclose(np.asarray(JSD(p, p)), 0.0, atol=1e-7)
    eye = np.eye(3)
    np.testing.assert_allclose(np.asarray(JSD(eye, eye[[1, 2, 0]])), 1.0, atol=1e-6)
    assert float(np.max(JSD(p, q))) <= 1.0 + 1e-6
    # gradients stay finite at zeros, and vmap works
    grad = jax.jit(jax.grad(lambda a: jsd(a, jnp.array([0.0, 0.5, 0.5])).sum()))
    assert np.all(np.isfinite(np.asarray(grad(jnp.array([1.0, 0.0, 0.0])))))
    v = jax.jit(jax.vmap(jsd))(jnp.asarray(p), jnp.asarray(q))
    np.testing.assert_allclose(np.asarray(v), np.asarray(JSD(p, q)), atol=1e-7)
    with pytest.raises(ValueError, match="same shape"):
        jsd(p, q[:, :2])


def test_defeasibility_reward():
    p_weak = np.array([[1.0, 0, 0], [0.2, 0.3, 0.5], [0.9, 0.1, 0.0]])
    p_strong = np.array([[0, 0, 1.0], [0.2, 0.3, 0.5], [0.0, 0.1, 0.9]])
    valid = np.array([True, True, False])
    r = np.asarray(DEFEASIBILITY_REWARD(p_weak, p_strong, valid, invalid_reward=-0.5))
    np.testing.assert_allclose(r, [1.0, 0.0, -0.5], atol=1e-6)
    with pytest.raises(ValueError, match="valid has shape"):
        DEFEASIBILITY_REWARD(p_weak, p_strong, valid[:2])


_GOOD = np.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
_NAN_ROW = np.array([[np.nan, 0.5, 0.5], [0.1, 0.1, 0.8]])
_NEGATIVE_ROW = np.array([[-0.5, 1.0, 0.5], [0.1, 0.1, 0.8]])


@pytest.mark.parametrize("call,needle", [
    # a negative probability gave inf, base 1 inf for every row
    (lambda: jsd(_NEGATIVE_ROW, _GOOD), r"p must be finite and >= 0; p\[0, 0\] = -0.5 \(1 such entry\)"),
    (lambda: jsd(_GOOD, _NAN_ROW), r"q must be finite and >= 0; q\[0, 0\] = nan"),
    (lambda: jsd(_GOOD, np.full((2, 3), np.inf)), r"q\[0, 0\] = inf \(6 such entries\)"),
    (lambda: jsd(_GOOD, _GOOD, base=1), "base must be None or a finite number > 0 other than 1, got 1"),
    (lambda: jsd(_GOOD, _GOOD, base=0.0), "base must be"),
    (lambda: jsd(_GOOD, _GOOD, base=float("nan")), "base must be"),
    (lambda: jsd(_GOOD, _GOOD, base="2"), "base must be"),
    (lambda: JSD(_GOOD, _GOOD, base=1), "base must be"),  # static under jit: checked while tracing
    (lambda: jsd(_GOOD, _GOOD, axis=2), r"axis must be an integer in \[-2, 2\), got 2"),
    (lambda: jsd(np.array([["a", "b", "c"]]), _GOOD[:1]), "p must hold real numbers, got dtype <U1"),
    (lambda: JSD(_GOOD.astype(bool), _GOOD), "p must hold real numbers, got dtype bool"),
    # the argmax of a NaN row is 0: NaN against NaN was "no flip"
    (lambda: judgment_flips(_NAN_ROW, _NAN_ROW), r"p_base must be finite and >= 0; p_base\[0, 0\] = nan"),
    (lambda: flip_rate(_GOOD, _NEGATIVE_ROW), r"p_updated\[0, 0\] = -0.5"),
    (lambda: average_jsd(_GOOD, _GOOD, np.ones(3, bool)), "average_jsd: valid has shape"),
    (lambda: defeasibility_reward(_GOOD, _GOOD, np.ones(2, bool), float("nan")), "invalid_reward must be a finite"),
])
def test_reward_math_refuses_arguments_outside_its_domain(call, needle):
    with pytest.raises(ValueError, match=needle) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_traced_probabilities_outside_the_domain_give_nan():
    """Under jit a value cannot raise: a bad row's divergence is NaN (a NaN row used to give a finite
    JSD), and a rate over it NaN, instead of a made-up number."""
    for bad in (_NAN_ROW, _NEGATIVE_ROW):
        out = np.asarray(JSD(bad, _GOOD))
        assert np.isnan(out[0]) and np.isfinite(out[1])
        assert np.isnan(float(AVERAGE_JSD(_GOOD, bad)))
        assert np.isnan(float(FLIP_RATE(bad, _GOOD))) and np.isnan(float(FLIP_RATE(_GOOD, bad)))
        assert float(FLIP_RATE(_GOOD, bad, np.array([False, True]))) == 0.0  # the bad row is not valid
        reward = np.asarray(DEFEASIBILITY_REWARD(bad, _GOOD, np.array([False, True]), invalid_reward=-1.0))
        assert reward[0] == -1.0 and np.isfinite(reward[1])


def test_normalizer_fit_gives_mean_0_std_1():
    rng = np.random.default_rng(2)
    raw = rng.beta(0.5, 3.0, size=500)
    norm = RewardNormalizer.fit(raw)
    out = np.asarray(norm(jnp.asarray(raw)), np.float64)
    assert abs(out.mean()) < 1e-6 and abs(out.std() - 1.0) < 1e-5
    # the paper's form: (raw - mu0) / sigma0
    np.testing.assert_allclose(norm.mu0, raw.mean(), rtol=1e-12)
    np.testing.assert_allclose(norm.sigma0, raw.std(), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(norm(raw)), (raw - raw.mean()) / raw.std(), atol=1e-9)
    # dropped rows do not count
    valid = rng.random(500) < 0.8
    masked = RewardNormalizer.fit(np.where(valid, raw, 99.0), valid)
    np.testing.assert_allclose(masked.mu0, raw[valid].mean(), rtol=1e-12)
    # works inside jit as a pytree
    np.testing.assert_allclose(np.asarray(jax.jit(lambda n, x: n(x))(norm, raw)),
                               np.asarray(norm(raw)), atol=1e-6)


def test_normalizer_original_and_serialization():
    orig = RewardNormalizer.from_original()
    assert (orig.gain, orig.bias) == (ORIGINAL_GAIN, ORIGINAL_BIAS)
    assert abs(orig.mu0 - 0.1123) < 1e-4 and abs(orig.sigma0 - 0.2456) < 1e-4
    back = RewardNormalizer.from_dict(json.loads(json.dumps(orig.to_dict())))
    assert back == orig
    assert RewardNormalizer.from_mean_std(orig.mu0, orig.sigma0).gain == pytest.approx(orig.gain)
    with pytest.raises(ValueError, match="norm.json: missing field.*bias"):
        RewardNormalizer.from_dict({"gain": 1.0}, where="norm.json")
    with pytest.raises(ValueError, match="gain > 0"):
        RewardNormalizer.from_dict({"gain": 0.0, "bias": 1.0})
    with pytest.raises(ValueError, match="constant reward"):
        RewardNormalizer.fit(np.ones(10))
    with pytest.raises(ValueError, match="at least 2"):
        RewardNormalizer.fit([0.3])
    with pytest.raises(ValueError, match="#1 is nan"):
        RewardNormalizer.fit([0.3, float("nan"), 0.1])


@pytest.mark.reference
def test_flip_rate_and_average_jsd_against_numpy_loop():
    rng = np.random.default_rng(3)
    n = 200
    p_base = _random_distributions(rng, n, zeros=False)
    p_upd = np.stack([_random_distributions(rng, n, zeros=False) for _ in range(2)], axis=1)
    valid = rng.random((n, 2)) < 0.8
    flips = total = 0
    for i in range(n):
        for a in range(2):
            if valid[i, a]:
                total += 1
                flips += int(np.argmax(p_upd[i, a]) != np.argmax(p_base[i]))
    assert abs(float(FLIP_RATE(p_base, p_upd, valid)) - flips / total) < 1e-6
    # single answer axis
    ref = np.mean([np.argmax(p_upd[i, 0]) != np.argmax(p_base[i]) for i in range(n)])
    assert abs(float(FLIP_RATE(p_base, p_upd[:, 0])) - ref) < 1e-6
    assert JUDGMENT_FLIPS(p_base, p_upd).shape == (n, 2)
    assert np.isnan(float(FLIP_RATE(p_base, p_upd, np.zeros((n, 2), bool))))
    with pytest.raises(ValueError, match="valid has shape"):
        FLIP_RATE(p_base, p_upd, valid[:, 0])

    spatial = require("scipy.spatial")
    pair_valid = valid.all(axis=1)
    ref = np.mean([spatial.distance.jensenshannon(p_upd[i, 0], p_upd[i, 1], base=2) ** 2
                   for i in range(n) if pair_valid[i]])
    assert abs(float(AVERAGE_JSD(p_upd[:, 0], p_upd[:, 1], pair_valid)) - ref) < 1e-6
