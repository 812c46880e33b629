"""ClarifyDelphi's reward: Jensen-Shannon divergence between two judge distributions, as pure,
jittable array functions (jax + numpy only), with the running reward normalizer.

    reward(s, q) = gain * JSD_2(P(j | s + a_weak) || P(j | s + a_strong)) + bias     (paper eq. 3, 5)

The JSD is the divergence (not its square root) in base 2, in [0, 1], over `[..., 3]`
distributions (bad, ok, good). `pipeline.RewardPipeline` composes the models on top. Shapes and
settings are checked under jit too, probabilities' values when concrete (docs/reliability.md)."""
from __future__ import annotations

import math
from typing import Any, NamedTuple
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

# The original's normalization, measured for Delphi (t5-11b) on its training situations:
# gain = 1 / sigma0, bias = -mu0 / sigma0.
ORIGINAL_GAIN = 4.0725
ORIGINAL_BIAS = -0.45726


# --------------------------------------------------------------------------- argument checks


def _probabilities(x, name: str) -> jnp.ndarray:
    """`x` as a float array, refusing (ValueError naming `name`) a non-real dtype always, and,
    when `x` is concrete (not traced under jit), a NaN, an infinity or a negative entry."""
    if not isinstance(x, jax.core.Tracer):
        try:
            host = np.asarray(x)
        except (TypeError, ValueError):  # ragged lists
            raise ValueError(f"{name} must be an array of probabilities, got {type(x).__name__}") from None
        if host.dtype.kind not in "iuf":
            raise ValueError(f"{name} must hold real numbers, got dtype {host.dtype}")
        bad = np.argwhere(~(np.isfinite(host) & (host >= 0)))
        if len(bad):
            at = tuple(int(i) for i in bad[0])
            raise ValueError(f"{name} must be finite and >= 0; {name}{list(at)} = {host[at]} "
                             f"({len(bad)} such entr{'ies' if len(bad) > 1 else 'y'})")
    x = jnp.asarray(x)
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise ValueError(f"{name} must hold real numbers, got dtype {x.dtype}")
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _out_of_domain(x: jnp.ndarray, axis: int) -> jnp.ndarray:
    """True where a distribution along `axis` holds a NaN, an infinity or a negative entry (a
    traced input cannot raise: the result there is NaN instead of a finite made-up number)."""
    return jnp.any(~(jnp.isfinite(x) & (x >= 0)), axis=axis)


# --------------------------------------------------------------------------- divergences


def _xlogy_ratio(p: jnp.ndarray, m: jnp.ndarray) -> jnp.ndarray:
    """p * log(p / m) with 0 * log 0 = 0, and finite gradients where p = 0 (double where)."""
    positive = p > 0
    safe_p = jnp.where(positive, p, 1.0)
    safe_m = jnp.where(positive, m, 1.0)  # m >= p / 2 > 0 wherever p > 0
    return jnp.where(positive, safe_p * (jnp.log(safe_p) - jnp.log(safe_m)), 0.0)


def _normalize(p: jnp.ndarray, axis: int) -> jnp.ndarray:
    total = jnp.sum(p, axis=axis, keepdims=True)
    return p / jnp.where(total > 0, total, 1.0)


