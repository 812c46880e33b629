"""Issue 38: each algorithm behind ``ppo.algorithm`` (ppo, rloo, grpo) raises a learnable reward
on a tiny decoder-only policy (a tiny Llama: d_model 32, 2 layers, 259 byte-level tokens) beyond
its seeds' spread, and a reward that ignores the question (uniform noise) does not raise it.

The learnable reward is the share of ASCII characters in the question (bytes below 128 decode to
themselves, the others mostly to U+FFFD): about 0.5 for the random policy. Each run, paid it or
paid noise, is measured with it: 64 questions sampled before and after its 6 updates with the
same keys (common random numbers). The runs use the pieces `loops.train_ppo` runs
(`RolloutSampler`, `PPOProgram`), built once per algorithm, so the seeds (4 policies of their own
weights, sampling and update keys) reuse the compiled programs. RL_LEARNS_SEED_OFFSET=k runs
seeds k to k + 3."""
from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from clarifyjax.config import load_config
from clarifyjax.core import sharding
from clarifyjax.models.hf import load_causal_lm
from clarifyjax.models.state import copy_params, split_model
from clarifyjax.reward.jsd import RewardNormalizer
from clarifyjax.rl.rollout import RolloutSampler
from clarifyjax.training import builders, programs
from helpers.causal_lm_builders import tiny_policy_folder
from helpers.env import REPO_ROOT, shared_data

OFFSET = int(os.environ.get("RL_LEARNS_SEED_OFFSET", "0"))
SEEDS = tuple(range(OFFSET, OFFSET + 4))
# 6 updates of 32 questions (8 situations x 4), 4 epochs each at Adam 1.5e-2, KL coefficient
# 0.02 (0.15, the preset's, held the gains at 0.00-0.13), sampled at temperature 1 without top-p.
# Seeds 0-11 (offsets 0, 4, 8): learnable gains 0.15-0.34, mean / sd 3.0 (grpo, offset 8) to 24;
# paid noise -0.07 to +0.09, every seed below every learnt gain. With 3 seeds (and k = 2.5) grpo
# on seeds 9-11 fell to 2.4, hence 4.
STEPS = 6
# k: the mean gain over the 4 seeds must exceed k times their standard deviation (ddof 1). With
# k = 1.6 that is t = mean / (sd / sqrt(4)) > 3.2, above Student's t(3) 97.5% point 3.18: the
# 95% interval of the mean gain over the seeds excludes 0.
K = 1.6
EVALS = 2  # batches of 32 questions measured before and after a run
SITUATIONS = ["lying to my friend", "taking a day off", "eating the last cookie",
              "skipping class", "telling my boss", "keeping a secret", "borrowing a car",
              "ignoring a call"]
GROUP = 4  # questions per situation: 8 situations x 4 = 32 rows a step
BEFORE: dict[int, float] = {}  # seed -> `Runner.measure` of its initial policy


def ascii_share(situations, questions):
    """The learnable reward: the share of the question's characters below 128 (0 if empty)."""
    return np.array([sum(ord(c) < 128 for c in q) / len(q) if q else 0.0 for q in questions])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """seed -> a tiny Llama policy folder of that seed's weights (one tokenizer)."""
    shared_data("delta-clarify/train.tsv")  # the tokenizer's corpus
    out, tokenizer = {}, None
    for seed in SEEDS:
        out[seed] = tmp_path_factory.mktemp(f"llama{seed}")
        tokenizer = tiny_policy_folder(out[seed], "llama", seed=seed, tokenizer=tokenizer)
    return out


