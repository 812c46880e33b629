"""PPO learns what can be learned, and only that: over three seeds, a short run on a tiny random
policy raises a learnable reward by more than the seeds' spread explains (the 95% Student's t
interval of the mean gain excludes 0, and every seed gains), while the same runs paid a reward
that ignores the question (noise) gain nothing beyond that spread.

The learnable reward is tests/helpers/ppo_runs.py's token-level proxy (`lower_half_share`); the
gain is in its raw units, on the sampled rollouts (the quantity PPO raises): the mean raw reward
of the last 5 steps minus the first 5's. `rl.diagnostics.t_interval` gives the interval.
PPO_LEARNS_SEED_OFFSET=k runs seeds k, k+1, k+2 (the closing note of issue 35 ran ten offsets).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from helpers.ppo_runs import lower_half_share, ppo_config
from clarifyjax.rl.diagnostics import t_interval
from clarifyjax.training import loops

OFFSET = int(os.environ.get("PPO_LEARNS_SEED_OFFSET", "0"))
SEEDS = (OFFSET, OFFSET + 1, OFFSET + 2)
# lr 3e-4: at 1e-3 (the earlier setting) a step moved the tiny policy by 0.3-1.2 nats of KL with
# 20-50% of the ratios clipped, and one seed in four lost reward (-0.20 on seed 3)
STEPS = 30
LR = 3e-4


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    from helpers.tiny_models import tiny_spm_folder

    return tiny_spm_folder(tmp_path_factory, vocab_size=600)


def gains(tmp_path, spm, reward_of) -> list[float]:
    out = []
    for seed in SEEDS:
        cfg = ppo_config(tmp_path / f"run{seed}", spm, steps=STEPS,
                         overrides=[f"run.seed={seed}", f"run.save_every={STEPS}", f"optimizer.lr={LR}"])
        result = loops.train_ppo(cfg, reward_fn=reward_of(seed), tensorboard=False, progress=False,
                                 export=False)
        raw = np.array([h["train/reward_raw"] for h in result["history"]])
        out.append(float(raw[-5:].mean() - raw[:5].mean()))
    return out


@pytest.mark.slow  # six short PPO runs: about three minutes on two cores
def test_ppo_raises_a_learnable_reward_beyond_its_seeds_spread_and_not_a_noise_reward(tmp_path, spm):
    from clarifyjax.text.tokenizer import Tokenizer

    learnable = lower_half_share(Tokenizer.from_pretrained(spm))
    learned = gains(tmp_path / "learnable", spm, lambda seed: learnable)
    low, high = t_interval(learned)
    print("learnable reward: gains", np.round(learned, 3), "95% interval", (low, high))
    assert all(g > 0 for g in learned) and low > 0

    def noise(seed):
        rng = np.random.default_rng(seed)
        return lambda situations, questions: rng.uniform(0.0, 1.0, len(questions))

    drift = gains(tmp_path / "noise", spm, noise)
    n_low, n_high = t_interval(drift)
    print("noise reward: gains", np.round(drift, 3), "95% interval", (n_low, n_high))
    # the learnable gain is far outside what the noise runs show
    assert np.mean(learned) > max(abs(n_low), abs(n_high))


@pytest.mark.slow  # two short PPO runs: ~90 s on 2 busy cores
def test_a_reward_that_only_knows_the_situation_pays_nothing_with_a_group_baseline(tmp_path, spm):
    """A reward that depends on the situation alone says nothing about the questions. With one
    question per situation (the original's rollouts) PPO reads it as a signal and the policy
    drifts from its reference; with 4 questions per situation each paid against its situation's
    other 3 (`ppo.samples_per_situation`, our default), every paid reward is exactly 0 and the
    policy stays at its reference: the value head starts at 0 (`value.head_init: zero`), so no
    value noise is whitened into a policy step either."""
    import zlib

    def situation_only(situations, questions):
        return np.array([zlib.crc32(s.encode()) % 2 for s in situations], np.float64)

    drift = {}
    for k in (1, 4):
        cfg = ppo_config(tmp_path / f"k{k}", spm, steps=10,
                         overrides=[f"ppo.samples_per_situation={k}", "run.save_every=10"])
        result = loops.train_ppo(cfg, reward_fn=situation_only, tensorboard=False, progress=False,
                                 export=False)
        history = result["history"]
        drift[k] = float(np.mean([h["train/kl_to_ref_per_token"] for h in history[-3:]]))
        if k > 1:  # the paid rewards are 0, so the rollouts' advantages come from values alone
            assert all(abs(h["train/mean_score_paid"]) < 1e-6 for h in history)
    print("per-token KL to the reference after 10 steps:", drift)
    assert drift[1] > 0.1 and drift[4] < 0.1 * drift[1]
