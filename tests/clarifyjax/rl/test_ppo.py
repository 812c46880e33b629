"""PPO math (clarifyjax.rl.ppo) against plain numpy written here, and the whole update on a toy bandit."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from clarifyjax.rl import ppo
from helpers.ppo_bandit import B, T, TARGET, V, bandit_values, make_rollout, policy_logprobs


def _right_padded_mask(rng, batch, time, min_len=0):
    lengths = rng.integers(min_len, time + 1, size=batch)
    lengths[0], lengths[-1] = time, max(min_len, 1)  # a full row and a short one
    return (np.arange(time)[None, :] < lengths[:, None]).astype(np.float32), lengths


def _np_mean(x, m):
    return (x * m).sum() / m.sum()


def _np_var(x, m):
    mu = _np_mean(x, m)
    return (((x - mu) ** 2) * m).sum() / m.sum()


def _np_whiten(x, m, shift_mean=True):
    mu, var = _np_mean(x, m), _np_var(x, m)
    out = (x - mu) / np.sqrt(var + 1e-8)
    if not shift_mean:
        out = out + mu
    return out * m


# ----------------------------------------------------------------------------- statistics


def test_masked_mean_var_whiten():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, (16, 9)).astype(np.float32)
    m, _ = _right_padded_mask(rng, 16, 9)
    x_pad = np.where(m > 0, x, np.inf)  # garbage on padding must not leak
    np.testing.assert_allclose(float(ppo.masked_mean(x_pad, m)), _np_mean(x, m), rtol=1e-6)
    np.testing.assert_allclose(float(ppo.masked_var(x_pad, m)), _np_var(x, m), rtol=1e-5)
    n = m.sum()
    np.testing.assert_allclose(float(ppo.masked_var(x, m, unbiased=True)),
                               _np_var(x, m) * n / (n - 1), rtol=1e-5)
    rows = np.asarray(ppo.masked_mean(x, m, axis=1))
    ref = np.array([x[i][m[i] > 0].mean() if m[i].any() else 0.0 for i in range(16)])
    assert not m.all(axis=1).all() and not m.any(axis=1).all()  # empty rows are covered
    np.testing.assert_allclose(rows, ref, rtol=1e-5)  # an empty row's mean is 0
    assert float(ppo.masked_mean(x, np.zeros_like(m))) == 0.0  # empty mask: 0, not NaN

    w = np.asarray(ppo.masked_whiten(x_pad, m))
    np.testing.assert_allclose(w, _np_whiten(x, m), atol=1e-5)
    valid = w[m > 0]
    assert abs(valid.mean()) < 1e-5 and abs(valid.var() - 1.0) < 1e-4  # variance, not sqrt(std)
    assert np.all(w[m == 0] == 0.0)
    w2 = np.asarray(ppo.masked_whiten(x, m, shift_mean=False))
    np.testing.assert_allclose(w2, _np_whiten(x, m, shift_mean=False), atol=1e-5)
    assert np.all(w2[m == 0] == 0.0)  # the original leaked the mean into padding


# ----------------------------------------------------------------------------- GAE


def _np_gae_per_row(rewards, values, lengths, gamma, lam):
    """Reverse loop per sequence, the episode ending at its last valid token."""
    adv = np.zeros_like(rewards)
    for i, n in enumerate(lengths):
        last = 0.0
        for t in reversed(range(n)):
            next_value = values[i, t + 1] if t + 1 < n else 0.0
            delta = rewards[i, t] + gamma * next_value - values[i, t]
            last = delta + gamma * lam * last
            adv[i, t] = last
    return adv


def _np_gae_original(rewards, values, gamma, lam):
    """The original trainer's loop over the whole (masked) batch."""
    T = rewards.shape[1]
    last, out = 0.0, []
    for t in reversed(range(T)):
        next_values = values[:, t + 1] if t < T - 1 else 0.0
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last = delta + gamma * lam * last
        out.append(last)
    return np.stack(out[::-1], axis=1)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.7)])
