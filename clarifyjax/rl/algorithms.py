"""The group-relative algorithms' math (RLOO, GRPO) over masked `[batch, time]` arrays, where each
prompt's k samples are k consecutive rows. Pure (jax, numpy, `rl.ppo_math`); `rl.ppo` builds the
update on them. `rloo_advantages` is the one leave-one-out baseline: on numpy input it computes in
numpy on the host (the PPO rollout's group baseline), on a JAX array in JAX (under `jit`).
Arguments are checked as `rl.ppo_math` checks them: shapes always, settings when concrete; each
refusal is a one-line ValueError naming the function and the argument."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from clarifyjax.rl.ppo_math import Array, check_setting, masked_mean, policy_loss

GRPO_EPS = 1e-4  # added to the group's std: TRL's GRPOTrainer and tunix's grpo_helpers
AGGREGATIONS = ("token-mean", "sequence-mean-token-mean")


def _groups(fn: str, rewards, group) -> tuple[object, int]:
    """(rewards as a numpy or JAX array, n), refusing a rewards array that is not 1-d or does
    not split into whole groups of `group` >= 2 rows."""
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < 2:
        raise ValueError(f"{fn}: group must be an integer >= 2 (samples per prompt), got {group!r}")
    r = rewards if isinstance(rewards, jax.Array) else np.asarray(rewards)
    if r.ndim != 1 or r.shape[0] % group:
        raise ValueError(f"{fn}: rewards {tuple(r.shape)} must be [n] with n a multiple of "
                         f"group = {group} (k consecutive rows per prompt)")
    if not (jnp.issubdtype(r.dtype, jnp.floating) or jnp.issubdtype(r.dtype, jnp.integer)):
        raise ValueError(f"{fn}: rewards must hold real numbers, got dtype {r.dtype}")
    return r, int(group)


def rloo_advantages(rewards, group: int):
    """Each reward minus the mean of the other `group` - 1 rewards of its group (the leave-one-out
    baseline of RLOO, Ahmadian et al. 2024, "Back to Basics", eq. 7): [n] -> [n].

    numpy in (any real dtype; integers as float64), numpy out, computed on the host; a JAX array
    in, a JAX array out (traceable). Refused: rewards that are not [n] with n a multiple of
    `group`, a `group` that is not an integer >= 2."""
    r, k = _groups("rloo_advantages", rewards, group)
    if not isinstance(r, jax.Array) and r.dtype.kind != "f":
        r = r.astype(np.float64)
    g = r.reshape(-1, k)
    others = (g.sum(axis=1, keepdims=True) - g) / (k - 1)
    return (g - others).reshape(-1)


def grpo_advantages(rewards: Array, group: int, eps: float = GRPO_EPS) -> Array:
    """(reward - its group's mean) / (its group's std + eps): [n] -> [n] float32 (DeepSeekMath,
    Shao et al. 2024, sec. 4.1.2 "outcome supervision").

    The std is the unbiased one (ddof = 1), as TRL's GRPOTrainer (``torch.std``) and tunix's
    ``grpo_helpers.compute_advantages`` (``std(ddof=1)``) take it, with eps = 1e-4 added to it as
    both do; a group of equal rewards gets advantage 0. Refused as `rloo_advantages`, and an
    `eps` that is not a finite number >= 0 (when concrete)."""
    r, k = _groups("grpo_advantages", rewards, group)
    check_setting("grpo_advantages", "eps", eps, ">= 0")
    g = jnp.asarray(r, jnp.float32).reshape(-1, k)
    mean = jnp.mean(g, axis=1, keepdims=True)
    std = jnp.std(g, axis=1, keepdims=True, ddof=1)
    return ((g - mean) / (std + eps)).reshape(-1)


def k3_kl(logprobs: Array, ref_logprobs: Array) -> Array:
    """Per-token k3 estimate of KL(pi || pi_ref) on the sampled tokens (Schulman, "Approximating
    KL divergence", 2020; the KL term of DeepSeekMath's eq. 4 and tunix's GRPO loss):
    exp(r) - r - 1 with r = ref_logprobs - logprobs. Unbiased and >= 0; 0 where the two agree
    (so 0 on padding when both are 0 there). Same shape in and out (refused otherwise)."""
    logprobs, ref_logprobs = jnp.asarray(logprobs), jnp.asarray(ref_logprobs)
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"k3_kl: logprobs {logprobs.shape} and ref_logprobs "
                         f"{ref_logprobs.shape} must have one shape")
    for name, x in (("logprobs", logprobs), ("ref_logprobs", ref_logprobs)):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"k3_kl: {name} must be floating point, got dtype {x.dtype}")
    r = ref_logprobs.astype(jnp.float32) - logprobs.astype(jnp.float32)
    return jnp.exp(r) - r - 1.0


def _aggregate(fn: str, per_token: Array, mask: Array, aggregation: str) -> Array:
    if aggregation == "token-mean":
        return masked_mean(per_token, mask)
    if aggregation == "sequence-mean-token-mean":
        rows = jnp.sum(mask, axis=1) > 0
        per_row = masked_mean(per_token, mask, axis=1)
        return masked_mean(per_row, rows.astype(per_row.dtype))
    raise ValueError(f"{fn}: aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def grpo_loss(logprobs: Array, old_logprobs: Array, ref_logprobs: Array, advantages: Array,
              mask: Array, *, clip: float = 0.2, beta=0.04, aggregation: str = "token-mean"
              ) -> tuple[Array, dict[str, Array]]:
    """GRPO's loss: per token, the clipped surrogate max(-A r, -A clip(r, 1 -+ clip)) with
    r = exp(logp - old_logp), plus beta * `k3_kl`(logp, ref_logp); then averaged.

    aggregation "token-mean" (default): the mean over every valid token of the batch, as TRL's
    GRPOTrainer with ``loss_type="dapo"`` (its default since 0.20; "bnpo" per process) and tunix
    with ``loss_agg_mode="token-mean"``: a long sequence counts by its tokens. "sequence-mean-
    token-mean": each sequence's token mean, then the mean over sequences, as DeepSeekMath's eq. 3
    writes it (1/G sum_i 1/|o_i| sum_t) and tunix's default. All arrays `[batch, time]`, one shape
    (advantages broadcast over a sequence's tokens by the caller). Metrics: ppo_math's
    `policy_loss` metrics, "policy_loss" (the surrogate alone) and "kl_k3" (the KL term's mean).
    Refused: shapes that differ, a concrete clip <= 0 or beta < 0, an unknown aggregation."""
    check_setting("grpo_loss", "beta", beta, ">= 0")
    mask = jnp.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"grpo_loss: mask {mask.shape} must be [batch, time]")
    _, metrics = policy_loss(logprobs, old_logprobs, advantages, mask, clip)  # checks them all
    ratio = jnp.exp(logprobs - old_logprobs)
    surrogate = jnp.maximum(-advantages * ratio,
                            -advantages * jnp.clip(ratio, 1.0 - clip, 1.0 + clip))
    kl = k3_kl(logprobs, ref_logprobs)
    pg = _aggregate("grpo_loss", surrogate, mask, aggregation)
    kl_mean = _aggregate("grpo_loss", kl, mask, aggregation)
    metrics = {**metrics, "policy_loss": jax.lax.stop_gradient(pg),
               "kl_k3": jax.lax.stop_gradient(kl_mean)}
    return pg + beta * kl_mean, metrics
