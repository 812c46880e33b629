"""The T5 adapters for PPO: the value model, and the policy / value functions `ppo.make_ppo_update`
takes, over plain parameter dicts.

* `ValueModel`: as in the original (`T5ForTokenRegression`), a separate T5 whose final decoder
  hidden state goes through a scalar head ``Linear(d_model, 1)`` at every decoder position (scaled
  by d_model**-0.5 first for v1.0 checkpoints, as the original did when embeddings are tied). It
  starts from the policy's weights (`ValueModel.from_t5`) or from its own checkpoint.
* `split_model` / `merge_model`: an NNX module <-> (graphdef, pure dict of arrays). Pure dicts are
  what the jitted steps, optax and orbax see; ``graphdef`` is static.
* `response_logprobs`, `make_ppo_fns`, `make_rollout_scorer`: teacher-forced log-probabilities
  of the sampled responses under the policy (and the frozen reference), and values.
* `RolloutSampler`: one PPO batch: sample questions on device, reward them on the host
  (`reward_fields` reads any reward function's output), score them on device -> `ppo.Rollout`.

Which distribution the log-probabilities are of: the model's own (temperature 1, untruncated), as
in the original trainer (`Policy.forward_pass`). Questions are *sampled* at temperature 0.7 and
top-p 0.6, so the PPO ratio is the usual approximation of the sampling distribution by the model's;
the KL penalty compares policy and reference under the same convention, and is exactly 0 at the
start. (A ratio under the truncated distribution can be -inf for a token that leaves the top-p
set after an update, which gives NaN gradients.)

Shapes: b = batch, s = query length, t = response length, m = d_model, V = vocabulary.
"""
from __future__ import annotations

import inspect
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clarifyjax import decoding, ppo
from clarifyjax import sharding as sharding_lib
from clarifyjax.models.t5 import T5, T5Config, shift_right
from clarifyjax.models.t5_layers import make_param

Params = Any  # a nested dict of arrays (nnx.to_pure_dict of a model's state)
MIN_QUESTION_TOKENS = 2  # the original sampled with min_length=3, counting the start token


# --------------------------------------------------------------------------- state helpers


def split_model(model: nnx.Module) -> tuple[Any, Params]:
    """(graphdef, params as a pure nested dict of arrays). Raises if the module holds anything but
    parameters (an RNG stream or a cache would be silently dropped from training state)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leftover = jax.tree.leaves(rest)
    if leftover:
        raise ValueError(f"{type(model).__name__} holds {len(leftover)} non-parameter variables; "
                         "the training state carries parameters only")
    return graphdef, nnx.to_pure_dict(params)


def merge_model(graphdef, params: Params) -> nnx.Module:
    """The module back from `split_model`'s pieces (cheap: no copy of the arrays)."""
    return nnx.merge(graphdef, params)