def test_gae_against_reverse_loop(gamma, lam):
    rng = np.random.default_rng(1)
    B, T = 12, 10
    m, lengths = _right_padded_mask(rng, B, T)
    r = rng.normal(size=(B, T)).astype(np.float32)
    v = rng.normal(size=(B, T)).astype(np.float32)
    adv, ret = jax.jit(lambda r, v, m: ppo.gae(r, v, m, gamma=gamma, lam=lam))(r, v, m)
    adv, ret = np.asarray(adv), np.asarray(ret)
    ref = _np_gae_per_row(r, v, lengths, gamma, lam)
    np.testing.assert_allclose(adv, ref, atol=1e-5)
    np.testing.assert_allclose(ret, (ref + v) * m, atol=1e-5)
    np.testing.assert_allclose(adv, _np_gae_original(r * m, v * m, gamma, lam) * m, atol=1e-5)
    assert np.all(adv[m == 0] == 0) and np.all(ret[m == 0] == 0)


# ----------------------------------------------------------------------------- losses


def test_policy_loss_against_numpy():
    rng = np.random.default_rng(2)
    B, T, clip = 8, 7, 0.2
    m, _ = _right_padded_mask(rng, B, T, min_len=1)
    old = rng.normal(-2.0, 0.5, (B, T)).astype(np.float32)
    new = (old + rng.normal(0, 0.3, (B, T))).astype(np.float32)
    adv = rng.normal(size=(B, T)).astype(np.float32)
    loss, metrics = jax.jit(ppo.policy_loss, static_argnames="clip")(new, old, adv, m, clip=clip)
    ratio = np.exp(new - old)
    l1, l2 = -adv * ratio, -adv * np.clip(ratio, 1 - clip, 1 + clip)
    np.testing.assert_allclose(float(loss), _np_mean(np.maximum(l1, l2), m), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["clipfrac"]), _np_mean((l2 > l1) * 1.0, m), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["approx_kl"]), 0.5 * _np_mean((new - old) ** 2, m),
                               rtol=1e-5)
    assert 0.0 < float(metrics["clipfrac"]) < 1.0  # both branches exercised


@pytest.mark.parametrize("clip", [0.2, None])
def test_value_loss_against_numpy(clip):
    rng = np.random.default_rng(3)
    B, T = 8, 7
    m, _ = _right_padded_mask(rng, B, T, min_len=1)
    old = rng.normal(size=(B, T)).astype(np.float32)
    new = (old + rng.normal(0, 0.4, (B, T))).astype(np.float32)
    ret = rng.normal(size=(B, T)).astype(np.float32)
    loss, metrics = ppo.value_loss(new, old, ret, m, clip=clip)
    l1 = (new - ret) ** 2
    l2 = l1 if clip is None else (old + np.clip(new - old, -clip, clip) - ret) ** 2
    np.testing.assert_allclose(float(loss), 0.5 * _np_mean(np.maximum(l1, l2), m), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["value_clipfrac"]), _np_mean((l2 > l1) * 1.0, m),
                               rtol=1e-6)
    np.testing.assert_allclose(float(metrics["value_error"]), _np_mean(l1, m), rtol=1e-5)


def test_kl_penalty_and_shaped_rewards():
    rng = np.random.default_rng(4)
    B, T = 6, 5
    m, lengths = _right_padded_mask(rng, B, T)
    logp = rng.normal(-2, 1, (B, T)).astype(np.float32)
    ref = rng.normal(-2, 1, (B, T)).astype(np.float32)
    reward = rng.normal(size=B).astype(np.float32)
    logp_pad = np.where(m > 0, logp, -np.inf)  # the original's -inf padding must not leak
    pen = np.asarray(ppo.kl_penalty(logp_pad, ref, m, 0.15))
    np.testing.assert_allclose(pen, 0.15 * (logp - ref) * m, atol=1e-6)
    rewards = np.asarray(ppo.shaped_rewards(reward, logp_pad, ref, m, 0.15))
    expected = -0.15 * (logp - ref) * m
    for i, n in enumerate(lengths):
        if n > 0:
            expected[i, n - 1] += reward[i]
    np.testing.assert_allclose(rewards, expected, atol=1e-6)


