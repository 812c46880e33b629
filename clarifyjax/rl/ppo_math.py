"""PPO's arithmetic over masked `[batch, time]` arrays: masked statistics, GAE, the clipped losses,
the KL penalty and its controllers, shaped rewards and explained variance. Pure and jittable (jax
and numpy only); `clarifyjax.rl.ppo` builds the update on them and re-exports every name here.

Arguments are checked where that costs nothing under `jit`: shapes and dtypes always (known while
tracing), hyperparameters (gamma, lam, clip, the KL coefficient) when concrete: a traced one has
no value to read. Each refusal is a one-line ValueError naming the function, the argument and
what it got (docs/reliability.md). Masks: 1.0 on response tokens (EOS included), 0.0 on padding."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
_EPS = 1e-8

# --------------------------------------------------------------------------- argument checks


def _real(fn: str, name: str, x) -> Array:
    """`x` as a JAX array, refusing a dtype that is not bool, integer or float."""
    x = jnp.asarray(x)
    if not (x.dtype == bool or jnp.issubdtype(x.dtype, jnp.integer)
            or jnp.issubdtype(x.dtype, jnp.floating)):
        raise ValueError(f"{fn}: {name} must hold real numbers, got dtype {x.dtype}")
    return x


def _same_shape(fn: str, *, ndim: int | None = None, **arrays) -> list[Array]:
    """The arrays (real dtypes), refusing shapes that differ or (with `ndim`) another rank:
    nothing is broadcast, so a `[batch]` array never spreads over `[batch, time]` silently."""
    out = {name: _real(fn, name, x) for name, x in arrays.items()}
    shapes = {x.shape for x in out.values()}
    if len(shapes) > 1 or (ndim is not None and len(next(iter(shapes))) != ndim):
        got = ", ".join(f"{name} {x.shape}" for name, x in out.items())
        want = "the same [batch, time]" if ndim == 2 else "of one shape"
        raise ValueError(f"{fn}: {got} must all be {want}")
    return list(out.values())


def _with_mask(fn: str, x, mask) -> tuple[Array, Array]:
    """(x, mask broadcast to x's shape in x's float type); the mask must have x's rank and, along
    each axis, x's length or 1 (a `[batch]` mask over `[batch, time]` would mask the time axis)."""
    x, mask = _real(fn, "x", x), _real(fn, "mask", mask)
    if mask.ndim != x.ndim or any(m not in (1, n) for m, n in zip(mask.shape, x.shape)):
        raise ValueError(f"{fn}: mask {mask.shape} must have x's shape {x.shape} (or 1 along an "
                         "axis)")
    return x, jnp.broadcast_to(mask.astype(jnp.result_type(x, jnp.float32)), x.shape)


def check_setting(fn: str, name: str, value, bound: str) -> None:
    """Refuse (ValueError naming `fn` and `name`) a concrete `value` that is not a finite real
    number within `bound`: ">= a", "> a" or "[a, b]" (the forms of `PPOUpdateConfig._bounds`).
    NaN, infinities, bools and arrays of more than one number are refused; a traced scalar passes
    (under `jit` it has no value to read), a traced array of more than one number does not.

    Examples:
      >>> check_setting("gae", "gamma", 0.99, "[0, 1]")  # in range: returns None
      >>> check_setting("gae", "gamma", 1.5, "[0, 1]")
      Traceback (most recent call last):
      ValueError: gae: gamma must be a finite number in [0, 1], got 1.5"""
    if isinstance(value, jax.core.Tracer):
        if value.ndim == 0 and jnp.issubdtype(value.dtype, jnp.number) and not jnp.issubdtype(
                value.dtype, jnp.complexfloating):
            return
        raise ValueError(f"{fn}: {name} must be a real scalar, got {value.dtype}{list(value.shape)}")
    try:
        host = np.asarray(value)
    except (TypeError, ValueError):  # a ragged list
        host = np.asarray(None)
    ok = host.ndim == 0 and host.dtype.kind in "iuf" and math.isfinite(number := float(host))
    if ok and bound.startswith(">="):
        ok = number >= float(bound[2:])
    elif ok and bound.startswith(">"):
        ok = number > float(bound[1:])
    elif ok:
        low, high = (float(b) for b in bound.strip("[]").split(","))
        ok = low <= number <= high
    if not ok:
        where = "in " if bound.startswith("[") else ""
        raise ValueError(f"{fn}: {name} must be a finite number {where}{bound}, got {value!r}")


# --------------------------------------------------------------------------- masked statistics


