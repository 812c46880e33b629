"""The policy and value functions of the PPO update, over plain parameter dicts.

`response_logprobs` / `response_values`: teacher-forced log-probs of sampled responses under a T5
(of which distribution: the comment above it), and a `ValueModel`'s values. `make_ppo_fns`: what
`ppo.make_ppo_update` takes; `make_rollout_scorer`, `make_reference_nll`: what the rollout
computes on device. Shapes: b = batch, s = query, t = response, m = d_model, V = vocabulary."""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from clarifyjax.rl import ppo
from clarifyjax.models.state import Params, merge_model
from clarifyjax.models.t5 import T5, shift_right
from clarifyjax.rl.value import ValueModel


# --------------------------------------------------------------------------- forward passes


# By default the log-probabilities are of the model's own distribution (temperature 1,
# untruncated), as in the original trainer (`Policy.forward_pass`), while its questions are
# *sampled* at temperature 0.7 and top-p 0.6: the PPO ratio, the KL penalty and the entropy then
# describe another distribution than the one the rollouts come from. `temperature` (the config's
# ``ppo.logprobs: sampling``, as TRL's PPO divides its logits by the sampling temperature) makes
# them the rollouts' own. Truncation is not modelled: a top-p set differs between policy and
# reference, and their KL would be infinite.
def response_logprobs(model: T5, query_ids, query_mask, response_ids, response_mask, *,
                      with_entropy: bool = False, temperature: float = 1.0):
    """log p(response_ids[:, i] | query, response_<i) [b, t] float32 under the model's
    distribution at `temperature` (0 on padding); with_entropy also returns the per-token entropy
    [b, t]."""
    decoder_input_ids = shift_right(response_ids, model.config.decoder_start_token_id)
    logits = model(query_ids, query_mask, decoder_input_ids)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
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


def make_rollout_scorer(policy_graphdef, value_graphdef, temperature: float = 1.0,
                        chunks: int = 1) -> Callable[..., tuple]:
    """`score(policy_params, ref_params, value_params, query_ids, query_mask, response_ids,
    response_mask) -> (logprobs, ref_logprobs, values)`, each [b, t] float32 (log-probs at
    `temperature`): what a `Rollout` records at sampling time. Pure; the caller jits it. With no
    value model (`value_graphdef` None: rloo, grpo) the values are 0.

    `chunks` > 1 scores the batch in that many equal chunks of rows (every chunks-th row), one
    after the other (`lax.map`): the update's minibatches have that many rows, and a forward pass over another
    number of rows is another XLA program, whose log-probs may differ in the last bits (1e-6 on a
    CPU). Scored in the learner's shape, the recorded log-probs are the learner's exactly."""
    def score_rows(policy_params, ref_params, value_params, query_ids, query_mask, response_ids,
                   response_mask):
        policy = merge_model(policy_graphdef, policy_params)
        reference = merge_model(policy_graphdef, ref_params)
        args = (query_ids, query_mask, response_ids, response_mask)
        logprobs = response_logprobs(policy, *args, temperature=temperature)
        values = (jnp.zeros_like(logprobs) if value_graphdef is None else
                  response_values(merge_model(value_graphdef, value_params), *args))
        return (logprobs, response_logprobs(reference, *args, temperature=temperature), values)

    def score(policy_params, ref_params, value_params, *batch):
        if chunks == 1:
            return score_rows(policy_params, ref_params, value_params, *batch)
        rows = batch[0].shape[0]
        if rows % chunks:
            raise ValueError(f"make_rollout_scorer: {rows} rows do not split into {chunks} chunks")
        # chunk c holds rows c, c + chunks, ...: each chunk spans the batch's shards alike
        split = tuple(jnp.swapaxes(x.reshape((rows // chunks, chunks) + x.shape[1:]), 0, 1)
                      for x in batch)
        out = jax.lax.map(lambda b: score_rows(policy_params, ref_params, value_params, *b), split)
        return tuple(jnp.swapaxes(x, 0, 1).reshape((rows,) + x.shape[2:]) for x in out)
    return score


def make_reference_nll(policy_graphdef) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """`nll(ref_params, query_ids, query_mask, response_ids, response_mask) -> (sum, tokens)`:
    the reference policy's negative log-likelihood of given responses (evaluation)."""
    def nll(ref_params, query_ids, query_mask, response_ids, response_mask):
        reference = merge_model(policy_graphdef, ref_params)
        logp = response_logprobs(reference, query_ids, query_mask, response_ids, response_mask)
        return -jnp.sum(logp), jnp.sum(response_mask.astype(jnp.float32))
    return nll