def test_recorded_keeps_the_sampled_kl_exactly():
    """`ppo.recorded` puts the learner's log-probs l in the rollout and moves the reference's r by
    l - s (s: the sampling pass's): where the policy is the reference (s == r) the KL l - r' is
    exactly 0 though l is 1e-7 off s, and where the learner agrees with sampling (l == s) the
    reference stays bit for bit."""
    rng = np.random.default_rng(0)
    r = -rng.exponential(2.0, (64, 9)).astype(np.float32)
    noisy = (r * (1 + rng.normal(0, 1e-7, r.shape))).astype(np.float32)  # the learner's l
    assert np.any(noisy != r)
    zeros = np.zeros_like(r)
    rollout = ppo.Rollout(zeros, zeros, zeros, zeros, logprobs=r, ref_logprobs=r, values=zeros,
                          rewards=zeros[:, 0])
    out = ppo.recorded(rollout, noisy, zeros + 1)
    assert np.all(np.asarray(out.logprobs - out.ref_logprobs) == 0)
    assert np.all(np.asarray(out.values) == 1) and np.all(np.asarray(out.logprobs) == noisy)
    moved = (r + rng.normal(0, 0.5, r.shape)).astype(np.float32)  # a policy away from r
    out = ppo.recorded(rollout._replace(logprobs=moved), moved, zeros)
    np.testing.assert_array_equal(np.asarray(out.ref_logprobs), r)


def test_kl_controllers():
    fixed = ppo.FixedKL(0.15)
    assert fixed.update(100.0, 64) == fixed
    ctl = ppo.AdaptiveKL(value=0.15, target=6.0, horizon=10000.0)
    up = ctl.update(9.0, 64)  # KL above target: coefficient goes UP
    down = ctl.update(3.0, 64)
    np.testing.assert_allclose(float(up.value), 0.15 * (1 + 0.2 * 64 / 10000), rtol=1e-6)
    np.testing.assert_allclose(float(down.value), 0.15 * (1 - 0.2 * 64 / 10000), rtol=1e-6)
    small = ctl.update(6.6, 64)  # inside the clip: proportional
    np.testing.assert_allclose(float(small.value), 0.15 * (1 + 0.1 * 64 / 10000), rtol=1e-6)
    assert float(ctl.update(6.0, 64).value) == pytest.approx(0.15)
    jitted = jax.jit(lambda c, kl: c.update(kl, 64))(ctl, 9.0)
    assert float(jitted.value) > 0.15 and float(jitted.target) == 6.0


# ----------------------------------------------------------------------------- the update
# the toy bandit: helpers/ppo_bandit.py

def _exact_kl(logits, ref_logits):
    """[T] KL(pi_t || ref_t) per position, exact."""
    p, q = jax.nn.log_softmax(logits, -1), jax.nn.log_softmax(ref_logits, -1)
    return np.asarray(jnp.sum(jnp.exp(p) * (p - q), -1))


@functools.cache
def _toy_functions(config):
    """Jitted once per config and shared by the toy runs (beta lives in the state, not the trace)."""
    policy_tx, value_tx = optax.adam(0.05), optax.adam(0.05)
    update = jax.jit(ppo.make_ppo_update(policy_logprobs, bandit_values, policy_tx, value_tx, config))
    return policy_tx, value_tx, update, make_rollout


def _run_toy(kl_coef, n_updates, config=ppo.PPOUpdateConfig(), seed=0):
    ref = {"logits": jax.random.normal(jax.random.key(seed), (T, V)) * 0.3}
    values = {"v": jnp.zeros((T,))}
    policy_tx, value_tx, update, rollout_fn = _toy_functions(config)
    state = ppo.init_ppo_state(ref, values, policy_tx, value_tx, ppo.FixedKL(kl_coef))
    rng = jax.random.key(seed + 1)
    history = []
    for _ in range(n_updates):
        rng, k_roll, k_upd = jax.random.split(rng, 3)
        rollout = rollout_fn(state.policy_params, ref, state.value_params, k_roll)
        state, metrics = update(state, rollout, k_upd)
        history.append(jax.tree.map(float, metrics))
    p_target = float(jax.nn.softmax(state.policy_params["logits"][0])[TARGET])
    p_ref = float(jax.nn.softmax(ref["logits"][0])[TARGET])
    return state, history, p_target, p_ref, _exact_kl(state.policy_params["logits"], ref["logits"])


def _optimal_p(p_ref, beta):
    """The KL-regularized optimum at position 0: pi*(a) ∝ ref(a) exp(r(a) / beta)."""
    w = p_ref * np.exp(1.0 / beta)
    return w / (w + 1.0 - p_ref)


