"""The optimizer of every trained model (SFT and PPO's policy and value): an optax transform
and its learning-rate schedule, from an `OptimizerConfig`.

* `learning_rate(step, ...)`: linear warm-up, then constant, linear or cosine decay to 0;
* `make_schedule(config, total_steps)`: that schedule for an `OptimizerConfig`;
* `make_optimizer(config, total_steps)`: AdamW / Adam / Adafactor with global-norm clipping.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def learning_rate(step, *, lr: float, warmup_steps: int, total_steps: int,
                  schedule: str = "constant"):
    """lr(step) for update number `step` (0-based; scalar or array, numpy or jax).

        warm-up:  lr * (step + 1) / warmup_steps                   for step < warmup_steps
        then:     lr * decay((step - warmup) / (total - warmup))
    with decay(x) = 1 (constant), 1 - x (linear) or (1 + cos(pi x)) / 2 (cosine).
    """
    if schedule not in ("constant", "linear", "cosine"):
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; expected constant, "
                         "linear or cosine")
    step = jnp.asarray(step, jnp.float32)
    warm = jnp.minimum(1.0, (step + 1.0) / warmup_steps) if warmup_steps > 0 else 1.0
    progress = jnp.clip((step - warmup_steps) / max(total_steps - warmup_steps, 1), 0.0, 1.0)
    if schedule == "linear":
        decay = 1.0 - progress
    elif schedule == "cosine":
        decay = 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    else:
        decay = 1.0
    return lr * warm * decay


def make_schedule(config, total_steps: int) -> optax.Schedule:
    """The `learning_rate` schedule of an `OptimizerConfig` (name, lr, warmup_steps, schedule)."""
    kw = dict(lr=float(config.lr), warmup_steps=int(config.warmup_steps),
              total_steps=int(total_steps), schedule=config.schedule)
    return lambda count: learning_rate(count, **kw)


def _decay_mask(params):
    """Weight decay on matrices only (not on layer-norm scales or biases)."""
    return jax.tree.map(lambda x: jnp.ndim(x) >= 2, params)


def make_optimizer(config, total_steps: int) -> optax.GradientTransformation:
    """optax transform for an `OptimizerConfig`: clip_by_global_norm (when max_grad_norm > 0),
    then the optimizer with the scheduled learning rate.

    adamw: decoupled weight decay on matrices; adam: no decay (weight_decay must be 0);
    adafactor: factored second moments, no parameter-scale multiplication, as in Hugging Face's
    recommended T5 fine-tuning (``Adafactor(lr=1e-3, scale_parameter=False, relative_step=False)``).
    """
    schedule = make_schedule(config, total_steps)
    if config.name == "adamw":
        opt = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                          weight_decay=config.weight_decay, mask=_decay_mask)
    elif config.name == "adam":
        if config.weight_decay:
            raise ValueError(f"optimizer.name 'adam' has no weight decay but optimizer.weight_decay"
                             f" = {config.weight_decay}; use 'adamw'")
        opt = optax.adam(schedule, b1=config.b1, b2=config.b2, eps=config.eps)
    elif config.name == "adafactor":
        opt = optax.adafactor(schedule, multiply_by_parameter_scale=False,
                              weight_decay_rate=config.weight_decay or None,
                              weight_decay_mask=_decay_mask if config.weight_decay else None)
    else:
        raise ValueError(f"unknown optimizer.name {config.name!r}; expected adamw, adam, adafactor")
    if config.max_grad_norm and config.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), opt)
    return opt
