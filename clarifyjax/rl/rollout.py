"""PPO rollouts: one batch of questions sampled on device, rewarded on the host, scored on device.

`RolloutSampler` samples with `decoding.generate`, rewards on the host (`reward_fields`, then the
normalizer) and scores with `policy.make_rollout_scorer` -> `ppo.Rollout`; `host_rows` gives this
process's rows of a batch-sharded array. As in `pipeline.RewardOutput`, ``raw_reward`` is the
reward function's JSD and ``reward`` the normalized one PPO pays at the last token."""
from __future__ import annotations

import functools

import inspect
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from clarifyjax import decoding

from clarifyjax.rl import algorithms, ppo
from clarifyjax.core import sharding
from clarifyjax.models.state import merge_model
from clarifyjax.rl.policy import make_reference_nll, make_rollout_scorer
from clarifyjax.text import formats
from clarifyjax.text.generator import Sampling

MIN_QUESTION_TOKENS = 2  # the original sampled with min_length=3, counting the start token


def host_rows(x, mesh) -> np.ndarray:
    """This process's rows of a batch-sharded global array (all of them on one process)."""
    if jax.process_count() == 1:
        return np.asarray(x)
    spec = sharding.batch_sharding(mesh, x.ndim).spec
    return np.asarray(multihost_utils.global_array_to_host_local_array(x, mesh, spec))


def reward_fields(output, n: int) -> dict[str, np.ndarray]:
    """A reward function's output -> {"raw_reward": [n] float64, optional "valid", "jsd",
    "p_base", "p_weak", "p_strong"}.

    Accepts an array of raw rewards, or an object with a ``raw_reward`` or ``reward`` field (e.g.
    `pipeline.RewardOutput`, whose ``raw_reward`` is taken: the loop normalizes).
    """
    if isinstance(output, (np.ndarray, jax.Array, list, tuple)):
        fields = {"raw_reward": output}
    else:
        raw = getattr(output, "raw_reward", None)
        raw = getattr(output, "reward", None) if raw is None else raw
        if raw is None:
            raise TypeError(f"the reward function returned a {type(output).__name__} without a "
                            "'reward' or 'raw_reward' field")
        fields = {k: getattr(output, k) for k in ("valid", "jsd", "p_weak", "p_strong", "p_base")
                  if getattr(output, k, None) is not None}
        fields["raw_reward"] = raw
    out = {k: np.asarray(v) for k, v in fields.items()}
    raw = out["raw_reward"] = out["raw_reward"].astype(np.float64)
    if raw.shape != (n,):
        raise ValueError(f"the reward function returned rewards of shape {raw.shape} "
                         f"for {n} questions")
    if not np.all(np.isfinite(raw)):
        raise ValueError(f"the reward function returned non-finite rewards: {raw}")
    return out


def group_baseline(rewards, group: int) -> np.ndarray:
    """Each reward minus the mean of the other `group` - 1 rewards of its group (consecutive rows
    share a situation): the leave-one-out baseline of RLOO (`algorithms.rloo_advantages`, in
    float64 on the host), which removes the situation's own difficulty from what the policy is paid
    for. [n] -> [n] float32."""
    r = np.asarray(rewards, np.float64)
    if group < 2 or r.size % group:
        raise ValueError(f"group_baseline: {r.size} rewards do not split into groups of {group} "
                         "(at least 2)")
    return algorithms.rloo_advantages(r, group).astype(np.float32)


def _takes_rng(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "rng" or p.kind == p.VAR_KEYWORD for p in params)