def copy_params(params: Params) -> Params:
    """A new buffer for every leaf (the frozen reference must not alias donated arrays)."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True), params)


# --------------------------------------------------------------------------- the value model


class ValueModel(nnx.Module):
    """A T5 trunk with a scalar head on every decoder position: V(s, q_<t) for t = 0 .. T-1."""

    def __init__(self, config: T5Config, *, rngs: nnx.Rngs, trunk: T5 | None = None):
        self.config = config
        self.trunk = trunk if trunk is not None else T5(config, rngs=rngs)
        self.head_kernel = make_param(rngs, config.d_model ** -0.5, (config.d_model, 1),
                                      ("embed", None), config.param_dtype)
        self.head_bias = nnx.Param(jnp.zeros((1,), config.param_dtype))

    @classmethod
    def from_t5(cls, model: T5, *, seed: int = 0) -> "ValueModel":
        """A value model whose trunk is a *copy* of `model` (the policy's initial weights) and
        whose head is new (seeded)."""
        graphdef, state = nnx.split(model)
        trunk = nnx.merge(graphdef, jax.tree.map(lambda x: jnp.array(x, copy=True), state))
        return cls(model.config, rngs=nnx.Rngs(seed), trunk=trunk)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 decoder_input_ids: jax.Array) -> jax.Array:
        """input_ids/attention_mask [b, s], decoder_input_ids [b, t] (shifted right)
        -> values [b, t] float32. Only the decoder's hidden states are computed (no vocabulary
        projection)."""
        t5 = self.trunk
        encoded = t5.encode(input_ids, attention_mask)
        hidden = t5.decoder(t5.embed(decoder_input_ids), encoded, attention_mask, None)
        if self.config.scale_decoder_outputs:
            hidden = hidden * jnp.asarray(self.config.d_model ** -0.5, hidden.dtype)
        values = jnp.einsum("btm,mo->bto", hidden.astype(jnp.float32),
                            self.head_kernel[...].astype(jnp.float32))
        return values[..., 0] + self.head_bias[...].astype(jnp.float32)[0]


# --------------------------------------------------------------------------- forward passes


def response_logprobs(model: T5, query_ids, query_mask, response_ids, response_mask, *,
                      with_entropy: bool = False):
    """log p(response_ids[:, i] | query, response_<i) [b, t] float32 under the model's own
    distribution (0 on padding); with_entropy also returns the per-token entropy [b, t]."""
    decoder_input_ids = shift_right(response_ids, model.config.decoder_start_token_id)
    logits = model(query_ids, query_mask, decoder_input_ids)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    ids = response_ids[..., None].astype(jnp.int32)
    token_logp = jnp.take_along_axis(logp, ids, axis=-1)[..., 0]
    valid = response_mask > 0
    token_logp = jnp.where(valid, token_logp, 0.0)
    if not with_entropy:
        return token_logp
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return token_logp, jnp.where(valid, entropy, 0.0)


def response_values(model: ValueModel, query_ids, query_mask, response_ids, response_mask):
    """V at every response position [b, t] float32 (0 on padding)."""
    decoder_input_ids = shift_right(response_ids, model.config.decoder_start_token_id)
    values = model(query_ids, query_mask, decoder_input_ids)
    return jnp.where(response_mask > 0, values, 0.0)


def make_ppo_fns(policy_graphdef, value_graphdef
                 ) -> tuple[Callable[[Params, ppo.Rollout], tuple], Callable[[Params, ppo.Rollout],
                                                                           jax.Array]]:
    """(policy_logprobs_fn, value_fn) with the signatures `ppo.make_ppo_update` takes:
    (params, rollout minibatch) -> (log-probs, entropy) [b, t] / values [b, t]."""
    def policy_logprobs_fn(params: Params, mb: ppo.Rollout):
        model = merge_model(policy_graphdef, params)
        return response_logprobs(model, mb.query_ids, mb.query_mask, mb.response_ids,
                                 mb.response_mask, with_entropy=True)

    def value_fn(params: Params, mb: ppo.Rollout) -> jax.Array:
        model = merge_model(value_graphdef, params)
        return response_values(model, mb.query_ids, mb.query_mask, mb.response_ids,
                               mb.response_mask)

    return policy_logprobs_fn, value_fn


def make_rollout_scorer(policy_graphdef, value_graphdef) -> Callable[..., tuple]:
    """`score(policy_params, ref_params, value_params, query_ids, query_mask, response_ids,
    response_mask) -> (logprobs, ref_logprobs, values)`, each [b, t] float32: what a `Rollout`
    records at sampling time. Pure; the caller jits it."""
    def score(policy_params, ref_params, value_params, query_ids, query_mask, response_ids,
              response_mask):
        policy = merge_model(policy_graphdef, policy_params)
        reference = merge_model(policy_graphdef, ref_params)
        value = merge_model(value_graphdef, value_params)
        args = (query_ids, query_mask, response_ids, response_mask)
        return (response_logprobs(policy, *args), response_logprobs(reference, *args),
                response_values(value, *args))
    return score


def make_reference_nll(policy_graphdef) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """`nll(ref_params, query_ids, query_mask, response_ids, response_mask) -> (sum, tokens)`:
    the reference policy's negative log-likelihood of given responses (evaluation)."""
    def nll(ref_params, query_ids, query_mask, response_ids, response_mask):
        reference = merge_model(policy_graphdef, ref_params)
        logp = response_logprobs(reference, query_ids, query_mask, response_ids, response_mask)
        return -jnp.sum(logp), jnp.sum(response_mask.astype(jnp.float32))
    return nll


# --------------------------------------------------------------------------- rollouts


def host_rows(x, mesh) -> np.ndarray:
    """This process's rows of a batch-sharded global array (all of them on one process)."""
    if jax.process_count() == 1:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    spec = sharding_lib.batch_sharding(mesh, x.ndim).spec
    return np.asarray(multihost_utils.global_array_to_host_local_array(x, mesh, spec))


