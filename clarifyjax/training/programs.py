"""The training programs, assembled once: what `training.loops` runs and `training.dryrun` compiles,
and their optimizer (`make_optimizer`, `make_schedule`). `SFTProgram` is one optimizer step over
``grad_accum`` micro-batches, `PPOProgram` one PPO update; each is built from real parameters
(the run) or `ShapeDtypeStruct`s with shardings (the dry run), the same step either way:

    program = SFTProgram.build(cfg, mesh, graphdef, params, dropout=False)
    state, metrics = program(program.init_state(), program.place_batch(micro_batches))
    program.lower(program.abstract_state(), program.abstract_batch(rows, s, t)).compile()"""
from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec


from clarifyjax.rl import ppo

from clarifyjax.training import sft

from clarifyjax.core import traces, sharding
from clarifyjax.rl.policy import make_ppo_fns
from clarifyjax.training.builders import abstract_tree


# --------------------------------------------------------------------------- models


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def param_shardings(params, mesh):
    """Each parameter's own NamedSharding (set when it was built), replicated otherwise."""
    return jax.tree.map(lambda x: x.sharding if isinstance(getattr(x, "sharding", None),
                                                            NamedSharding) else replicated(mesh),
                        params)


def opt_state_shardings(tx, opt_state, params, p_shardings, mesh):
    """Optimizer-state leaves shaped like their parameter share its sharding; others replicate."""
    return optax.tree_map_params(
        tx, lambda leaf, p, s: s if leaf.shape == p.shape else replicated(mesh), opt_state,
        params, p_shardings, transform_non_params=lambda _: replicated(mesh),
        is_leaf=lambda x: isinstance(x, (jax.Array, jax.ShapeDtypeStruct)))


# --------------------------------------------------------------------------- the optimizer
# The optimizer of every trained model (SFT and PPO's policy and value): an optax transform and
# its learning-rate schedule, from an `OptimizerConfig`.


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


# --------------------------------------------------------------------------- programs


@dataclasses.dataclass
class Program:
    """A jitted step, the shardings it is compiled for, and its initial state.

    models: the parameter trees the initial state is made of (arrays or ShapeDtypeStructs);
    initial: ``initial(*models) -> state`` (pure); step: the jitted step, called as
    ``program(state, batch, ...)`` with arguments placed as `in_shardings` (the batch second);
    signature: the first call's arguments as ShapeDtypeStructs with those shardings.
    """

    mesh: Any
    models: tuple
    initial: Callable
    state_shardings: Any
    in_shardings: tuple
    step: Callable
    signature: tuple | None = None

    @property
    def batch_shardings(self):
        return self.in_shardings[1]

    def init_state(self):
        """The initial state, real arrays placed with `state_shardings`."""
        return jax.device_put(self.initial(*self.models), self.state_shardings)

    def abstract_state(self):
        """The initial state as `jax.ShapeDtypeStruct`s carrying `state_shardings` (no memory)."""
        return abstract_tree(jax.eval_shape(self.initial, *self.models), self.state_shardings)

    def __call__(self, *args):
        if self.signature is None:
            self.signature = abstract_tree(args, self.in_shardings)
        return self.step(*args)

    def lower(self, *args) -> jax.stages.Lowered:
        return self.step.lower(*args)

    def lowered_text(self, *args) -> str:
        """The step's StableHLO for `args` (default: the first call's `signature`)."""
        return self.lower(*(args or self.signature)).as_text()


def sft_batch_shardings(mesh) -> dict:
    """Micro-batch stacks travel batch-major, [b, a, ...], so that the batch axis is split over
    the data axes like any batch (`shard_batch`, process-local rows on several hosts)."""
    return {k: sharding.batch_sharding(mesh, 2 if k == "example_mask" else 3)
            for k in sft.BATCH_KEYS}


def _batch_major_step(step_fn):
    def step(state, batch_major):
        micro = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch_major)  # -> [a, b, ...]
        new_state, metrics = step_fn(sft.SFTState(**state), micro)
        return new_state._asdict(), metrics
    return step


@dataclasses.dataclass
class SFTProgram(Program):
    """One SFT optimizer step; state {"params", "opt_state", "step", "rng"}; batch `sft.BATCH_KEYS`
    batch-major: [rows, grad_accum, length] ([rows, grad_accum] for example_mask)."""

    grad_accum: int = 1

    @classmethod
    def build(cls, cfg, mesh, graphdef, params, *, dropout: bool) -> SFTProgram:
        opt = cfg.optimizer
        tx = make_optimizer(opt, cfg.run.steps)

        def initial(p):
            return sft.init_state(p, tx, cfg.run.seed)._asdict()

        p_sh, rep = param_shardings(params, mesh), replicated(mesh)
        opt_state = jax.eval_shape(initial, params)["opt_state"]
        state_sh = {"params": p_sh, "opt_state": opt_state_shardings(tx, opt_state, params, p_sh,
                                                                     mesh),
                    "step": rep, "rng": rep}
        batch_sh = sft_batch_shardings(mesh)
        step_fn = sft.make_train_step(graphdef, tx, label_smoothing=opt.label_smoothing,
                                      dropout=dropout)
        step = jax.jit(traces.counted("sft_step")(_batch_major_step(step_fn)),
                       in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, rep))
        return cls(mesh, (params,), initial, state_sh, (state_sh, batch_sh), step,
                   grad_accum=opt.grad_accum)

    def place_batch(self, micro_batches) -> dict:
        """``grad_accum`` host batches -> one batch-major stack on the mesh."""
        stack = sft.stack_micro_batches(micro_batches)
        return sharding.shard_batch({k: np.swapaxes(v, 0, 1) for k, v in stack.items()},
                                    self.mesh)

    def abstract_batch(self, rows: int, source: int, target: int) -> dict:
        lengths = {"input_ids": source, "input_mask": source, "target_ids": target,
                   "target_mask": target, "example_mask": None}
        return {k: jax.ShapeDtypeStruct((rows, self.grad_accum) + ((n,) if n else ()), jnp.int32,
                                        sharding=self.batch_shardings[k])
                for k, n in lengths.items()}