class RolloutSampler:
    """PPO rollouts: questions sampled on device (`decoding.generate`, jitted once per shape),
    decoded and rewarded on the host (`reward_fn(situations, questions[, rng=key])` -> raw
    rewards, see `reward_fields`; the normalizer gives the reward), then scored on device
    (log-probs under the policy and the reference, values) into a `ppo.Rollout`.

    Batches are `clarifyjax.data` batches (input_ids, input_mask [b, s], host-local rows); arrays
    are placed on `mesh` with the batch split over its data axes. The policy is a T5 or a
    decoder-only `CausalLM` (its prompts right-padded, as `decoding.generate` takes them;
    `stop_token_ids`: where its questions end besides its EOS, e.g. a chat's end of turn).

    What the reward models read (`decode`, `situations`): `clean_up_spaces` decodes as
    transformers' ``clean_up_tokenization_spaces=True`` (" ?" -> "?"); `decode_situations` gives
    them the situations decoded back from the policy's input ids (the original's `query/text`)
    instead of the data file's text.
    """

    def __init__(self, tokenizer, policy_graphdef, value_graphdef, reward_fn, mesh, *,
                 sampling: Sampling, clean_up_spaces: bool = False,
                 decode_situations: bool = False, logprob_temperature: float = 1.0,
                 stop_token_ids=()):
        self.tokenizer, self.reward_fn, self.mesh = tokenizer, reward_fn, mesh
        self.clean_up_spaces, self.decode_situations = bool(clean_up_spaces), bool(decode_situations)
        s = sampling.with_defaults(Sampling(min_new_tokens=MIN_QUESTION_TOKENS))
        self.sampling = dict(max_new_tokens=int(s.max_new_tokens), min_new_tokens=int(s.min_new_tokens),
                             temperature=float(s.temperature), top_k=int(s.top_k), top_p=float(s.top_p))
        self.stop_token_ids = tuple(int(i) for i in stop_token_ids)  # a decoder's end of turn
        self._rng = _takes_rng(reward_fn)
        self.graphdef = policy_graphdef
        self.scorer = make_rollout_scorer(policy_graphdef, value_graphdef, logprob_temperature)
        self.ref_nll = jax.jit(make_reference_nll(policy_graphdef))

    def decode(self, ids) -> list[str]:
        """The text of each row of host-local `ids` [b, L], cleaned up when `clean_up_spaces`."""
        texts = self.tokenizer.decode_batch(ids)
        return [formats.clean_up_tokenization(t) for t in texts] if self.clean_up_spaces else texts

    @functools.cached_property
    def _prefix_ids(self) -> np.ndarray:
        """The token ids of the policy's "question:" prefix, without EOS (encoded once)."""
        prefix, mask = self.tokenizer.encode_batch([formats.POLICY_PREFIX.strip()], 16)
        return np.asarray(prefix[0, :int(mask[0].sum()) - 1])

    def situations(self, batch, texts) -> list[str]:
        """The situations of `batch`'s rows as the reward models read them: `texts[index]` (the
        data file's), or with `decode_situations` the policy's input ids after the tokens of its
        "question:" prefix, decoded (`decode`)."""
        if not self.decode_situations:
            return [texts[j] for j in batch["index"]]
        ids, prefix = np.asarray(batch["input_ids"]), self._prefix_ids
        k = len(prefix)
        if ids.shape[1] > k and np.all(ids[:, :k] == prefix):
            ids = ids[:, k:]  # a vocabulary without ":" would not decode the prefix back
        return [formats.strip_policy_prefix(t) for t in self.decode(ids)]

    def questions(self, params, batch, key, *, greedy: bool = False):
        """(ids, mask on the mesh, `decoding.Generation`, decoded questions of this host's rows)."""
        ids, mask = sharding.shard_batch((batch["input_ids"], batch["input_mask"]), self.mesh)
        gen = decoding.generate(merge_model(self.graphdef, params), ids, mask, rng=key,
                                greedy=greedy, stop_token_ids=self.stop_token_ids,
                                **self.sampling)
        return ids, mask, gen, self.decode(host_rows(gen.tokens, self.mesh))

    def rewards(self, situations, questions, key, normalizer=None) -> dict[str, np.ndarray]:
        """`reward_fields` of the reward function's output, plus "reward" =
        normalizer(raw_reward) [n] float32 when a normalizer is given."""
        args = (list(situations), list(questions))
        out = self.reward_fn(*args, rng=key) if self._rng else self.reward_fn(*args)
        fields = reward_fields(out, len(questions))
        if normalizer is not None:
            fields["reward"] = np.asarray(normalizer(fields["raw_reward"]), np.float32)
        return fields

    def rollout(self, state: ppo.PPOState, ref_params, batch, situations, key, normalizer,
                group: int = 1):
        """(`ppo.Rollout`, questions, reward fields, host timings) for one batch of situations.

        `group` > 1: the batch holds each situation `group` times in a row, and the reward paid
        is each question's normalized reward minus the mean of its situation's other questions
        (`group_baseline`); fields["reward"] keeps the normalized reward itself."""
        k_sample, k_reward = jax.random.split(key)
        t0 = time.perf_counter()
        ids, mask, gen, questions = self.questions(state.policy_params, batch, k_sample)
        t1 = time.perf_counter()
        fields = self.rewards(situations, questions, k_reward, normalizer)
        t2 = time.perf_counter()
        logprobs, ref_logprobs, values = self.scorer(state.policy_params, ref_params,
                                                     state.value_params, ids, mask, gen.tokens,
                                                     gen.mask)
        paid = group_baseline(fields["reward"], group) if group > 1 else fields["reward"]
        rewards = sharding.shard_batch(paid, self.mesh)
        rollout = ppo.Rollout(query_ids=ids, query_mask=mask, response_ids=gen.tokens,
                              response_mask=gen.mask, logprobs=logprobs,
                              ref_logprobs=ref_logprobs, values=values, rewards=rewards)
        return rollout, questions, fields, {"time/sample": t1 - t0, "time/reward": t2 - t1}