def reward_fields(output, n: int) -> dict[str, np.ndarray]:
    """A reward function's output -> {"reward": [n] float64 raw rewards, optional "valid",
    "jsd", "p_base", "p_weak", "p_strong"}.

    Accepts an array of raw rewards, or an object with a ``raw_reward`` or ``reward`` field (e.g.
    `reward_pipeline.RewardOutput`, whose ``raw_reward`` is taken: the loop normalizes).
    """
    if isinstance(output, (np.ndarray, jax.Array, list, tuple)):
        fields = {"reward": output}
    else:
        raw = getattr(output, "raw_reward", None)
        raw = getattr(output, "reward", None) if raw is None else raw
        if raw is None:
            raise TypeError(f"the reward function returned a {type(output).__name__} without a "
                            "'reward' or 'raw_reward' field")
        fields = {k: getattr(output, k) for k in ("valid", "jsd", "p_weak", "p_strong", "p_base")
                  if getattr(output, k, None) is not None}
        fields["reward"] = raw
    out = {k: np.asarray(v) for k, v in fields.items()}
    out["reward"] = out["reward"].astype(np.float64)
    if out["reward"].shape != (n,):
        raise ValueError(f"the reward function returned rewards of shape {out['reward'].shape} "
                         f"for {n} questions")
    if not np.all(np.isfinite(out["reward"])):
        raise ValueError(f"the reward function returned non-finite rewards: {out['reward']}")
    return out


def _takes_rng(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "rng" or p.kind == p.VAR_KEYWORD for p in params)


class RolloutSampler:
    """PPO rollouts: questions sampled on device (`decoding.generate`, jitted once per shape),
    decoded and rewarded on the host (`reward_fn(situations, questions[, rng=key])` -> raw
    rewards, see `reward_fields`), then scored on device (log-probs under the policy and the
    reference, values) into a `ppo.Rollout`.

    Batches are `clarifyjax.data` batches (input_ids, input_mask [b, s], host-local rows); arrays
    are placed on `mesh` with the batch split over its data axes.
    """

    def __init__(self, tokenizer, policy_graphdef, value_graphdef, reward_fn, mesh, *,
                 max_new_tokens: int, temperature: float = 0.7, top_k: int = 0,
                 top_p: float = 0.6, min_new_tokens: int = MIN_QUESTION_TOKENS):
        self.tokenizer, self.reward_fn, self.mesh = tokenizer, reward_fn, mesh
        self.sampling = dict(max_new_tokens=int(max_new_tokens), min_new_tokens=int(min_new_tokens),
                             temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
        self._rng = _takes_rng(reward_fn)
        self.graphdef = policy_graphdef
        self.scorer = jax.jit(make_rollout_scorer(policy_graphdef, value_graphdef))
        self.ref_nll = jax.jit(make_reference_nll(policy_graphdef))

    def questions(self, params, batch, key, *, greedy: bool = False):
        """(ids, mask on the mesh, `decoding.Generation`, decoded questions of this host's rows)."""
        ids, mask = sharding_lib.shard_batch((batch["input_ids"], batch["input_mask"]), self.mesh)
        gen = decoding.generate(merge_model(self.graphdef, params), ids, mask, rng=key,
                                greedy=greedy, **self.sampling)
        texts = self.tokenizer.decode_batch(host_rows(gen.tokens, self.mesh))
        return ids, mask, gen, texts

    def rewards(self, situations, questions, key, normalizer=None) -> dict[str, np.ndarray]:
        """`reward_fields` of the reward function's output, plus "score" = normalizer(reward)."""
        args = (list(situations), list(questions))
        out = self.reward_fn(*args, rng=key) if self._rng else self.reward_fn(*args)
        fields = reward_fields(out, len(questions))
        if normalizer is not None:
            fields["score"] = np.asarray(normalizer(fields["reward"]), np.float32)
        return fields

    def rollout(self, state: ppo.PPOState, ref_params, batch, situations, key, normalizer):
        """(`ppo.Rollout`, questions, reward fields, host timings) for one batch of situations."""
        k_sample, k_reward = jax.random.split(key)
        t0 = time.perf_counter()
        ids, mask, gen, questions = self.questions(state.policy_params, batch, k_sample)
        t1 = time.perf_counter()
        fields = self.rewards(situations, questions, k_reward, normalizer)
        t2 = time.perf_counter()
        logprobs, ref_logprobs, values = self.scorer(state.policy_params, ref_params,
                                                     state.value_params, ids, mask, gen.tokens,
                                                     gen.mask)
        scores = sharding_lib.shard_batch(fields["score"], self.mesh)
        rollout = ppo.Rollout(query_ids=ids, query_mask=mask, response_ids=gen.tokens,
                              response_mask=gen.mask, logprobs=logprobs,
                              ref_logprobs=ref_logprobs, values=values, scores=scores)
        return rollout, questions, fields, {"time/sample": t1 - t0, "time/reward": t2 - t1}