def _safe_divide(num: Array, den: Array) -> Array:
    """num / den, 0 where den == 0 (with finite gradients)."""
    ok = den > 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def apply_mask(x: Array, mask: Array) -> Array:
    """x * mask, with padding forced to 0 even where x is inf/NaN there (e.g. -inf log-probs).
    The mask has x's rank and, along each axis, x's length or 1 (refused otherwise).

    Examples:
      >>> print(apply_mask(jnp.array([[0.5, 2.0, -jnp.inf]]), jnp.array([[1, 1, 0]])))
      [[0.5 2.  0. ]]"""
    x, mask = _with_mask("apply_mask", x, mask)
    return jnp.where(mask != 0, x * mask, 0.0)


def masked_sum(x: Array, mask: Array, axis=None) -> Array:
    """Sum of x * mask (padding 0 even where x is inf/NaN); the mask as in `masked_mean`.

    Examples:
      >>> print(masked_sum(jnp.array([[1.0, 3.0, 9.0]]), jnp.array([[1, 1, 0]])))
      4.0"""
    x, mask = _with_mask("masked_sum", x, mask)
    return jnp.sum(apply_mask(x, mask), axis=axis)


def masked_mean(x: Array, mask: Array, axis=None) -> Array:
    """Mean of `x` over the entries where `mask` is nonzero (weighted by `mask`); 0 if none.

    `x`, `mask`: e.g. `[batch, time]`; `axis=None` reduces everything. Refused: a mask of another
    rank, or of another length along an axis than x's (1 broadcasts), a dtype that is not real.

    Examples:
      >>> x, mask = jnp.array([[1.0, 3.0, 9.0]]), jnp.array([[1, 1, 0]])
      >>> print(masked_mean(x, mask))
      2.0"""
    x, mask = _with_mask("masked_mean", x, mask)
    return _safe_divide(jnp.sum(apply_mask(x, mask), axis=axis), jnp.sum(mask, axis=axis))


def masked_var(x: Array, mask: Array, axis=None, unbiased: bool = False) -> Array:
    """Variance over the mask: population (ddof=0) by default; `unbiased` applies Bessel's n/(n-1).
    The mask as in `masked_mean`.

    Examples:
      >>> x, mask = jnp.array([[1.0, 3.0, 9.0]]), jnp.array([[1, 1, 0]])
      >>> print(masked_var(x, mask), masked_var(x, mask, unbiased=True))
      1.0 2.0"""
    x, mask = _with_mask("masked_var", x, mask)
    mean = masked_mean(x, mask, axis=axis)
    mean = mean if axis is None else jnp.expand_dims(mean, axis)
    var = masked_mean(jnp.square(x - mean), mask, axis=axis)
    if unbiased:
        n = jnp.sum(mask, axis=axis)
        var = var * _safe_divide(n, n - 1.0)
    return var


def masked_whiten(x: Array, mask: Array, shift_mean: bool = True, eps: float = _EPS) -> Array:
    """(x - mean) / sqrt(var + eps) over all masked entries; padding set to 0.

    `shift_mean=False` keeps the original mean (rescales only), as used for rewards.
    `x`, `mask`: `[batch, time]` -> `[batch, time]`; the mask as in `masked_mean`, `eps` a finite
    number >= 0 when concrete.

    Examples:
      >>> x, mask = jnp.array([[1.0, 3.0, 9.0]]), jnp.array([[1, 1, 0]])
      >>> print(masked_whiten(x, mask), masked_whiten(x, mask, shift_mean=False))
      [[-1.  1.  0.]] [[1. 3. 0.]]"""
    x, mask = _with_mask("masked_whiten", x, mask)
    check_setting("masked_whiten", "eps", eps, ">= 0")
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return apply_mask(whitened, mask)


def explained_variance(values: Array, returns: Array, mask: Array) -> Array:
    """1 - Var(returns - values) / Var(returns) over the mask: 1 for a value function that
    predicts the returns, 0 for one no better than their mean, negative for a worse one.

    NaN when the returns do not vary over the mask (or the mask is empty): no value function
    explains a constant, as stable-baselines3's `explained_variance`
    (stable_baselines3/common/utils.py) returns NaN for Var(y) = 0. The returns' variance is
    taken about their first valid entry, so constant returns give exactly 0 however they round.
    `values`, `returns`, `mask`: one shape (refused otherwise).

    Examples:
      >>> returns, mask = jnp.array([[1.0, 3.0, 9.0]]), jnp.array([[1, 1, 0]])
      >>> print(explained_variance(jnp.array([[1.0, 2.0, 0.0]]), returns, mask))
      0.75
      >>> print(explained_variance(jnp.array([[2.0, 2.0, 0.0]]), returns, mask))  # the returns' mean
      0.0"""
    values, returns, mask = _same_shape("explained_variance", values=values, returns=returns,
                                        mask=mask)
    returns = returns.astype(jnp.result_type(returns, jnp.float32))
    first = jnp.ravel(returns)[jnp.argmax(jnp.ravel(mask) > 0)]
    spread = masked_var(returns - first, mask)
    unexplained = masked_var(returns - values, mask)
    return jnp.where(spread > 0, 1.0 - unexplained / jnp.where(spread > 0, spread, 1.0), jnp.nan)


