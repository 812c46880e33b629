"""PPO learns what can be learned, and only that: on every seed, a short run on a tiny random
policy paid a learnable reward raises that reward by a margin, while the run of the same seed paid
a reward that ignores the question (noise) does not raise it.

The learnable reward is tests/helpers/ppo_runs.py's token-level proxy (`lower_half_share`). Both
runs of a seed are measured with it, in its raw units, on their sampled rollouts: the mean of the
last 5 steps minus the first 5's. The design is paired (one seed, one start, trained on the reward
and on noise) and each seed must pass on its own, so one seed's luck cannot carry the others.
PPO_LEARNS_SEED_OFFSET=k runs seeds k and k+1 (issue 35's note ran ten offsets).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from helpers.ppo_runs import lower_half_share, ppo_config
from clarifyjax.training import loops

OFFSET = int(os.environ.get("PPO_LEARNS_SEED_OFFSET", "0"))
SEEDS = (OFFSET, OFFSET + 1)  # each seed must pass on its own: two keep the suite's time
STEPS = 30
# Questions sampled from the policy itself (temperature 1, no top-p: the ratio is exact), 64 per
# step, Adam 3e-4. Measured on seeds 0-11 (issue 35's note; ten offsets, ten passes): the learnable
# gains were 0.21-0.44; paid noise, the measure drifted by -0.15 to +0.01 (a random walk of the
# policy, never up by much). At the earlier settings (temperature 0.7, top-p 0.6, 16 questions, lr 1e-3) a step moved
# the policy by 0.3-1.2 nats of KL and the gains ranged from -0.20 to +0.31.
SETTINGS = ["ppo.sampling.temperature=1.0", "ppo.sampling.top_p=1.0", "ppo.batch_size=64",
            "optimizer.lr=3e-4"]
MARGIN = 0.12


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    from helpers.tiny_models import tiny_spm_folder

    return tiny_spm_folder(tmp_path_factory, vocab_size=600)


def measured_gain(out, spm, seed: int, measure, paid_noise: bool) -> float:
    """One run at `seed`, paid `measure` or uniform noise; the gain of `measure` on its rollouts."""
    rng = np.random.default_rng(seed)
    seen = []

    def reward(situations, questions):
        value = measure(situations, questions)
        seen.append(float(np.mean(value)))
        return rng.uniform(0.0, 1.0, len(questions)) if paid_noise else value

    cfg = ppo_config(out, spm, steps=STEPS,
                     overrides=[f"run.seed={seed}", f"run.save_every={STEPS}", *SETTINGS])
    loops.train_ppo(cfg, reward_fn=reward, tensorboard=False, progress=False, export=False)
    steps = np.array(seen[-STEPS:])  # the normalizer's fitting batches come first
    return float(steps[-5:].mean() - steps[:5].mean())


@pytest.mark.slow  # four short PPO runs: about three minutes on two busy cores
def test_ppo_raises_a_learnable_reward_on_every_seed_and_noise_does_not_raise_it(tmp_path, spm):
    from clarifyjax.text.tokenizer import Tokenizer

    measure = lower_half_share(Tokenizer.from_pretrained(spm))
    learned = [measured_gain(tmp_path / f"learn{s}", spm, s, measure, False) for s in SEEDS]
    drift = [measured_gain(tmp_path / f"noise{s}", spm, s, measure, True) for s in SEEDS]
    print(f"seeds {SEEDS}: learnable gains {np.round(learned, 3)}, paid noise {np.round(drift, 3)}")
    assert all(g > MARGIN for g in learned), learned
    # paid noise, the policy drifts (down by up to 0.15 on seed 4) but never learns the measure
    assert all(d < MARGIN for d in drift), drift
    assert all(g - d > MARGIN for g, d in zip(learned, drift)), (learned, drift)


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