def test_ppo_update_raises_reward_with_bounded_kl():
    beta = 0.1
    state, history, p_target, p_ref, kl = _run_toy(beta, 30)
    first = np.mean([h["mean_score"] for h in history[:3]])
    last = np.mean([h["mean_score"] for h in history[-5:]])
    p_star = _optimal_p(p_ref, beta)
    kl0_star = p_star * np.log(p_star / p_ref) + (1 - p_star) * np.log((1 - p_star) / (1 - p_ref))
    print(f"p_ref={p_ref:.3f} p_target={p_target:.3f} (optimum {p_star:.4f}); sampled score "
          f"{first:.3f} -> {last:.3f}; exact KL per position {np.round(kl, 4)} "
          f"(position-0 optimum {kl0_star:.3f}); metrics KL {history[-1]['kl_to_ref']:.3f}")
    # Required: reward clearly up (from ~p_ref ≈ 0.1 to >= 0.8 exactly and >= 0.7 sampled)...
    assert p_ref < 0.2 and first < 0.3
    assert p_target >= 0.8 and last >= 0.7
    # ...while the KL stays bounded: the rewarded position no further than the regularized
    # optimum (+0.1 nats), the unrewarded positions (KL penalty only) within 0.1 nats of ref.
    # (Measured, seeds 0-2: 0.01-0.06 nats with beta = 0.1; 0.12-1.06 without the penalty.)
    assert kl[0] <= kl0_star + 0.1
    assert np.all(kl[1:] < 0.1)
    assert int(state.step) == 30
    for h in history:
        assert all(np.isfinite(v) for v in h.values()), h
        assert 0.0 <= h["clipfrac"] <= 1.0


def test_kl_penalty_holds_the_policy_at_the_regularized_optimum():
    """With beta = 0.5 the KL-regularized optimum is pi*(target) ~ 0.47, not 1: PPO with the
    per-token penalty must raise the reward towards it and stop there (measured 0.447 vs 0.469)."""
    beta = 0.5
    _, history, p_target, p_ref, kl = _run_toy(beta, 30)
    p_star = _optimal_p(p_ref, beta)
    print(f"beta={beta}: p_ref={p_ref:.3f} p_target={p_target:.3f} optimum {p_star:.3f} KL {kl}")
    assert p_target > p_ref + 0.2  # the reward still goes up clearly
    assert abs(p_target - p_star) < 0.1  # ... to the optimum and not beyond
    assert np.all(kl[1:] < 0.1)


def _policy_logprobs_entropy_neginf_padding(params, rollout):
    """Like the original's policy: -inf log-probs on padding, and a per-token entropy."""
    logp = jax.nn.log_softmax(params["logits"], axis=-1)
    entropy = -jnp.sum(jnp.exp(logp) * logp, -1)  # [T]
    mask = rollout.response_mask > 0
    return (jnp.where(mask, policy_logprobs(params, rollout), -jnp.inf),
            jnp.broadcast_to(entropy, mask.shape))


