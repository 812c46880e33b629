"""A PPO run's measurements of its policy: the reward normalizer fitted on the initial policy, and
the dev evaluation with its noise and the signs of a collapsed policy.

`evaluate_ppo` rewards one question per dev situation (greedy, or ``samples`` > 0 sampled ones
averaged), reports the reference's NLL per token and, as the original's "perplexity", per
question, each mean with its standard error, and keeps per-situation rewards (`rows`) for a
paired gain over the start (`rl.diagnostics`), with the question statistics."""
from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

from clarifyjax import data
from clarifyjax.core import sharding
from clarifyjax.reward.jsd import RewardNormalizer, flip_rate
from clarifyjax.rl.diagnostics import mean_se, question_stats
from clarifyjax.rl.rollout import RolloutSampler


def all_hosts(x: np.ndarray) -> np.ndarray:
    """Concatenate a host-local numpy array over all processes (itself on one process)."""
    if jax.process_count() == 1:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=True))


def fit_normalizer(cfg, sampler, params, dataset, say) -> RewardNormalizer:
    """The reward normalizer of the config: given, or fitted (mu0, sigma0) on the initial policy's
    rewards over ``normalizer.fit_batches`` training batches."""
    n = cfg.normalizer
    if not n.fit:
        return RewardNormalizer(gain=n.gain, bias=n.bias)
    # A separate iterator and key: fitting does not move the training data or RNG streams.
    it = data.BatchIterator(dataset, cfg.ppo.batch_size, seed=cfg.run.seed + 7919)
    key = jax.random.fold_in(jax.random.key(cfg.run.seed), 7919)
    raw, valid = [], []
    for i in range(n.fit_batches):
        batch = next(it)
        k_sample, k_reward = jax.random.split(jax.random.fold_in(key, i))
        _, _, _, questions = sampler.questions(params, batch, k_sample)
        fields = sampler.rewards(sampler.situations(batch, dataset.texts["situation"]),
                                 questions, k_reward)
        raw.append(fields["raw_reward"])
        valid.append(fields.get("valid", np.ones(len(questions), bool)))
    normalizer = RewardNormalizer.fit(all_hosts(np.concatenate(raw)),
                                      all_hosts(np.concatenate(valid)))
    say(f"[ppo] reward normalizer fitted on {n.fit_batches} batches: mu0 {normalizer.mu0:.4g}, "
        f"sigma0 {normalizer.sigma0:.4g} (gain {normalizer.gain:.4g}, bias {normalizer.bias:.4g})")
    return normalizer


def _draw(sampler, params, ref_params, batch, situations, keep, key, greedy: bool) -> dict:
    """One question per situation of `batch` and what the evaluation reads of it (kept rows)."""
    ids, mask, gen, questions = sampler.questions(params, batch, key, greedy=greedy)
    fields = sampler.rewards(situations, questions, jax.random.fold_in(key, 1))
    rows = sharding.shard_batch(keep.astype(np.int32)[:, None], sampler.mesh)
    s, n = sampler.ref_nll(ref_params, ids, mask, gen.tokens, gen.mask * rows)
    valid = fields.get("valid", np.ones(len(keep), bool))
    out = {"raw": fields["raw_reward"][keep], "valid": valid[keep], "nll": float(s),
           "tokens": float(n), "rows": float(all_hosts(keep).sum()),
           "questions": [q for q, k in zip(questions, keep) if k]}
    if "jsd" in fields:
        out["jsd"] = np.asarray(fields["jsd"])[keep]
    if all(k in fields for k in ("p_base", "p_weak", "p_strong")):
        updated = np.stack([fields["p_weak"], fields["p_strong"]], axis=1)[keep]
        out["flips"] = float(flip_rate(fields["p_base"][keep], updated,
                                       np.repeat(valid[keep][:, None], 2, axis=1)))
    return out


def evaluate_ppo(sampler: RolloutSampler, params, ref_params, dataset, *, batch_size: int,
                 normalizer, key, samples: int = 0, rows: dict | None = None) -> dict[str, float]:
    """The policy's questions for the dev situations, rewarded: mean raw and normalized reward
    and JSD with their standard errors over the situations, judgment flip rate (when the reward
    function reports judge distributions), reference NLL per token and per question (summed over
    its tokens, the original's "perplexity"), and the questions' statistics (distinct, mean words,
    the shares of the most common one and five, distinct-2: `rl.diagnostics.question_stats`).

    `samples` 0: one greedy question per situation; k > 0: k questions sampled as in training,
    each situation's reward their mean. `rows`, when given, receives the per-situation arrays
    ("reward", "raw", "jsd") and the questions, in dataset order, for paired comparisons.
    """
    draws: list[list[dict]] = []
    for i, batch in enumerate(data.eval_batches(dataset, batch_size)):
        keep = batch["example_mask"].astype(bool)
        situations = sampler.situations(batch, dataset.texts["situation"])
        draws.append([_draw(sampler, params, ref_params, batch, situations, keep,
                            jax.random.fold_in(jax.random.fold_in(key, i), d), greedy=samples == 0)
                      for d in range(max(samples, 1))])
    per = {k: [np.mean([d[k] for d in batch_draws], axis=0) for batch_draws in draws]
           for k in ("raw", "jsd") if k in draws[0][0]}
    raw = all_hosts(np.concatenate(per["raw"]))
    reward = all_hosts(np.concatenate([np.mean([normalizer(d["raw"]) for d in b], axis=0)
                                       for b in draws]))
    flat = [d for b in draws for d in b]
    questions = [q for d in flat for q in d["questions"]]
    (mean, se), stats = mean_se(reward), question_stats(questions)
    metrics = {"eval/reward_raw": float(raw.mean()), "eval/reward": mean, "eval/reward_se": se,
               "eval/valid_rate": float(all_hosts(np.concatenate([d["valid"] for d in flat])).mean()),
               "eval/ref_nll": sum(d["nll"] for d in flat) / max(sum(d["tokens"] for d in flat), 1.0),
               "eval/ref_nll_per_question": sum(d["nll"] for d in flat) / max(
                   sum(d["rows"] for d in flat), 1.0),
               "eval/question_words": stats["mean_words"], "eval/distinct_questions": stats["distinct"],
               "eval/distinct_share": stats["distinct_share"], "eval/distinct_2": stats["distinct_2"],
               "eval/top_question_share": stats["top_share"], "eval/top5_share": stats["top5_share"]}
    if "jsd" in per:
        jsd = all_hosts(np.concatenate(per["jsd"]))
        metrics["eval/jsd"], metrics["eval/jsd_se"] = mean_se(jsd)
    if "flips" in flat[0]:
        metrics["eval/flip_rate"] = float(np.nanmean([d["flips"] for d in flat]))
    if rows is not None:
        rows.update(reward=reward, raw=raw, questions=questions, top=stats["top"])
        if "jsd" in per:
            rows["jsd"] = jsd
    return metrics