def jsd(p, q, axis: int = -1, base: float | None = 2.0, normalize: bool = True) -> jnp.ndarray:
    """Jensen-Shannon divergence between distributions along `axis`.

    Args:
      p, q: `[..., k, ...]` non-negative arrays (probabilities, or unnormalized scores when
        `normalize`, as the original's scipy-derived version and `scipy...jensenshannon` do).
      axis: the distribution axis.
      base: logarithm base, a finite number > 0 other than 1 (2 gives a value in [0, 1]); None
        for nats.
    Returns:
      `p`'s shape without `axis`: 0.5 * KL(p || m) + 0.5 * KL(q || m), m = (p + q) / 2, clipped
      at 0 against rounding. An all-zero row counts as an all-zero distribution.
    Refused (ValueError): shapes that differ, an `axis` outside them, a bad `base`, a dtype that
    is not real; concrete entries that are NaN, infinite or negative. Traced such entries make
    their row's divergence NaN.

    Examples:
      >>> p, q = jnp.array([[1.0, 0.0, 0.0], [0.7, 0.2, 0.1]]), jnp.array([[0.0, 0.0, 1.0], [0.1, 0.2, 0.7]])
      >>> print([round(float(d), 4) for d in jsd(p, q)])  # in bits: 1 for judgments that share nothing
      [1.0, 0.3651]"""
    p, q = _probabilities(p, "p"), _probabilities(q, "q")
    dtype = jnp.promote_types(p.dtype, q.dtype)
    p, q = p.astype(dtype), q.astype(dtype)
    if p.shape != q.shape:
        raise ValueError(f"jsd: p and q must have the same shape, got {p.shape} and {q.shape}")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -p.ndim <= axis < p.ndim:
        raise ValueError(f"jsd: axis must be an integer in [-{p.ndim}, {p.ndim}), got {axis!r}")
    if base is not None and (isinstance(base, bool) or not isinstance(base, (int, float, np.number))
                             or not (math.isfinite(base) and base > 0 and base != 1)):
        raise ValueError(f"jsd: base must be None or a finite number > 0 other than 1, got {base!r}")
    bad = _out_of_domain(p, axis) | _out_of_domain(q, axis)
    if normalize:
        p, q = _normalize(p, axis), _normalize(q, axis)
    m = 0.5 * (p + q)
    div = 0.5 * jnp.sum(_xlogy_ratio(p, m) + _xlogy_ratio(q, m), axis=axis)
    if base is not None:
        div = div / math.log(base)
    return jnp.where(bad, jnp.nan, jnp.maximum(div, 0.0))


def defeasibility_reward(p_weak, p_strong, valid, invalid_reward: float = 0.0) -> jnp.ndarray:
    """The raw (unnormalized) reward of each question: JSD between the two updated judgments.

    Args:
      p_weak, p_strong: `[batch, 3]` judge distributions of the weakener- and strengthener-updated
        situations.
      valid: `[batch]` bool, False where the pair was dropped (an answer filtered by NLI, an empty
        question); those rows get `invalid_reward`, a finite number (checked when concrete).
    Returns:
      `[batch]` float32; NaN for a valid row whose traced probabilities are out of `jsd`'s domain.

    Examples:
      >>> p_weak = jnp.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
      >>> p_strong = jnp.array([[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]])
      >>> print(defeasibility_reward(p_weak, p_strong, jnp.array([True, False]), invalid_reward=-1.0))
      [ 1. -1.]"""
    if not isinstance(invalid_reward, jax.core.Tracer) and (
            isinstance(invalid_reward, (bool, str)) or not np.isfinite(np.asarray(invalid_reward, float))):
        raise ValueError(f"defeasibility_reward: invalid_reward must be a finite number, got {invalid_reward!r}")
    div = jsd(p_weak, p_strong, axis=-1)
    valid = jnp.asarray(valid, dtype=bool)
    if valid.shape != div.shape:
        raise ValueError(f"defeasibility_reward: valid has shape {valid.shape}, expected {div.shape}")
    return jnp.where(valid, div, jnp.asarray(invalid_reward, div.dtype))


# --------------------------------------------------------------------------- the paper's Table 4


def _masked_rate(values, valid) -> jnp.ndarray:
    """Mean of `values` over `valid`; NaN when nothing is valid (no silent 0)."""
    valid = jnp.asarray(valid, dtype=bool)
    count = jnp.sum(valid)
    total = jnp.sum(jnp.where(valid, values, 0.0))
    return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


