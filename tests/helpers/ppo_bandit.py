"""The toy bandit of the PPO-update tests (test_ppo, and its 8-device child): a policy that is a
table of logits per response position over a tiny vocabulary (independent positions, like a
multi-armed bandit per step), a value table per position, and a reward for one target token at
position 0."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from clarifyjax.rl import ppo

V, T, B = 8, 4, 64
TARGET = 3


def policy_logprobs(params, rollout):
    logp = jax.nn.log_softmax(params["logits"], axis=-1)  # [T, V]
    return jnp.take_along_axis(logp[None], rollout.response_ids[..., None], axis=-1)[..., 0]


def bandit_values(params, rollout):
    return jnp.broadcast_to(params["v"], rollout.response_ids.shape)


def toy_reward(response_ids):
    return (response_ids[:, 0] == TARGET).astype(jnp.float32)  # pays for the first token


@jax.jit  # eager, it would dispatch (and compile) op by op
def make_rollout(policy_params, ref_params, value_params, rng):
    k_tok, k_len = jax.random.split(rng)
    tokens = jax.random.categorical(k_tok, policy_params["logits"], shape=(B, T))
    lengths = jax.random.randint(k_len, (B,), 1, T + 1)
    mask = (jnp.arange(T)[None] < lengths[:, None]).astype(jnp.float32)
    tokens = jnp.where(mask > 0, tokens, 0)
    roll = ppo.Rollout(query_ids=jnp.zeros((B, 2), jnp.int32), query_mask=jnp.ones((B, 2)),
                       response_ids=tokens, response_mask=mask, logprobs=None,
                       ref_logprobs=None, values=None, rewards=toy_reward(tokens))
    return roll._replace(logprobs=policy_logprobs(policy_params, roll),
                         ref_logprobs=policy_logprobs(ref_params, roll),
                         values=bandit_values(value_params, roll) * mask)