# --------------------------------------------------------------------------- advantages


def gae(rewards: Array, values: Array, mask: Array, *, gamma: float = 1.0, lam: float = 0.95
        ) -> tuple[Array, Array]:
    """Generalized advantage estimation over masked sequences (a reverse `lax.scan` over time).

        delta_t = r_t + gamma * m_{t+1} V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * m_{t+1} A_{t+1}

    Rewards and values are masked first, so values beyond the last valid token count as 0 (the
    episode ends at EOS).

    Args:
      rewards, values, mask: `[batch, time]`, all one shape.
      gamma, lam: in [0, 1], checked when concrete (a traced one cannot be).
    Returns:
      (advantages, returns), `[batch, time]`, 0 on padding; returns = advantages + values.
    Refused (ValueError): shapes that differ or are not 2-d, a dtype that is not real, a concrete
    gamma or lam that is NaN, infinite or outside [0, 1].

    Examples:
      >>> rewards, values = jnp.array([[0.0, 1.0, 0.0]]), jnp.array([[0.5, 0.5, 7.0]])
      >>> advantages, returns = gae(rewards, values, jnp.array([[1, 1, 0]]), gamma=1.0, lam=0.5)
      >>> print(advantages, returns)  # the episode ends at the last valid token: 7.0 is padding
      [[0.25 0.5  0.  ]] [[0.75 1.   0.  ]]"""
    rewards, values, mask = _same_shape("gae", ndim=2, rewards=rewards, values=values, mask=mask)
    check_setting("gae", "gamma", gamma, "[0, 1]")
    check_setting("gae", "lam", lam, "[0, 1]")
    mask = mask.astype(jnp.float32)
    rewards = apply_mask(rewards.astype(jnp.float32), mask)
    values = apply_mask(values.astype(jnp.float32), mask)
    zeros = jnp.zeros_like(values[:, :1])
    next_values = jnp.concatenate([values[:, 1:], zeros], axis=1)
    next_mask = jnp.concatenate([mask[:, 1:], zeros], axis=1)
    deltas = rewards + gamma * next_values - values

    def step(next_advantage, xs):
        delta, cont = xs
        advantage = delta + gamma * lam * cont * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(step, jnp.zeros_like(values[:, 0]),
                                 (deltas.T, next_mask.T), reverse=True)
    advantages = advantages.T * mask
    return advantages, (advantages + values) * mask


# --------------------------------------------------------------------------- losses