def average_jsd(p_weak, p_strong, valid=None) -> jnp.ndarray:
    """Table 4's "avg. JSD": mean over valid pairs of JSD_2(p_weak, p_strong).

    `p_weak`, `p_strong`: `[batch, 3]`; `valid`: `[batch]` bool (all True when None). Scalar;
    NaN when nothing is valid or a valid row is out of `jsd`'s domain (traced).

    Examples:
      >>> p_weak = jnp.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
      >>> p_strong = jnp.array([[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]])
      >>> print(round(float(average_jsd(p_weak, p_strong)), 4), average_jsd(p_weak, p_strong, jnp.array([True, False])))
      0.5 1.0"""
    div = jsd(p_weak, p_strong, axis=-1)
    if valid is None:
        valid = jnp.ones(div.shape, bool)
    if jnp.shape(valid) != div.shape:
        raise ValueError(f"average_jsd: valid has shape {jnp.shape(valid)}, expected {div.shape}")
    return _masked_rate(div, valid)


def judgment_flips(p_base, p_updated) -> jnp.ndarray:
    """True where the judge's argmax on an updated situation differs from the base situation's.

    `p_base`: `[batch, 3]`; `p_updated`: `[batch, 3]` or `[batch, n_answers, 3]` (e.g. the
    weakener and strengthener answers stacked). Returns `p_updated.shape[:-1]` bool.
    Refused as in `jsd`: a dtype that is not real, and concrete NaN, infinite or negative entries
    (the argmax of a NaN row is no judgment; `flip_rate` gives NaN for traced ones).

    Examples:
      >>> p_base = jnp.array([[0.2, 0.7, 0.1], [0.2, 0.7, 0.1]])  # "ok", twice
      >>> p_updated = jnp.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1]])  # after a weakener: "bad"; a strengthener: "ok"
      >>> print(judgment_flips(p_base, p_updated))
      [ True False]"""
    p_base = _probabilities(p_base, "p_base")
    p_updated = _probabilities(p_updated, "p_updated")
    base = jnp.argmax(p_base, axis=-1)
    extra = p_updated.ndim - p_base.ndim
    if extra < 0 or p_updated.shape[:p_base.ndim - 1] != p_base.shape[:-1] \
            or p_updated.shape[-1] != p_base.shape[-1]:
        raise ValueError(f"judgment_flips: p_updated {p_updated.shape} does not extend p_base "
                         f"{p_base.shape} by answer axes")
    base = base.reshape(base.shape + (1,) * extra)
    return jnp.argmax(p_updated, axis=-1) != base


def flip_rate(p_base, p_updated, valid=None) -> jnp.ndarray:
    """Table 4's "Judgment Flips": the share of valid answers whose updated situation changes the
    judge's argmax against the base situation. Shapes as `judgment_flips`; `valid` has
    `p_updated.shape[:-1]` (all True when None). Scalar in [0, 1]; NaN when nothing is valid or a
    valid answer's traced probabilities (or its base's) are out of `jsd`'s domain.

    Examples:
      >>> p_base = jnp.array([[0.2, 0.7, 0.1], [0.2, 0.7, 0.1]])
      >>> p_updated = jnp.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1]])
      >>> print(flip_rate(p_base, p_updated))
      0.5"""
    flips = judgment_flips(p_base, p_updated)
    if valid is None:
        valid = jnp.ones(flips.shape, bool)
    valid = jnp.asarray(valid, bool)
    if valid.shape != flips.shape:
        raise ValueError(f"flip_rate: valid has shape {valid.shape}, expected {flips.shape}")
    base_bad = _out_of_domain(jnp.asarray(p_base), -1)
    bad = _out_of_domain(jnp.asarray(p_updated), -1) \
        | base_bad.reshape(base_bad.shape + (1,) * (flips.ndim - base_bad.ndim))
    return jnp.where(jnp.any(bad & valid), jnp.nan, _masked_rate(flips.astype(jnp.float32), valid))


# --------------------------------------------------------------------------- normalization


