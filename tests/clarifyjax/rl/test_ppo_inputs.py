"""What clarifyjax.rl.ppo (its math: rl.ppo_math) refuses: shapes and dtypes eagerly and under jit,
hyperparameters when concrete; each error one line naming the function and the argument."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from clarifyjax.rl import ppo
from helpers.ppo_bandit import bandit_values, policy_logprobs

B, T = 2, 4
MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
X = np.arange(B * T, dtype=np.float32).reshape(B, T) / 10


def _refused(match, fn, *args, **kwargs):
    """fn(...) raises a one-line ValueError matching `match`."""
    with pytest.raises(ValueError, match=match) as info:
        fn(*args, **kwargs)
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- shapes


def test_shaped_rewards_refuses_rewards_that_are_not_one_per_row():
    """[2, 1] rewards used to broadcast to a [2, 2, 4] result."""
    _refused(r"shaped_rewards: rewards \(2, 1\) must be \[batch\]", ppo.shaped_rewards,
             np.ones((B, 1)), X, X, MASK, 0.1)
    _refused(r"shaped_rewards: rewards \(3,\)", ppo.shaped_rewards, np.ones(3), X, X, MASK, 0.1)
    _refused(r"shaped_rewards: logprobs \(2, 4\), ref_logprobs \(2, 3\)", ppo.shaped_rewards,
             np.ones(B), X, X[:, :3], MASK, 0.1)
    jitted = jax.jit(ppo.shaped_rewards)  # static shapes: refused while tracing too
    _refused("shaped_rewards: rewards", jitted, jnp.ones((B, 1)), X, X, MASK, 0.1)
    assert jitted(jnp.ones(B), X, X, MASK, 0.1).shape == (B, T)


def test_the_losses_and_gae_refuse_shapes_that_differ():
    _refused(r"gae: rewards \(2, 4\), values \(2, 1\), mask \(2, 4\) must all be the same "
             r"\[batch, time\]", ppo.gae, X, X[:, :1], MASK)
    _refused(r"gae: .* must all be the same \[batch, time\]", ppo.gae, X[0], X[0], MASK[0])
    _refused(r"policy_loss: .*advantages \(2, 1\)", ppo.policy_loss, X, X, X[:, :1], MASK)
    _refused(r"value_loss: .*returns \(2,\)", ppo.value_loss, X, X, X[:, 0], MASK)
    _refused(r"kl_penalty: .*mask \(4,\)", ppo.kl_penalty, X, X, MASK[0], 0.1)
    _refused(r"explained_variance: .*returns \(2, 1\)", ppo.explained_variance, X, X[:, :1],
             MASK)
    _refused(r"last_token_one_hot: mask \(4,\)", ppo.last_token_one_hot, MASK[0])


def test_masked_statistics_refuse_a_mask_that_would_broadcast_along_the_wrong_axis():
    """A [4] mask over [4, 4] values broadcast over the time axis, masking columns, not rows."""
    x, rows = np.ones((4, 4), np.float32), np.array([1, 1, 0, 0], np.float32)
    for fn in (ppo.masked_mean, ppo.masked_var, ppo.masked_whiten, ppo.masked_sum):
        _refused(rf"{fn.__name__}: mask \(4,\) must have x's shape \(4, 4\)", fn, x, rows)
    assert float(ppo.masked_mean(x, rows[:, None])) == 1.0  # [4, 1]: 1 along time broadcasts


def test_dtypes_that_are_not_real_are_refused():
    _refused("gae: rewards must hold real numbers, got dtype complex64", ppo.gae,
             X.astype(np.complex64), X, MASK)
    _refused("masked_mean: x must hold real numbers", ppo.masked_mean,
             X.astype(np.complex64), MASK)


# ----------------------------------------------------------------------------- hyperparameters


@pytest.mark.parametrize("gamma,lam,bad", [(math.nan, 0.95, "gamma"), (1.5, 0.95, "gamma"),
                                           (1.0, -0.1, "lam"), (1.0, math.inf, "lam")])
def test_gae_refuses_gamma_and_lam_outside_0_1(gamma, lam, bad):
    value = gamma if bad == "gamma" else lam
    message = rf"gae: {bad} must be a finite number in \[0, 1\], got {value}"
    _refused(message, ppo.gae, X, X, MASK, gamma=gamma, lam=lam)
    # a Python number closed over by a jitted function is concrete at trace time
    _refused(message, jax.jit(lambda r: ppo.gae(r, X, MASK, gamma=gamma, lam=lam)), X)


@pytest.mark.parametrize("clip", [0.0, -0.2, math.nan])
def test_policy_loss_refuses_a_clip_that_is_not_positive(clip):
    _refused(rf"policy_loss: clip must be a finite number > 0, got {clip}", ppo.policy_loss,
             X, X, X, MASK, clip=clip)


def test_value_loss_clip_is_none_or_at_least_0():
    _refused(r"value_loss: clip must be a finite number >= 0, got -0.1", ppo.value_loss,
             X, X, X, MASK, clip=-0.1)
    for clip in (None, 0.0, 0.2):
        assert np.isfinite(float(ppo.value_loss(X, X + 1, X, MASK, clip=clip)[0]))


def test_a_negative_kl_coefficient_is_refused_when_concrete_and_traced_ones_pass():
    _refused("kl_penalty: coef must be a finite number >= 0, got -0.1", ppo.kl_penalty,
             X, X, MASK, -0.1)
    _refused("shaped_rewards: kl_coef must be a finite number >= 0, got -0.1",
             ppo.shaped_rewards, np.ones(B), X, X, MASK, -0.1)
    _refused("kl_penalty: coef must be a real scalar", jax.jit(ppo.kl_penalty), X, X, MASK,
             jnp.ones(B))
    # traced: no value to read, so no check (the docstrings say so)
    out = jax.jit(ppo.shaped_rewards)(jnp.ones(B), X, X + 1, MASK, jnp.float32(-0.1))
    assert out.shape == (B, T)


def test_kl_controllers_refuse_a_bad_field_where_it_enters_the_state():
    tx = optax.sgd(0.1)
    for ctl, field in ((ppo.AdaptiveKL(0.1, -1.0, 100.0), "target"),
                       (ppo.AdaptiveKL(0.1, 6.0, 0.0), "horizon"),
                       (ppo.AdaptiveKL(math.nan, 6.0, 100.0), "value"),
                       (ppo.FixedKL(-0.1), "value")):
        name = type(ctl).__name__
        _refused(f"{name}: {field} must be a finite number", ppo.init_ppo_state, {}, {}, tx, tx,
                 ctl)
        _refused(f"{name}: {field}", ctl.update, 1.0, 8)  # eagerly, update checks too
    # the tuples stay pytrees: JAX rebuilds them with any leaves, and the constructor never checks
    zeros = jax.tree.map(jnp.zeros_like, ppo.AdaptiveKL())
    assert float(zeros.target) == 0.0
    batched = jax.vmap(lambda c: c.update(1.0, 8).value, in_axes=(ppo.AdaptiveKL(0, None, None),))
    assert batched(ppo.AdaptiveKL(jnp.array([0.1, 0.2]), 6.0, 100.0)).shape == (2,)


def test_make_ppo_update_checks_a_directly_built_config_against_its_bounds():
    tx = optax.sgd(0.1)
    for changes, message in (({"gamma": math.nan}, r"PPOUpdateConfig.gamma must be a finite "
                                                   r"number in \[0, 1\], got nan"),
                             ({"lam": -0.1}, r"PPOUpdateConfig.lam .* got -0.1"),
                             ({"clip": 0.0}, r"PPOUpdateConfig.clip must be a finite number > 0"),
                             ({"value_clip": -1.0}, r"PPOUpdateConfig.value_clip"),
                             ({"entropy_coef": -0.01}, r"PPOUpdateConfig.entropy_coef"),
                             ({"epochs": 0}, r"PPOUpdateConfig.epochs .* >= 1, got 0"),
                             ({"minibatches": 1.5}, r"PPOUpdateConfig.minibatches must be an "
                                                    r"integer >= 1, got 1.5")):
        config = ppo.PPOUpdateConfig(**changes)
        _refused(f"make_ppo_update: {message}", ppo.make_ppo_update, policy_logprobs,
                 bandit_values, tx, tx, config)
    ppo.make_ppo_update(policy_logprobs, bandit_values, tx, tx, ppo.PPOUpdateConfig(value_clip=None))


# ----------------------------------------------------------------------------- explained variance


@pytest.mark.parametrize("level", [0.0, 2.0, 0.1])
def test_explained_variance_is_nan_when_the_returns_are_constant(level):
    """It was 1.0 (values that explain nothing); stable-baselines3 gives NaN for Var(y) = 0."""
    returns = np.full((B, T), level, np.float32)
    values = np.random.default_rng(0).normal(size=(B, T)).astype(np.float32)
    assert math.isnan(float(ppo.explained_variance(values, returns, MASK)))
    assert math.isnan(float(jax.jit(ppo.explained_variance)(values, returns, MASK)))
    # only what the mask covers counts: padding that differs does not make the returns vary
    padded = np.where(MASK > 0, returns, 5.0)
    assert math.isnan(float(ppo.explained_variance(values, padded, MASK)))
    assert math.isnan(float(ppo.explained_variance(values, X, np.zeros_like(MASK))))  # empty


def test_the_checked_functions_still_jit():
    adv, ret = jax.jit(ppo.gae, static_argnames=("gamma", "lam"))(X, X, MASK, gamma=0.9, lam=0.8)
    assert adv.shape == ret.shape == (B, T)
    assert jax.jit(ppo.policy_loss)(X, X, X, MASK, 0.2)[0].shape == ()  # traced clip passes
    assert jax.jit(ppo.value_loss)(X, X, X, MASK, 0.2)[0].shape == ()
    assert jax.jit(ppo.masked_whiten)(X, MASK).shape == (B, T)
    assert float(jax.jit(ppo.explained_variance)(X, X, MASK)) == 1.0
    ctl = jax.jit(lambda c: c.update(1.0, 8))(ppo.AdaptiveKL(0.1, 6.0, 100.0))
    assert float(ctl.value) < 0.1