def kl_controller(h):
    return (ppo.AdaptiveKL(h.kl_coef, h.kl_target, float(h.kl_horizon)) if h.adaptive_kl
            else ppo.FixedKL(h.kl_coef))


@dataclasses.dataclass
class PPOProgram(Program):
    """One update of ``ppo.algorithm`` (`ppo.make_update`: PPO, RLOO or GRPO); state
    {"ppo": `ppo.PPOState`, "rng": key data};
    called as ``program(state["ppo"], rollout, key) -> (ppo state, metrics)``, after
    ``program.record`` with the same key has given the rollout the learner's own log-probs and
    values (one compiled program does both); batch: a `ppo.Rollout` of [rows, query_len] queries
    and [rows, response_len] responses."""

    @classmethod
    def build(cls, cfg, mesh, graphdef, params, value_graphdef, value_params,
              hyper: ppo.PPOUpdateConfig | None = None) -> PPOProgram:
        """`hyper`: the update's hyperparameters (default: ``cfg.ppo``, a `ppo.PPOUpdateConfig`);
        its ``algorithm`` picks the update (`ppo.make_update`). rloo and grpo have no value model:
        `value_graphdef` and `value_params` None, and the state holds none."""
        tx = make_optimizer(cfg.optimizer, cfg.run.steps)  # policy and value alike
        hyper = cfg.ppo if hyper is None else hyper
        kl_ctl = kl_controller(cfg.ppo)

        def initial(p, v):
            return {"ppo": ppo.init_ppo_state(p, v, tx, tx, kl_ctl),
                    "rng": jax.random.key_data(jax.random.key(cfg.run.seed))}

        rep = replicated(mesh)
        p_sh = param_shardings(params, mesh)
        shapes = jax.eval_shape(initial, params, value_params)["ppo"]
        v_sh = v_opt_sh = None
        if value_params is not None:
            v_sh = param_shardings(value_params, mesh)
            v_opt_sh = opt_state_shardings(tx, shapes.value_opt_state, value_params, v_sh, mesh)
        ppo_sh = ppo.PPOState(
            policy_params=p_sh, value_params=v_sh,
            policy_opt_state=opt_state_shardings(tx, shapes.policy_opt_state, params, p_sh, mesh),
            value_opt_state=v_opt_sh, kl_ctl=jax.tree.map(lambda _: rep, shapes.kl_ctl), step=rep)
        b1, b2 = sharding.batch_sharding(mesh, 1), sharding.batch_sharding(mesh, 2)
        rollout_sh = ppo.Rollout(query_ids=b2, query_mask=b2, response_ids=b2, response_mask=b2,
                                 logprobs=b2, ref_logprobs=b2, values=b2, rewards=b1)
        update = ppo.make_update(
            *make_ppo_fns(graphdef, value_graphdef, cfg.ppo.logprob_temperature), tx, tx, hyper,
            group=cfg.ppo.samples_per_situation)
        in_sh = (ppo_sh, rollout_sh, rep, rep)
        step = jax.jit(traces.counted("ppo_update")(update), in_shardings=in_sh,
                       out_shardings=(ppo_sh, rep, (b2, b2)),
                       donate_argnums=(0,) if jax.default_backend() != "cpu" else ())
        return cls(mesh, (params, value_params), initial, {"ppo": ppo_sh, "rng": rep}, in_sh,
                   step)

    def __call__(self, state: ppo.PPOState, rollout: ppo.Rollout, key):
        """One update -> (state, metrics)."""
        return super().__call__(state, rollout, key, np.False_)[:2]

    def record(self, state: ppo.PPOState, rollout: ppo.Rollout, key
               ) -> tuple[ppo.PPOState, ppo.Rollout]:
        """(the state, unchanged, `rollout` with the log-probs and values that the update with
        this `key` computes for it before its first step): exactly on-policy by construction."""
        state, _, scores = super().__call__(state, rollout, key, np.True_)
        return state, ppo.recorded(rollout, *scores)

    def lower(self, state, rollout, key, record=np.False_) -> jax.stages.Lowered:
        return self.step.lower(state, rollout, key, record)

    def abstract_batch(self, rows: int, query_len: int, response_len: int) -> ppo.Rollout:
        def spec(target, dtype, *shape):
            return jax.ShapeDtypeStruct((rows,) + shape, dtype, sharding=target)
        sh, i32, f32 = self.batch_shardings, jnp.int32, jnp.float32
        return ppo.Rollout(
            query_ids=spec(sh.query_ids, i32, query_len),
            query_mask=spec(sh.query_mask, i32, query_len),
            response_ids=spec(sh.response_ids, i32, response_len),
            response_mask=spec(sh.response_mask, i32, response_len),
            logprobs=spec(sh.logprobs, f32, response_len),
            ref_logprobs=spec(sh.ref_logprobs, f32, response_len),
            values=spec(sh.values, f32, response_len), rewards=spec(sh.rewards, f32))

    def abstract_key(self) -> jax.ShapeDtypeStruct:
        """The update's RNG key (a typed key, replicated)."""
        key = jax.eval_shape(lambda: jax.random.key(0))
        return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated(self.mesh))