class Runner:
    """The sampler and the update of one algorithm, built once; `run` trains one seed."""

    def __init__(self, folder, algorithm: str, out):
        for name, rows in (("train", SITUATIONS), ("dev", ["helping a stranger"])):
            (out / f"{name}.tsv").write_text("situation\n" + "\n".join(rows) + "\n")
        self.cfg = cfg = load_config(REPO_ROOT / "clarifyjax/presets/ppo_tiny.yaml", [
            f"run.output_dir={out}", f"run.steps={STEPS}", f"policy.init={folder}",
            "policy.tokenizer=null", "policy.prompt_format=plain",
            "policy.prompt_template=Ask about: {situation}", "policy.max_input_length=64",
            f"data.train_path={out / 'train.tsv'}", f"data.dev_path={out / 'dev.tsv'}",
            f"ppo.algorithm={algorithm}", f"ppo.batch_size={GROUP * len(SITUATIONS)}",
            f"ppo.samples_per_situation={GROUP}", "ppo.minibatches=1", "ppo.epochs=4",
            "ppo.sampling.temperature=1.0", "ppo.sampling.top_p=1.0",
            "ppo.sampling.max_new_tokens=6", "optimizer.lr=1.5e-2", "ppo.kl_coef=0.02", "normalizer.fit=false",
            "normalizer.fit_batches=8"])
        self.mesh = sharding.make_mesh(cfg.mesh)
        rules = sharding.RULES[cfg.mesh.rules]
        family = builders.check_policy_family(cfg)
        self.tokenizer = builders.policy_tokenizer(cfg, family)
        m = builders.build_ppo_models(cfg, self.mesh, rules, self.tokenizer, family)
        self.models, self.reward = m, None
        self.program = programs.PPOProgram.build(cfg, self.mesh, m.graphdef, m.params,
                                                 m.value_graphdef, m.value_params)
        h = cfg.ppo
        self.sampler = RolloutSampler(
            self.tokenizer, m.graphdef, m.value_graphdef, lambda s, q: self.reward(s, q),
            self.mesh, sampling=h.sampling, logprob_temperature=h.logprob_temperature,
            stop_token_ids=self.tokenizer.stop_ids)
        prompts = [self.tokenizer.prompt(s) for s in SITUATIONS]
        ids, mask = self.tokenizer.encode_batch(prompts, cfg.policy.max_input_length)
        self.batch = {"input_ids": np.repeat(ids, GROUP, axis=0),
                      "input_mask": np.repeat(mask, GROUP, axis=0)}
        self.situations = [s for s in SITUATIONS for _ in range(GROUP)]

    def measure(self, params, seed: int) -> float:
        """The mean `ascii_share` of EVALS batches of questions sampled from `params` with the
        seed's own keys: before and after a run, the same keys (common random numbers)."""
        keys = jax.random.split(jax.random.key(10_000 + seed), EVALS)
        return float(np.mean([ascii_share(None, self.sampler.questions(params, self.batch, k)[3])
                              for k in keys]))

    def run(self, folder, seed: int, paid_noise: bool) -> tuple[float, list[float]]:
        """(gain of `measure`, max |recorded - learner's log-prob| per step) of STEPS updates
        from `folder`'s weights, paid `ascii_share` or uniform noise."""
        noise = np.random.default_rng(seed)

        def reward(situations, questions):
            value = ascii_share(situations, questions)
            return noise.uniform(0.0, 1.0, len(questions)) if paid_noise else value

        self.reward = reward
        model = load_causal_lm(folder)[1]
        params = split_model(model)[1]
        value = None
        if self.models.value_graphdef is not None:
            value = split_model(builders.build_value(self.cfg, model))[1]
        state = jax.device_put(self.program.initial(params, value), self.program.state_shardings)
        ref = copy_params(params)
        h, diffs = self.cfg.ppo, []
        rng = jax.random.key(seed)
        for _ in range(STEPS):
            rng, k_sample, k_update = jax.random.split(rng, 3)
            rollout = self.sampler.rollout(
                state["ppo"], ref, self.batch, self.situations, k_sample,
                RewardNormalizer(1.0, 0.0), GROUP if h.algorithm == "ppo" else 1)[0]
            state["ppo"], rollout = self.program.record(state["ppo"], rollout, k_update)
            state["ppo"], metrics = self.program(state["ppo"], rollout, k_update)
            diffs.append(float(metrics["max_abs_logprob_diff"]))
        if seed not in BEFORE:  # the same for every algorithm and both rewards of a seed
            BEFORE[seed] = self.measure(params, seed)
        return self.measure(state["ppo"].policy_params, seed) - BEFORE[seed], diffs


@pytest.mark.slow  # 24 tiny runs, 3 compiled updates: ~80 s on two busy cores
@pytest.mark.parametrize("algorithm", ["ppo", "rloo", "grpo"])
def test_each_algorithm_raises_a_learnable_reward_beyond_its_seeds_spread(
        folders, tmp_path, algorithm):
    runner = Runner(folders[SEEDS[0]], algorithm, tmp_path)
    learned, noise = [], []
    for seed in SEEDS:
        gain, diffs = runner.run(folders[seed], seed, paid_noise=False)
        learned.append(gain)
        noise.append(runner.run(folders[seed], seed, paid_noise=True)[0])
        assert diffs == [0.0] * STEPS, diffs  # exactly on-policy
    g, n = np.array(learned), np.array(noise)
    print(f"{algorithm} seeds {SEEDS}: learnable gains {np.round(g, 3)} (mean {g.mean():.3f}, "
          f"sd {g.std(ddof=1):.3f}), paid noise {np.round(n, 3)} (mean {n.mean():.3f}, "
          f"sd {n.std(ddof=1):.3f})")
    assert g.min() > 0, learned
    assert g.mean() > K * g.std(ddof=1), learned
    # paid noise, the measure does not rise beyond its seeds' spread, nor reach the learnt gains
    assert n.mean() < K * n.std(ddof=1), noise
    assert n.max() < g.min(), (learned, noise)