def test_first_step_matches_numpy_sgd():
    """One epoch, one minibatch, plain SGD: the update equals a numpy gradient of the same loss.

    At the first step ratio = 1 and v = old v, so clipping is inactive and the gradient of the
    tabular policy is -mean over tokens of A * (onehot(token) - softmax(logits_t)). The rollout
    and the policy carry -inf / NaN on padding, which must not reach the result.
    """
    lr, beta = 0.5, 0.15
    cfg = ppo.PPOUpdateConfig(epochs=1, minibatches=1, vf_coef=0.7, gamma=0.9, lam=0.8)
    ref = {"logits": jax.random.normal(jax.random.key(5), (T, V))}
    policy = {"logits": ref["logits"] + 0.5 * jax.random.normal(jax.random.key(6), (T, V))}
    values = {"v": jax.random.normal(jax.random.key(7), (T,))}
    tx = optax.sgd(lr)
    update = jax.jit(ppo.make_ppo_update(_policy_logprobs_entropy_neginf_padding, bandit_values, tx,
                                         tx, cfg))
    state = ppo.init_ppo_state(policy, values, tx, tx, ppo.FixedKL(beta))
    roll = make_rollout(policy, ref, values, jax.random.key(8))
    pad = roll.response_mask == 0
    assert bool(pad.any())
    dirty = roll._replace(logprobs=jnp.where(pad, -jnp.inf, roll.logprobs),
                          ref_logprobs=jnp.where(pad, -jnp.inf, roll.ref_logprobs),
                          values=jnp.where(pad, jnp.nan, roll.values))
    new_state, metrics = update(state, dirty, jax.random.key(9))

    m = np.asarray(roll.response_mask, np.float64)
    tok = np.asarray(roll.response_ids)
    lengths = m.sum(1).astype(int)
    logp, ref_logp = np.asarray(roll.logprobs, np.float64), np.asarray(roll.ref_logprobs, np.float64)
    v = np.asarray(roll.values, np.float64)
    reward = np.asarray(roll.rewards, np.float64)
    rewards = -beta * (logp - ref_logp) * m
    rewards[np.arange(B), lengths - 1] += reward
    rewards = _np_whiten(rewards, m, shift_mean=False)
    adv = _np_gae_per_row(rewards, v, lengths, cfg.gamma, cfg.lam)
    returns = (adv + v) * m
    adv = _np_whiten(adv, m)
    n = m.sum()
    logits = np.asarray(policy["logits"], np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    grad_logits = np.zeros((T, V))
    grad_v = np.zeros(T)
    for i in range(B):
        for t in range(lengths[i]):
            onehot = np.eye(V)[tok[i, t]]
            grad_logits[t] += -adv[i, t] * (onehot - probs[t]) / n
            grad_v[t] += cfg.vf_coef * (v[i, t] - returns[i, t]) / n
    np.testing.assert_allclose(np.asarray(new_state.policy_params["logits"]),
                               logits - lr * grad_logits, atol=2e-5)
    np.testing.assert_allclose(np.asarray(new_state.value_params["v"]),
                               np.asarray(values["v"]) - lr * grad_v, atol=2e-5)
    np.testing.assert_allclose(float(metrics["value_loss"]),
                               0.5 * _np_mean((v - returns) ** 2, m), rtol=1e-4)
    np.testing.assert_allclose(float(metrics["kl_to_ref"]),
                               np.mean(((logp - ref_logp) * m).sum(1)), rtol=1e-5)
    assert float(metrics["clipfrac"]) == 0.0 and float(metrics["kl_coef"]) == pytest.approx(beta)
    entropy = -(probs * np.log(probs)).sum(-1)
    np.testing.assert_allclose(float(metrics["policy_entropy"]),
                               _np_mean(np.broadcast_to(entropy, m.shape), m), rtol=1e-5)
    assert all(np.isfinite(float(v)) for v in metrics.values()), metrics


def test_entropy_bonus_adds_its_gradient_and_needs_the_entropy():
    """One SGD step with entropy_coef c differs from the step without it by exactly
    -lr * c * d(-mean entropy)/d logits: for a softmax row p, dH/dz = -p (log p + H), each position
    weighted by its share of the valid tokens."""
    lr, c = 0.5, 0.3
    tx = optax.sgd(lr)
    ref = {"logits": jax.random.normal(jax.random.key(5), (T, V))}
    policy = {"logits": ref["logits"] + 0.5 * jax.random.normal(jax.random.key(6), (T, V))}
    values = {"v": jnp.zeros((T,))}
    roll = make_rollout(policy, ref, values, jax.random.key(8))
    stepped = {}
    for coef in (0.0, c):
        cfg = ppo.PPOUpdateConfig(epochs=1, minibatches=1, entropy_coef=coef)
        update = jax.jit(ppo.make_ppo_update(_policy_logprobs_entropy_neginf_padding, bandit_values,
                                             tx, tx, cfg))
        state = ppo.init_ppo_state(policy, values, tx, tx)
        new_state, metrics = update(state, roll, jax.random.key(9))
        stepped[coef] = np.asarray(new_state.policy_params["logits"], np.float64)
    m = np.asarray(roll.response_mask, np.float64)
    logits = np.asarray(policy["logits"], np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    p = np.exp(logp)
    h = -(p * logp).sum(-1, keepdims=True)
    weight = (m.sum(0) / m.sum())[:, None]  # each position's share of the valid tokens
    grad = c * weight * p * (logp + h)  # d(-c * mean entropy)/d logits
    np.testing.assert_allclose(stepped[c] - stepped[0.0], -lr * grad, atol=2e-6)
    np.testing.assert_allclose(float(metrics["policy_entropy_per_question"]),
                               np.mean((np.broadcast_to(h[:, 0], m.shape) * m).sum(1)), rtol=1e-5)
    with pytest.raises(ValueError, match="entropy_coef = 0.3 needs a policy_logprobs_fn"):
        jax.jit(ppo.make_ppo_update(policy_logprobs, bandit_values, tx, tx,
                                    ppo.PPOUpdateConfig(entropy_coef=c))
                )(ppo.init_ppo_state(policy, values, tx, tx), roll, jax.random.key(9))


def test_minibatches_epochs_and_adaptive_kl_in_state():
    cfg = ppo.PPOUpdateConfig(epochs=2, minibatches=4)
    tx = optax.adam(1e-2)
    ref = {"logits": jnp.zeros((T, V))}
    values = {"v": jnp.zeros((T,))}
    update = jax.jit(ppo.make_ppo_update(policy_logprobs, bandit_values, tx, tx, cfg))
    ctl = ppo.AdaptiveKL(value=0.2, target=1e-6, horizon=100.0)  # any KL is above this target
    state = ppo.init_ppo_state({"logits": 0.5 * jax.random.normal(jax.random.key(1), (T, V))},
                               values, tx, tx, ctl)
    roll = make_rollout(state.policy_params, ref, values, jax.random.key(2))
    new_state, metrics = update(state, roll, jax.random.key(3))
    assert float(metrics["kl_to_ref"]) > 0
    np.testing.assert_allclose(float(new_state.kl_ctl.value), 0.2 * (1 + 0.2 * B / 100.0), rtol=1e-5)
    assert float(new_state.kl_ctl.target) == pytest.approx(1e-6)
    # 8 Adam steps were taken: the count lives in the optimizer state
    assert int(new_state.policy_opt_state[0].count) == cfg.epochs * cfg.minibatches
    with pytest.raises(ValueError, match="not divisible by PPOUpdateConfig.minibatches=5"):
        jax.jit(ppo.make_ppo_update(policy_logprobs, bandit_values, tx, tx,
                                    ppo.PPOUpdateConfig(minibatches=5)))(state, roll, jax.random.key(0))
    with pytest.raises(ValueError, match="Rollout.rewards has shape"):
        update(state, roll._replace(rewards=roll.rewards[:3]), jax.random.key(0))


_SHARDED_CODE = r"""
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import NamedSharding, PartitionSpec as P, AxisType
from helpers import ppo_bandit
from clarifyjax.rl import ppo
from clarifyjax.files.child_result import write_result

mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
tx = optax.adam(0.05)
cfg = ppo.PPOUpdateConfig(epochs=2, minibatches=2)
update = ppo.make_ppo_update(ppo_bandit.policy_logprobs, ppo_bandit.bandit_values, tx, tx, cfg)
ref = {"logits": jax.random.normal(jax.random.key(0), (ppo_bandit.T, ppo_bandit.V))}
values = {"v": jnp.zeros((ppo_bandit.T,))}
state = ppo.init_ppo_state(ref, values, tx, tx, ppo.AdaptiveKL(0.1, 1.0, 100.0))
roll = ppo_bandit.make_rollout(ref, ref, values, jax.random.key(1))

replicated = NamedSharding(mesh, P())
state_sh = jax.tree.map(lambda _: replicated, state)
roll_sh = ppo.Rollout(**{name: NamedSharding(mesh, P("data")) for name in ppo.Rollout._fields})
sharded = jax.jit(update, in_shardings=(state_sh, roll_sh, replicated),
                  out_shardings=(state_sh, replicated))
placed = jax.device_put(roll, roll_sh)
s1, m1 = sharded(jax.device_put(state, state_sh), placed, jax.random.key(2))
s0, m0 = jax.jit(update)(state, roll, jax.random.key(2))
diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
           zip(jax.tree.leaves((s1.policy_params, s1.value_params, s1.kl_ctl)),
               jax.tree.leaves((s0.policy_params, s0.value_params, s0.kl_ctl))))
mdiff = max(abs(float(m1[k]) - float(m0[k])) for k in m0)
write_result({"devices": jax.device_count(),
              "rollout_devices": len(placed.response_ids.sharding.device_set),
              "param_diff": diff, "metric_diff": mdiff})
"""


@pytest.mark.child
@pytest.mark.slow  # a subprocess with 8 fake devices: ~12 s of CPU, ~25 s wall on a busy 2-core box
def test_update_jits_with_shardings_on_8_devices():
    """The pure update under jit with in/out shardings (params replicated, rollout split over 8
    fake devices) gives the single-device result (params within 1e-5, metrics within 1e-4)."""
    from helpers.children import run_with_fake_devices

    r = run_with_fake_devices(_SHARDED_CODE, 8)
    print(r)
    assert r["devices"] == 8 and r["rollout_devices"] == 8, r
    assert r["param_diff"] < 1e-5 and r["metric_diff"] < 1e-4, r