class RewardNormalizer(NamedTuple):
    """normalized = gain * raw + bias, i.e. (raw - mu0) / sigma0 (paper eq. 5).

    A NamedTuple, hence a pytree: it can ride inside a jitted step or a checkpoint.

    Examples:
      >>> normalizer = RewardNormalizer.fit(jnp.array([1.0, 3.0]))  # mean 2, std 1
      >>> print(normalizer.gain, normalizer.bias, normalizer(3.0))
      1.0 -2.0 1.0
      >>> original = RewardNormalizer.from_original()  # its Delphi's mean and spread of raw rewards
      >>> print(round(original.mu0, 4), round(original.sigma0, 4))
      0.1123 0.2455"""

    gain: float = 1.0
    bias: float = 0.0

    def __call__(self, raw):
        return self.gain * raw + self.bias

    @property
    def mu0(self) -> float:
        return -float(self.bias) / float(self.gain)

    @property
    def sigma0(self) -> float:
        return 1.0 / float(self.gain)

    @classmethod
    def fit(cls, raw_rewards, valid=None, *, target_mean: float = 0.0, target_std: float = 1.0
            ) -> RewardNormalizer:
        """Fit to one pass of raw rewards (a question per training situation, before training).

        Population statistics (ddof=0), as the original: gain = target_std / std,
        bias = target_mean - gain * mean. `valid` (bool, same shape) excludes dropped rows.
        Raises ValueError on fewer than 2 values, non-finite values or zero spread.
        """
        raw = np.asarray(raw_rewards, dtype=np.float64).reshape(-1)
        if valid is not None:
            valid = np.asarray(valid, dtype=bool).reshape(-1)
            if valid.shape != raw.shape:
                raise ValueError(f"RewardNormalizer.fit: valid has {valid.size} entries, "
                                 f"raw_rewards {raw.size}")
            raw = raw[valid]
        if raw.size < 2:
            raise ValueError(f"RewardNormalizer.fit needs at least 2 rewards, got {raw.size}")
        if not np.all(np.isfinite(raw)):
            bad = int(np.flatnonzero(~np.isfinite(raw))[0])
            raise ValueError(f"RewardNormalizer.fit: raw reward #{bad} is {raw[bad]}")
        mean, std = float(raw.mean()), float(raw.std())
        if not std > 0:
            raise ValueError(f"RewardNormalizer.fit: all {raw.size} rewards equal {mean}; "
                             "cannot normalize a constant reward")
        gain = target_std / std
        return cls(gain=gain, bias=target_mean - gain * mean)

    @classmethod
    def from_original(cls) -> RewardNormalizer:
        """The original's constants (mu0 ~ 0.1123, sigma0 ~ 0.2456), valid only for their Delphi."""
        return cls(gain=ORIGINAL_GAIN, bias=ORIGINAL_BIAS)

    @classmethod
    def from_mean_std(cls, mu0: float, sigma0: float) -> RewardNormalizer:
        if not sigma0 > 0:
            raise ValueError(f"RewardNormalizer: sigma0 must be > 0, got {sigma0}")
        return cls(gain=1.0 / sigma0, bias=-mu0 / sigma0)

    def to_dict(self) -> dict[str, float]:
        """JSON-ready; mu0/sigma0 are informative (from_dict reads gain and bias)."""
        return {"gain": float(self.gain), "bias": float(self.bias),
                "mu0": self.mu0, "sigma0": self.sigma0}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "reward normalizer") -> RewardNormalizer:
        missing = [k for k in ("gain", "bias") if k not in data]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}; has {sorted(data)}")
        try:
            gain, bias = float(data["gain"]), float(data["bias"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: gain/bias must be numbers ({e})") from e
        if not (math.isfinite(gain) and math.isfinite(bias)) or gain <= 0:
            raise ValueError(f"{where}: need a finite gain > 0 and a finite bias, "
                             f"got gain={gain}, bias={bias}")
        return cls(gain=gain, bias=bias)


# --------------------------------------------------------------------------- RewardPipeline
# (models composed over the pure functions above: added with the judge, NLI and fusion models.)
