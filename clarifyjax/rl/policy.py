"""The policy and value functions of the PPO update, over plain parameter dicts, for every family.

`response_logprobs` / `response_values`: teacher-forced log-probs of sampled responses under a T5
or a decoder-only `CausalLM` (`response_logits`, the one place the families differ; which
distribution: the comment above it), and a value model's values. `make_ppo_fns`: what
`ppo.make_ppo_update` takes; `make_rollout_scorer`, `make_reference_nll`: what the rollout
computes on device. Shapes: b = batch, s = query, t = response, m = d_model, V = vocabulary."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from clarifyjax.rl import ppo
from clarifyjax.models.causal_lm import CausalLM
from clarifyjax.models.state import Params, merge_model
from clarifyjax.models.t5 import T5, shift_right
from clarifyjax.rl.value import CausalValueModel, ValueModel, causal_response_hidden


# --------------------------------------------------------------------------- forward passes


def response_logits(model: T5 | CausalLM, query_ids, query_mask, response_ids, response_mask
                    ) -> jax.Array:
    """The logits [b, t, V] that predict each response token given the query and the response
    before it: a T5 reads the query with its encoder and the response shifted right; a
    `CausalLM` reads the prompt (the query, any padding) and the response as one sequence
    (`value.causal_response_hidden`), as `decoding.generate` sampled it."""
    if isinstance(model, CausalLM):
        return model.logits(causal_response_hidden(model, query_ids, query_mask, response_ids,
                                                   response_mask))
    return model(query_ids, query_mask, shift_right(response_ids, model.config.decoder_start_token_id))


# By default the log-probabilities are of the model's own distribution (temperature 1,
# untruncated), as in the original trainer (`Policy.forward_pass`), while its questions are
# *sampled* at temperature 0.7 and top-p 0.6: the PPO ratio, the KL penalty and the entropy then
# describe another distribution than the one the rollouts come from. `temperature` (the config's
# ``ppo.logprobs: sampling``, as TRL's PPO divides its logits by the sampling temperature) makes
# them the rollouts' own. Truncation is not modelled: a top-p set differs between policy and
# reference, and their KL would be infinite.
def response_logprobs(model: T5 | CausalLM, query_ids, query_mask, response_ids, response_mask,
                      *, with_entropy: bool = False, temperature: float = 1.0):
    """log p(response_ids[:, i] | query, response_<i) [b, t] float32 under the model's
    distribution at `temperature` (0 on padding); with_entropy also returns the per-token entropy
    [b, t]."""
    logits = response_logits(model, query_ids, query_mask, response_ids, response_mask)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    ids = response_ids[..., None].astype(jnp.int32)
    token_logp = jnp.take_along_axis(logp, ids, axis=-1)[..., 0]
    valid = response_mask > 0
    token_logp = jnp.where(valid, token_logp, 0.0)
    if not with_entropy:
        return token_logp
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return token_logp, jnp.where(valid, entropy, 0.0)


def response_values(model: ValueModel | CausalValueModel, query_ids, query_mask, response_ids,
                    response_mask):
    """V at every response position [b, t] float32 (0 on padding)."""
    return model.response_values(query_ids, query_mask, response_ids, response_mask)


def make_ppo_fns(policy_graphdef, value_graphdef, temperature: float = 1.0
                 ) -> tuple[Callable[[Params, ppo.Rollout], tuple], Callable[[Params, ppo.Rollout],
                                                                           jax.Array]]:
    """(policy_logprobs_fn, value_fn) with the signatures `ppo.make_ppo_update` takes:
    (params, rollout minibatch) -> (log-probs, entropy) [b, t] at `temperature` / values [b, t]."""
    def policy_logprobs_fn(params: Params, mb: ppo.Rollout):
        model = merge_model(policy_graphdef, params)
        return response_logprobs(model, mb.query_ids, mb.query_mask, mb.response_ids,
                                 mb.response_mask, with_entropy=True, temperature=temperature)

    def value_fn(params: Params, mb: ppo.Rollout) -> jax.Array:
        model = merge_model(value_graphdef, params)
        return response_values(model, mb.query_ids, mb.query_mask, mb.response_ids,
                               mb.response_mask)

    return policy_logprobs_fn, value_fn


class Responses(NamedTuple):
    """The arrays the policy and value functions of `make_ppo_fns` read (a `ppo.Rollout` holds
    them too): queries [b, s] and right-padded responses [b, t]."""

    query_ids: jax.Array
    query_mask: jax.Array
    response_ids: jax.Array
    response_mask: jax.Array


def make_rollout_scorer(policy_graphdef, value_graphdef, temperature: float = 1.0
                        ) -> Callable[..., tuple]:
    """`score(policy_params, ref_params, value_params, query_ids, query_mask, response_ids,
    response_mask) -> (logprobs, ref_logprobs, values)`, each [b, t] float32 (log-probs at
    `temperature`): what a `Rollout` records at sampling time (values 0 when `value_graphdef` is
    None: no value model), through the update's own functions (`make_ppo_fns`). The training loop
    then has the update's program record the log-probs and values again
    (`training.programs.PPOProgram.record`), exactly as the learner computes them.
    `score.cache_size()`: the programs compiled."""
    policy_fn, value_fn = make_ppo_fns(policy_graphdef, value_graphdef, temperature)
    logprobs, values = jax.jit(policy_fn), jax.jit(value_fn)

    def score(policy_params, ref_params, value_params, *arrays):
        batch = Responses(*arrays)
        lp = logprobs(policy_params, batch)[0]
        return (lp, logprobs(ref_params, batch)[0],
                jnp.zeros_like(lp) if value_graphdef is None else values(value_params, batch))

    score.cache_size = lambda: logprobs._cache_size() + values._cache_size()
    return score


def make_reference_nll(policy_graphdef) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """`nll(ref_params, query_ids, query_mask, response_ids, response_mask) -> (sum, tokens)`:
    the reference policy's negative log-likelihood of given responses (evaluation)."""
    def nll(ref_params, query_ids, query_mask, response_ids, response_mask):
        reference = merge_model(policy_graphdef, ref_params)
        logp = response_logprobs(reference, query_ids, query_mask, response_ids, response_mask)
        return -jnp.sum(logp), jnp.sum(response_mask.astype(jnp.float32))
    return nll
