"""PPO for sequence generation, as pure functions over masked `[batch, time]` arrays.

PureJaxRL style: NamedTuples for data and state, `lax.scan`, and one pure
`ppo_update(state, rollout, rng) -> (state, metrics)` that the caller jits; the policy and value
model enter as functions of (params, minibatch). It follows the original ClarifyDelphi trainer
with its bugs fixed (docs/originals.md). Its math (masked statistics, GAE, losses, KL penalty and
controllers) is `clarifyjax.rl.ppo_math`, re-exported here under the same names; masks are 1.0 on
real response tokens (EOS included), 0.0 on right padding (a hole ends the episode for GAE)."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Literal, NamedTuple
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from clarifyjax.rl import algorithms
from clarifyjax.rl.ppo_math import (AdaptiveKL, Array, FixedKL, apply_mask, check_setting,
                                    explained_variance, gae, kl_penalty, last_token_one_hot,
                                    masked_mean, masked_sum, masked_var, masked_whiten,
                                    policy_loss, shaped_rewards, value_loss)

__all__ = [  # the math (clarifyjax.rl.ppo_math), then the update
    "AdaptiveKL", "FixedKL", "apply_mask", "check_setting", "explained_variance", "gae", "kl_penalty",
    "last_token_one_hot", "masked_mean", "masked_sum", "masked_var", "masked_whiten", "policy_loss",
    "shaped_rewards", "value_loss", "PPOUpdateConfig", "Rollout", "PPOState", "init_ppo_state",
    "check_rollout", "recorded", "make_ppo_update", "make_group_update", "make_update", "ALGORITHMS",
    "GROUP_ALGORITHMS"]

ALGORITHMS = ("ppo", "rloo", "grpo")
GROUP_ALGORITHMS = ("rloo", "grpo")  # k samples per prompt, no value model

# --------------------------------------------------------------------------- the update


@dataclasses.dataclass(frozen=True)
class PPOUpdateConfig:
    """The update's settings. Defaults: the original's PPO hyperparameters (docs/originals.md, ClarifyDelphi), minus its
    bugs. `_bounds` (field -> range) is each number's valid range; a run config's ``ppo:`` section
    (`clarifyjax.config.PPOHyperparams`, a subclass) is checked against it when it is loaded, and
    `make_ppo_update` checks any config against it (epochs and minibatches integers too)."""

    epochs: int = 4  # passes over the rollout batch
    minibatches: int = 1  # minibatches per epoch; the batch must divide evenly
    clip: float = 0.2  # policy ratio clip
    value_clip: float | None = 0.2  # None: unclipped value loss
    vf_coef: float = 1.0
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    whiten_rewards: bool = True  # rescale per-token rewards by their std (the original's default)
    # entropy bonus: the loss subtracts entropy_coef x the mean per-token entropy of the policy
    # (0: none, as the original; needs a policy_logprobs_fn that returns the entropy)
    entropy_coef: float = 0.0
    # ppo: a value model and GAE; rloo: the leave-one-out baseline over each prompt's k samples,
    # the KL penalty in the reward; grpo: group-normalised advantages, the k3 KL as a loss term
    # (docs/ppo.md, "Three algorithms"). rloo and grpo have no value model.
    algorithm: Literal["ppo", "rloo", "grpo"] = "ppo"

    # clip 0 pins the ratio to 1: the clipped objective then never lets the policy improve
    _bounds: ClassVar = {"epochs": ">= 1", "minibatches": ">= 1", "clip": "> 0",
                         "value_clip": ">= 0", "vf_coef": ">= 0", "gamma": "[0, 1]",
                         "lam": "[0, 1]", "entropy_coef": ">= 0"}


class Rollout(NamedTuple):
    """One batch of sampled responses and what was computed on them at sampling time.

    query_ids, query_mask: `[batch, query_len]` int32 / {0, 1}.
    response_ids, response_mask: `[batch, time]` (right-padded; the mask covers EOS).
    logprobs: `[batch, time]` log-probs of the response tokens under the sampling policy.
    ref_logprobs: `[batch, time]` the same under the frozen reference policy.
    values: `[batch, time]` value-model estimates at sampling time.
    rewards: `[batch]` the task reward (normalized), paid at the last valid token.
    """

    query_ids: Array
    query_mask: Array
    response_ids: Array
    response_mask: Array
    logprobs: Array
    ref_logprobs: Array
    values: Array
    rewards: Array


class PPOState(NamedTuple):
    policy_params: Any
    value_params: Any
    policy_opt_state: Any
    value_opt_state: Any
    kl_ctl: FixedKL | AdaptiveKL
    step: Array


def init_ppo_state(policy_params, value_params, policy_tx: optax.GradientTransformation,
                   value_tx: optax.GradientTransformation, kl_ctl=None) -> PPOState:
    """A fresh PPOState (optimizer states from `tx.init`, a FixedKL(0.15) unless given).
    `value_params` None (rloo, grpo: no value model) gives value_opt_state None too.

    A FixedKL or AdaptiveKL with a concrete field out of its range (a negative coefficient, a
    target or horizon <= 0, NaN) is refused here (ValueError), where it enters the state."""
    kl_ctl = FixedKL() if kl_ctl is None else kl_ctl
    if isinstance(kl_ctl, (FixedKL, AdaptiveKL)):
        kl_ctl.check()
    return PPOState(policy_params=policy_params, value_params=value_params,
                    policy_opt_state=policy_tx.init(policy_params),
                    value_opt_state=None if value_params is None else value_tx.init(value_params),
                    kl_ctl=jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), kl_ctl),
                    step=jnp.zeros((), jnp.int32))


def recorded(rollout: Rollout, logprobs, values) -> Rollout:
    """`rollout` with the learner's log-probs and values (`make_update`'s record). Its reference
    log-probs move by as much as its log-probs, so the log-ratio to the reference stays the one
    sampled, where one program scored both: exactly 0 while the policy is the reference."""
    return rollout._replace(logprobs=logprobs, values=values,
                            ref_logprobs=rollout.ref_logprobs + (logprobs - rollout.logprobs))


def check_rollout(rollout: Rollout) -> tuple[int, int]:
    """Static shape checks (they run at trace time); returns (batch, time)."""
    if rollout.response_ids.ndim != 2:
        raise ValueError(f"Rollout.response_ids must be [batch, time], got {rollout.response_ids.shape}")
    batch, time = rollout.response_ids.shape
    for name in ("response_mask", "logprobs", "ref_logprobs", "values"):
        shape = getattr(rollout, name).shape
        if shape != (batch, time):
            raise ValueError(f"Rollout.{name} has shape {shape}, expected [batch, time] = "
                             f"{(batch, time)} like response_ids")
    if rollout.rewards.shape != (batch,):
        raise ValueError(f"Rollout.rewards has shape {rollout.rewards.shape}, expected ({batch},)")
    for name in ("query_ids", "query_mask"):
        shape = getattr(rollout, name).shape
        if len(shape) < 1 or shape[0] != batch:
            raise ValueError(f"Rollout.{name} has shape {shape}, expected [batch={batch}, ...]")
    return batch, time


def _check_config(config: PPOUpdateConfig) -> None:
    """Refuse (ValueError) a setting outside `PPOUpdateConfig._bounds` (NaN and infinities too),
    or epochs / minibatches that are not integers, as the config loader refuses them in a file."""
    for name, bound in PPOUpdateConfig._bounds.items():
        value = getattr(config, name)
        if value is not None or name != "value_clip":
            check_setting("make_ppo_update", f"PPOUpdateConfig.{name}", value, bound)
    for name in ("epochs", "minibatches"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"make_ppo_update: PPOUpdateConfig.{name} must be an integer >= 1, "
                             f"got {value!r}")
    if config.algorithm not in ALGORITHMS:
        raise ValueError(f"make_ppo_update: PPOUpdateConfig.algorithm must be one of "
                         f"{ALGORITHMS}, got {config.algorithm!r}")


def _policy_outputs(out) -> tuple[Array, Array | None]:
    """policy_logprobs_fn may return logprobs, or (logprobs, per-token entropy)."""
    if isinstance(out, tuple):
        if len(out) != 2:
            raise ValueError("policy_logprobs_fn must return logprobs or (logprobs, entropy)")
        return out
    return out, None


def _make_loss_fn(policy_logprobs_fn, value_fn, config: PPOUpdateConfig):
    """`loss(policy_params, value_params, minibatch, advantages, returns) -> (total, metrics)`:
    the clipped policy loss + vf_coef * the clipped value loss - entropy_coef * the mean per-token
    entropy of one minibatch."""
    def loss_fn(policy_params, value_params, mb: Rollout, advantages, returns):
        mask = mb.response_mask.astype(jnp.float32)
        logprobs, entropy = _policy_outputs(policy_logprobs_fn(policy_params, mb))
        values = value_fn(value_params, mb)
        if logprobs.shape != mask.shape or values.shape != mask.shape:
            raise ValueError(f"policy_logprobs_fn gave {logprobs.shape} and value_fn "
                             f"{values.shape}; both must be the minibatch's {mask.shape}")
        # Padding may hold -inf log-probs: zero it before exp() so neither loss nor grad is NaN.
        logprobs = jnp.where(mask > 0, logprobs.astype(jnp.float32), 0.0)
        values = jnp.where(mask > 0, values.astype(jnp.float32), 0.0)
        pg_loss, pg_metrics = policy_loss(logprobs, mb.logprobs, advantages, mask, config.clip)
        vf_loss, vf_metrics = value_loss(values, mb.values, returns, mask, config.value_clip)
        total = pg_loss + config.vf_coef * vf_loss
        metrics = {"policy_loss": pg_loss, "value_loss": vf_loss, **pg_metrics, **vf_metrics,
                   "logprob_diff_max": _logprob_diff_max(logprobs, mb.logprobs, mask)}
        return _with_entropy(total, metrics, entropy, mask, config, (logprobs, values))

    return loss_fn


def _logprob_diff_max(logprobs, recorded, mask) -> Array:
    """max |recomputed - recorded log-prob| over the valid tokens (0 when none)."""
    return jnp.max(jnp.where(mask > 0, jnp.abs(logprobs - recorded), 0.0))


def _with_entropy(total, metrics, entropy, mask, config: PPOUpdateConfig, scores):
    """(total - entropy_coef x the mean per-token entropy, (the metrics with it, `scores`: the
    minibatch's log-probs and values)), the aux without gradients."""
    if entropy is not None:
        entropy = jnp.where(mask > 0, entropy.astype(jnp.float32), 0.0)
        metrics["policy_entropy"] = masked_mean(entropy, mask)
        # per question (summed over its tokens), as the original logged it
        metrics["policy_entropy_per_question"] = jnp.mean(jnp.sum(entropy, axis=1))
        total = total - config.entropy_coef * metrics["policy_entropy"]
    elif config.entropy_coef:
        raise ValueError(f"PPOUpdateConfig.entropy_coef = {config.entropy_coef} needs a "
                         "policy_logprobs_fn that returns (logprobs, entropy)")
    metrics["total_loss"] = total
    return total, jax.tree.map(jax.lax.stop_gradient, (metrics, scores))


def _advantages(rollout: Rollout, mask, kl_coef, config: PPOUpdateConfig
                ) -> tuple[Array, Array, Array]:
    """(advantages, returns, advantages before whitening) `[batch, time]`: GAE over the shaped
    per-token rewards (the rollout's reward at the last token, the KL penalty at every token),
    whitened as configured."""
    token_rewards = shaped_rewards(rollout.rewards, rollout.logprobs, rollout.ref_logprobs, mask,
                                   kl_coef)
    if config.whiten_rewards:
        token_rewards = masked_whiten(token_rewards, mask, shift_mean=False)
    raw, returns = gae(token_rewards, rollout.values, mask, gamma=config.gamma, lam=config.lam)
    advantages = masked_whiten(raw, mask) if config.whiten_advantages else raw
    return advantages, returns, raw


def _rollout_metrics(rollout: Rollout, mask, kl_coef, advantages) -> tuple[Array, dict[str, Array]]:
    """(mean per-sequence KL, the rollout's statistics before the update that every algorithm
    logs), in the original's units: per-sequence sums. "mean_score" is the mean (normalized)
    reward: the key keeps its name so that the metrics of a resumed run continue its earlier ones."""
    kl_tokens = apply_mask(rollout.logprobs - rollout.ref_logprobs, mask)
    seq_kl = jnp.mean(jnp.sum(kl_tokens, axis=1))
    return seq_kl, {
        "kl_to_ref": seq_kl, "kl_to_ref_per_token": masked_mean(kl_tokens, mask),
        "kl_coef": kl_coef, "mean_score": jnp.mean(rollout.rewards),
        "mean_reward_total": jnp.mean(rollout.rewards) - kl_coef * seq_kl,
        "entropy": masked_mean(-rollout.logprobs, mask),  # sampled-token estimate, per token
        "response_length": jnp.mean(jnp.sum(mask, axis=1)),
        "advantages_mean": masked_mean(advantages, mask), "reward_std": jnp.std(rollout.rewards)}


def _prepared(rollout: Rollout, minibatches: int, group: int = 1
              ) -> tuple[int, int, Array, Rollout]:
    """(batch, minibatch size, float mask, the rollout in float32 with padding zeroed), refusing
    (at trace time) a batch that does not split into `minibatches` (and groups of `group`)."""
    batch, _ = check_rollout(rollout)
    if batch % minibatches or batch % group:
        raise ValueError(f"batch size {batch} is not divisible by PPOUpdateConfig.minibatches="
                         f"{minibatches}" + (f" and the group {group}" if group > 1 else ""))
    mask = rollout.response_mask.astype(jnp.float32)
    return batch, batch // minibatches, mask, rollout._replace(
        logprobs=apply_mask(rollout.logprobs.astype(jnp.float32), mask),
        ref_logprobs=apply_mask(rollout.ref_logprobs.astype(jnp.float32), mask),
        values=apply_mask(rollout.values.astype(jnp.float32), mask),
        rewards=rollout.rewards.astype(jnp.float32))


def _epochs(minibatch_step, carry, parts, batch: int, rng, config: PPOUpdateConfig, record):
    """`config.epochs` passes of `minibatch_step` over `parts` (arrays [batch, ...]), each over a
    fresh permutation split into `config.minibatches` -> (carry, per-step metrics [epochs,
    minibatches], (log-probs, values) [batch, t] as the first pass computed them). With `record`
    (a traced bool) only the first pass runs, and its steps apply nothing."""
    keys = jax.random.split(rng, config.epochs)
    step = functools.partial(minibatch_step, record=record)

    def one_pass(e, carry):
        order = jax.random.permutation(keys[e], batch)
        split = jax.tree.map(lambda x: x[order].reshape(
            (config.minibatches, batch // config.minibatches) + x.shape[1:]), parts)
        carry, (metrics, scores) = jax.lax.scan(step, carry, split)
        return carry, metrics, jax.tree.map(lambda x: jnp.zeros((batch,) + x.shape[2:], x.dtype)
                                            .at[order].set(x.reshape((batch,) + x.shape[2:])), scores)

    def body(e, loop):  # loop: (carry, metrics [epochs, ...], the first pass's scores)
        carry, step_metrics, pass_scores = one_pass(e, loop[0])
        return (carry, jax.tree.map(lambda buf, x: buf.at[e].set(x), loop[1], step_metrics),
                jax.tree.map(lambda old, new: jnp.where(e == 0, new, old), loop[2], pass_scores))

    metrics, scores = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                                   jax.eval_shape(one_pass, 0, carry)[1:])
    metrics = jax.tree.map(lambda x: jnp.zeros((config.epochs,) + x.shape, x.dtype), metrics)
    passes = jnp.where(record, 1, config.epochs)  # a while loop: record pays for one pass
    return jax.lax.fori_loop(0, passes, body, (carry, metrics, scores))


def _apply(record, tx, params, opt_state, grads):
    """(params, optimizer state) after `tx`'s step with `grads`; where `record`, both as they
    were, bit for bit (selects, which fuse into the update: a branch would copy the state)."""
    updates, new_opt = tx.update(grads, opt_state, params)
    keep = functools.partial(jax.tree.map, lambda old, new: jnp.where(record, old, new))
    return keep(params, optax.apply_updates(params, updates)), keep(opt_state, new_opt)


def _counters(record, state: PPOState, new_state: PPOState) -> PPOState:
    """`new_state` with the KL controller and step count of `state` where `record`."""
    kl_ctl, step = jax.tree.map(lambda old, new: jnp.where(record, old, new),
                                (state.kl_ctl, state.step), (new_state.kl_ctl, new_state.step))
    return new_state._replace(kl_ctl=kl_ctl, step=step)


def _reduce_step_metrics(step_metrics: dict[str, Array]) -> dict[str, Array]:
    """Each metric over the epochs x minibatches `[epochs, minibatches]`: the mean, but the ratio's
    range is its range over them all, and "max_abs_logprob_diff" is the first minibatch's of the
    first epoch (before any update: the recorded log-probs against the learner's own)."""
    reduce = {"ratio_min": jnp.min, "ratio_max": jnp.max}
    out = {k: reduce.get(k, jnp.mean)(v) for k, v in step_metrics.items()
           if k != "logprob_diff_max"}
    out["max_abs_logprob_diff"] = step_metrics["logprob_diff_max"][0, 0]
    return out


def make_ppo_update(policy_logprobs_fn: Callable[[Any, Rollout], Any],
                    value_fn: Callable[[Any, Rollout], Array],
                    policy_tx: optax.GradientTransformation,
                    value_tx: optax.GradientTransformation,
                    config: PPOUpdateConfig = PPOUpdateConfig()
                    ) -> Callable[[PPOState, Rollout, Array], tuple[PPOState, dict[str, Array]]]:
    """Build the pure PPO update `ppo_update(state, rollout, rng) -> (state, metrics)`
    (`make_update`'s step for ppo, without recording).

    policy_logprobs_fn(policy_params, rollout_minibatch) -> `[b, t]` log-probs of the response
      tokens (or a tuple (log-probs, per-token entropy) to get an entropy metric).
    value_fn(value_params, rollout_minibatch) -> `[b, t]` values.

    The update: shaped per-token rewards (the rollout's reward at the last token, per-token KL
    penalty with the controller's current coefficient) -> optional reward whitening -> GAE ->
    advantage whitening -> `epochs` passes, each over a fresh permutation split into
    `minibatches`, of one gradient step on `clipped policy loss + vf_coef * clipped value loss`
    (two optax transforms, one per parameter set) -> KL controller update from the rollout's mean
    per-sequence KL. Metrics are scalars: losses averaged over all minibatch steps, and rollout
    statistics (`explained_variance` NaN when the returns are constant). Refused (ValueError): a
    setting outside `PPOUpdateConfig._bounds` (here), a rollout of mismatched shapes (at trace
    time); the state's KL controller is checked by `init_ppo_state` (under `jit` it is traced).
    """
    step = _ppo_step(policy_logprobs_fn, value_fn, policy_tx, value_tx, config)
    return lambda state, rollout, rng: step(state, rollout, rng)[:2]


def _ppo_step(policy_logprobs_fn, value_fn, policy_tx, value_tx, config: PPOUpdateConfig):
    _check_config(config)
    grad_fn = jax.grad(_make_loss_fn(policy_logprobs_fn, value_fn, config), argnums=(0, 1),
                       has_aux=True)

    def minibatch_step(carry, minibatch, record):
        policy_params, value_params, policy_opt, value_opt = carry
        mb, advantages, returns = minibatch
        (policy_grads, value_grads), (metrics, scores) = grad_fn(policy_params, value_params, mb,
                                                                 advantages, returns)
        policy_params, policy_opt = _apply(record, policy_tx, policy_params, policy_opt,
                                           policy_grads)
        value_params, value_opt = _apply(record, value_tx, value_params, value_opt, value_grads)
        metrics["policy_grad_norm"] = optax.tree.norm(policy_grads)
        metrics["value_grad_norm"] = optax.tree.norm(value_grads)
        return (policy_params, value_params, policy_opt, value_opt), (metrics, scores)

    def ppo_step(state: PPOState, rollout: Rollout, rng: Array, record=False):
        batch, _, mask, rollout = _prepared(rollout, config.minibatches)

        kl_coef = jnp.asarray(state.kl_ctl.value, jnp.float32)
        advantages, returns, raw_advantages = _advantages(rollout, mask, kl_coef, config)
        carry = (state.policy_params, state.value_params, state.policy_opt_state,
                 state.value_opt_state)
        carry, step_metrics, scores = _epochs(minibatch_step, carry,
                                              (rollout, advantages, returns), batch, rng,
                                              config, record)
        metrics = _reduce_step_metrics(step_metrics)

        seq_kl, stats = _rollout_metrics(rollout, mask, kl_coef, advantages)
        metrics.update(stats, returns_mean=masked_mean(returns, mask),
                       returns_var=masked_var(returns, mask),
                       advantages_raw_mean=masked_mean(raw_advantages, mask),  # before whitening
                       advantages_raw_std=jnp.sqrt(masked_var(raw_advantages, mask)),
                       explained_variance=explained_variance(rollout.values, returns, mask))
        policy_params, value_params, policy_opt, value_opt = carry
        new_state = PPOState(policy_params=policy_params, value_params=value_params,
                             policy_opt_state=policy_opt, value_opt_state=value_opt,
                             kl_ctl=state.kl_ctl.update(seq_kl, batch),
                             step=state.step + 1)
        return _counters(record, state, new_state), metrics, scores

    return ppo_step


# --------------------------------------------------------------------------- RLOO and GRPO


def _group_advantages(rollout: Rollout, mask, kl_coef, config: PPOUpdateConfig, group: int
                      ) -> tuple[Array, Array]:
    """(token advantages `[batch, time]`, per-sequence advantages before whitening `[batch]`).

    rloo: the reward minus kl_coef x the sequence's summed log-ratio to the reference (the RLOO
    paper's sequence-level KL-penalised reward, as TRL's RLOOTrainer with its default
    ``token_level_kl=False``), then `algorithms.rloo_advantages` over each group; whitened over the
    batch's sequences when ``whiten_advantages`` (TRL's ``normalize_advantage``). grpo:
    `algorithms.grpo_advantages` of the reward alone (its KL is a loss term)."""
    if config.algorithm == "rloo":
        seq_kl = masked_sum(rollout.logprobs - rollout.ref_logprobs, mask, axis=1)
        raw = algorithms.rloo_advantages(rollout.rewards - kl_coef * seq_kl, group)
        adv = masked_whiten(raw, jnp.ones_like(raw)) if config.whiten_advantages else raw
    else:
        raw = adv = algorithms.grpo_advantages(rollout.rewards, group)
    return adv[:, None] * mask, raw


def _make_group_loss_fn(policy_logprobs_fn, config: PPOUpdateConfig):
    """`loss(policy_params, minibatch, advantages, kl_coef) -> (total, metrics)`: rloo the PPO
    clipped policy loss, grpo `algorithms.grpo_loss` (beta = kl_coef); - entropy_coef x the mean
    per-token entropy."""
    def loss_fn(policy_params, mb: Rollout, advantages, kl_coef):
        mask = mb.response_mask.astype(jnp.float32)
        logprobs, entropy = _policy_outputs(policy_logprobs_fn(policy_params, mb))
        if logprobs.shape != mask.shape:
            raise ValueError(f"policy_logprobs_fn gave {logprobs.shape}; it must be the "
                             f"minibatch's {mask.shape}")
        logprobs = jnp.where(mask > 0, logprobs.astype(jnp.float32), 0.0)
        if config.algorithm == "grpo":
            total, metrics = algorithms.grpo_loss(logprobs, mb.logprobs, mb.ref_logprobs,
                                                  advantages, mask, clip=config.clip,
                                                  beta=kl_coef)
        else:
            total, metrics = policy_loss(logprobs, mb.logprobs, advantages, mask, config.clip)
            metrics = {"policy_loss": total, **metrics}
        metrics["logprob_diff_max"] = _logprob_diff_max(logprobs, mb.logprobs, mask)
        return _with_entropy(total, metrics, entropy, mask, config,
                             (logprobs, jnp.zeros_like(logprobs)))

    return loss_fn


def make_group_update(policy_logprobs_fn: Callable[[Any, Rollout], Any],
                      policy_tx: optax.GradientTransformation, config: PPOUpdateConfig,
                      group: int) -> Callable[[PPOState, Rollout, Array],
                                              tuple[PPOState, dict[str, Array]]]:
    """The pure RLOO or GRPO update (``config.algorithm``) `update(state, rollout, rng) ->
    (state, metrics)`: no value model (the state's value_params and value_opt_state are None).

    The rollout holds each prompt's `group` samples in consecutive rows, and its reward is the
    task reward of each (no baseline subtracted). Advantages per sequence (`_group_advantages`),
    broadcast over its tokens; then `epochs` passes over a fresh permutation split into
    `minibatches`, one optax step each on the clipped objective (rloo: `ppo_math.policy_loss`;
    grpo: `algorithms.grpo_loss` with beta the KL controller's coefficient); the KL controller
    is updated from the mean per-sequence KL as in PPO. Refused (ValueError): a group < 2, a batch
    that is not whole groups or minibatches, settings as `make_ppo_update`."""
    step = _group_step(policy_logprobs_fn, policy_tx, config, group)
    return lambda state, rollout, rng: step(state, rollout, rng)[:2]


def _group_step(policy_logprobs_fn, policy_tx, config: PPOUpdateConfig, group: int):
    _check_config(config)
    if config.algorithm not in GROUP_ALGORITHMS:
        raise ValueError(f"make_group_update: PPOUpdateConfig.algorithm must be one of "
                         f"{GROUP_ALGORITHMS}, got {config.algorithm!r}")
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < 2:
        raise ValueError(f"make_group_update: group must be an integer >= 2 (samples per "
                         f"prompt), got {group!r}")
    grad_fn = jax.grad(_make_group_loss_fn(policy_logprobs_fn, config), has_aux=True)

    def minibatch_step(carry, minibatch, record, kl_coef):
        mb, advantages = minibatch
        grads, (metrics, scores) = grad_fn(carry[0], mb, advantages, kl_coef)
        metrics["policy_grad_norm"] = optax.tree.norm(grads)
        return _apply(record, policy_tx, *carry, grads), (metrics, scores)

    def group_step(state: PPOState, rollout: Rollout, rng: Array, record=False):
        batch, _, mask, rollout = _prepared(rollout, config.minibatches, group)
        kl_coef = jnp.asarray(state.kl_ctl.value, jnp.float32)
        advantages, raw = _group_advantages(rollout, mask, kl_coef, config, group)
        carry = (state.policy_params, state.policy_opt_state)
        (params, opt), step_metrics, scores = _epochs(
            functools.partial(minibatch_step, kl_coef=kl_coef), carry, (rollout, advantages), batch, rng,
            config, record)
        metrics = _reduce_step_metrics(step_metrics)
        seq_kl, stats = _rollout_metrics(rollout, mask, kl_coef, advantages)
        metrics.update(stats, advantages_raw_mean=jnp.mean(raw), advantages_raw_std=jnp.std(raw))
        new_state = state._replace(policy_params=params, policy_opt_state=opt,
                                   kl_ctl=state.kl_ctl.update(seq_kl, batch),
                                   step=state.step + 1)
        return _counters(record, state, new_state), metrics, scores

    return group_step


def make_update(policy_logprobs_fn, value_fn, policy_tx, value_tx,
                config: PPOUpdateConfig = PPOUpdateConfig(), group: int = 1):
    """`update(state, rollout, rng, record=False) -> (state, metrics, (log-probs, values))`, the
    step of ``config.algorithm``: `make_ppo_update`'s (ppo; `group` unused: a PPO rollout's
    rewards come with any group baseline already paid) or `make_group_update`'s (rloo, grpo: over
    groups of `group` consecutive rows; `value_fn` and `value_tx` unused).

    Recording: with `record` true (a traced bool) it runs the first epoch only, applies nothing
    (the state comes back bit for bit) and returns the rollout's log-probs and values [b, t] as
    its gradient program computes them (values 0 without a value model). Jit it once and call it
    with record true, then false on the rollout that holds them (`recorded`): the one compiled
    program computes both, so the first minibatch recomputes them exactly (`max_abs_logprob_diff`
    0)."""
    if config.algorithm == "ppo":
        return _ppo_step(policy_logprobs_fn, value_fn, policy_tx, value_tx, config)
    return _group_step(policy_logprobs_fn, policy_tx, config, group)