def policy_loss(logprobs: Array, old_logprobs: Array, advantages: Array, mask: Array,
                clip: float = 0.2) -> tuple[Array, dict[str, Array]]:
    """Clipped surrogate (Schulman et al. 2017), token-level mean over the mask.

    loss = mean(max(-A r, -A clip(r, 1 - clip, 1 + clip))), r = exp(logp - old_logp).
    All inputs `[batch, time]`, one shape. Metrics: `clipfrac` (share of tokens where the clipped
    term is active), `approx_kl` (0.5 * mean((logp - old_logp)^2), the original's estimator) and
    `approx_kl_k3` (mean((r - 1) - log r), unbiased and non-negative), the ratio's mean and range.
    Refused (ValueError): shapes that differ, a dtype that is not real, a concrete `clip` that is
    not a finite number > 0 (0 pins the ratio to 1, a negative one inverts the clip).

    Examples:
      >>> logprobs, old = jnp.log(jnp.array([[0.5, 0.5, 0.5]])), jnp.log(jnp.array([[0.25, 0.5, 0.5]]))
      >>> advantages, mask = jnp.array([[1.0, -1.0, 0.0]]), jnp.array([[1, 1, 0]])  # ratios 2, 1
      >>> loss, metrics = policy_loss(logprobs, old, advantages, mask, clip=0.2)
      >>> print(round(float(loss), 4), float(metrics["clipfrac"]))  # (-1.2 + 1) / 2: the first is clipped
      -0.1 0.5"""
    logprobs, old_logprobs, advantages, mask = _same_shape(
        "policy_loss", logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
        mask=mask)
    check_setting("policy_loss", "clip", clip, "> 0")
    log_ratio = logprobs - old_logprobs
    ratio = jnp.exp(log_ratio)
    losses = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip, 1.0 + clip)
    loss = masked_mean(jnp.maximum(losses, clipped), mask)
    valid = mask > 0
    metrics = {
        "clipfrac": masked_mean((clipped > losses).astype(jnp.float32), mask),
        "approx_kl": 0.5 * masked_mean(jnp.square(log_ratio), mask),
        # Schulman's unbiased, always non-negative estimator of KL(old || new): (r - 1) - log r
        "approx_kl_k3": masked_mean(ratio - 1.0 - log_ratio, mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_min": jnp.min(jnp.where(valid, ratio, jnp.inf)),
        "ratio_max": jnp.max(jnp.where(valid, ratio, -jnp.inf)),
    }
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def value_loss(values: Array, old_values: Array, returns: Array, mask: Array,
               clip: float | None = 0.2) -> tuple[Array, dict[str, Array]]:
    """Clipped value loss: 0.5 * mean(max((v - R)^2, (old_v + clip(v - old_v, +-clip) - R)^2)).

    All inputs `[batch, time]`, one shape; `clip=None` gives the plain 0.5 * MSE. Metrics:
    `value_clipfrac`, `value_error` (unclipped MSE). Refused (ValueError): shapes that differ, a
    dtype that is not real, a concrete `clip` that is not None or a finite number >= 0.

    Examples:
      >>> values, old_values, returns = jnp.array([[1.0, 0.0, 0.0]]), jnp.zeros((1, 3)), jnp.ones((1, 3))
      >>> loss, metrics = value_loss(values, old_values, returns, jnp.array([[1, 1, 0]]), clip=0.2)
      >>> print(round(float(loss), 4), float(metrics["value_clipfrac"]))  # 0.5 * (0.8^2 + 1^2) / 2
      0.41 0.5"""
    values, old_values, returns, mask = _same_shape(
        "value_loss", values=values, old_values=old_values, returns=returns, mask=mask)
    losses = jnp.square(values - returns)
    if clip is None:
        clipped = losses
    else:
        check_setting("value_loss", "clip", clip, ">= 0")
        v_clipped = old_values + jnp.clip(values - old_values, -clip, clip)
        clipped = jnp.square(v_clipped - returns)
    loss = 0.5 * masked_mean(jnp.maximum(losses, clipped), mask)
    metrics = {
        "value_clipfrac": masked_mean((clipped > losses).astype(jnp.float32), mask),
        "value_error": masked_mean(losses, mask),
    }
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


# --------------------------------------------------------------------------- KL to the reference


def kl_penalty(logprobs: Array, ref_logprobs: Array, mask: Array, coef) -> Array:
    """Per-token KL penalty coef * (logp - ref_logp) on valid tokens, 0 on padding. `[batch, time]`.

    (logp - ref_logp) of the sampled token is the single-sample estimate of KL(pi || pi_ref).
    The penalty is subtracted from the reward (see `shaped_rewards`). Refused (ValueError): shapes
    that differ, a dtype that is not real, a `coef` that is not a scalar, or, when concrete, not
    a finite number >= 0 (a traced coefficient cannot be checked).

    Examples:
      >>> logprobs, ref_logprobs = jnp.array([[-1.0, -2.0, 0.0]]), jnp.array([[-1.5, -2.0, -9.0]])
      >>> print(kl_penalty(logprobs, ref_logprobs, jnp.array([[1, 1, 0]]), 0.1))
      [[0.05 0.   0.  ]]"""
    logprobs, ref_logprobs, mask = _same_shape("kl_penalty", logprobs=logprobs,
                                               ref_logprobs=ref_logprobs, mask=mask)
    check_setting("kl_penalty", "coef", coef, ">= 0")
    return apply_mask(coef * (logprobs - ref_logprobs), mask)


def last_token_one_hot(mask: Array) -> Array:
    """`[batch, time]` 1.0 at the last valid position of each row (all 0 for an empty row); a mask
    of another rank is refused.

    Examples:
      >>> print(last_token_one_hot(jnp.array([[1, 1, 0]])))
      [[0. 1. 0.]]"""
    mask = _real("last_token_one_hot", "mask", mask)
    if mask.ndim != 2:
        raise ValueError(f"last_token_one_hot: mask {mask.shape} must be [batch, time]")
    t = jnp.arange(mask.shape[-1])
    last = jnp.max(jnp.where(mask > 0, t, -1), axis=-1)
    return (t == last[:, None]).astype(jnp.float32)


def shaped_rewards(rewards: Array, logprobs: Array, ref_logprobs: Array, mask: Array,
                   kl_coef) -> Array:
    """Per-token rewards: -kl_coef * (logp - ref_logp), plus the task reward on the last valid
    token.

    `rewards`: `[batch]`, one per sequence; the others `[batch, time]`. Returns the per-token
    rewards `[batch, time]`, 0 on padding. Refused (ValueError): rewards of another shape than
    `[batch]` (a `[batch, 1]` one broadcast to `[batch, batch, time]`), the others not one
    `[batch, time]`, a dtype that is not real, a `kl_coef` that is not a scalar or, when
    concrete, not a finite number >= 0 (a traced coefficient cannot be checked).

    Examples:
      >>> logprobs, ref_logprobs = jnp.array([[-1.0, -1.0, 0.0]]), jnp.array([[-2.0, -1.0, 0.0]])
      >>> print(shaped_rewards(jnp.array([2.0]), logprobs, ref_logprobs, jnp.array([[1, 1, 0]]), 0.5))
      [[-0.5  2.   0. ]]"""
    logprobs, ref_logprobs, mask = _same_shape("shaped_rewards", ndim=2, logprobs=logprobs,
                                               ref_logprobs=ref_logprobs, mask=mask)
    rewards = _real("shaped_rewards", "rewards", rewards)
    if rewards.shape != mask.shape[:1]:
        raise ValueError(f"shaped_rewards: rewards {rewards.shape} must be [batch] = "
                         f"{mask.shape[:1]}, one per row of the mask {mask.shape}")
    check_setting("shaped_rewards", "kl_coef", kl_coef, ">= 0")
    mask = mask.astype(jnp.float32)
    return (rewards.astype(jnp.float32)[:, None] * last_token_one_hot(mask)
            - kl_penalty(logprobs, ref_logprobs, mask, kl_coef))


class FixedKL(NamedTuple):
    """A constant KL coefficient (the original's default in effect: 0.15).

    `value`: a finite number >= 0 (a negative one pays for moving away from the reference). The
    constructor does not check it, since JAX rebuilds these tuples with any leaves (`jax.tree.map`,
    `vmap` axes); `check`, `update` and `ppo.init_ppo_state` refuse a concrete bad value (a traced
    one cannot be checked).

    Examples:
      >>> print(FixedKL(0.1).update(current_kl=9.0, n_steps=8).value)
      0.1"""

    value: Any = 0.15

    def check(self) -> FixedKL:
        """self, or a ValueError naming the field when a concrete value is out of its range."""
        check_setting("FixedKL", "value", self.value, ">= 0")
        return self

    def update(self, current_kl, n_steps) -> FixedKL:
        del current_kl, n_steps
        return self.check()


class AdaptiveKL(NamedTuple):
    """Ziegler et al. (2019)'s proportional controller.

    e = clip(KL / target - 1, -0.2, 0.2); value *= 1 + e * n_steps / horizon. KL above the target
    raises the coefficient (stronger pull to the reference), below lowers it. `current_kl` is the
    mean per-sequence KL (summed over tokens), `n_steps` the number of sequences in the batch.
    `value` >= 0, `target` > 0 and `horizon` > 0, finite: checked as `FixedKL.value` is (by
    `check`, `update` and `ppo.init_ppo_state` when concrete, not by the constructor).

    Examples:
      >>> kl = AdaptiveKL(value=0.1, target=6.0, horizon=100.0)
      >>> print(round(float(kl.update(current_kl=9.0, n_steps=50).value), 4))  # KL above target: up
      0.11
      >>> print(round(float(kl.update(current_kl=3.0, n_steps=50).value), 4))  # below: down
      0.09"""

    value: Any = 0.15
    target: Any = 6.0
    horizon: Any = 10000.0

    def check(self) -> AdaptiveKL:
        """self, or a ValueError naming the field when a concrete one is out of its range."""
        check_setting("AdaptiveKL", "value", self.value, ">= 0")
        check_setting("AdaptiveKL", "target", self.target, "> 0")
        check_setting("AdaptiveKL", "horizon", self.horizon, "> 0")
        return self

    def update(self, current_kl, n_steps) -> AdaptiveKL:
        self.check()
        error = jnp.clip(current_kl / self.target - 1.0, -0.2, 0.2)
        return self._replace(value=self.value * (1.0 + error * n_steps / self.horizon))
