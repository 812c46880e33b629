"""The three algorithms behind ``ppo.algorithm`` (clarifyjax.rl.algorithms, clarifyjax.rl.ppo's
updates): RLOO's and GRPO's math against numpy written here, and tiny T5 policies trained through
`loops.train_ppo` by ppo, rloo and grpo: exactly on-policy (the recorded log-probs equal the
learner's, 0.0 in float32 on a CPU) with 1 and 2 minibatches, no value model for rloo and grpo,
and bitwise the same parameters and optimizer state after a kill and a resume."""
from __future__ import annotations

import hashlib
import shutil

import jax
import numpy as np
import pytest

from clarifyjax.config import ConfigError
from clarifyjax.rl import algorithms
from clarifyjax.training import loops
from helpers.ppo_runs import ppo_config

# --------------------------------------------------------------------------- the math


def _np_rloo(r, k):
    out = np.empty(len(r))
    for i in range(len(r)):
        g = i // k * k
        others = [r[j] for j in range(g, g + k) if j != i]
        out[i] = r[i] - sum(others) / len(others)
    return out


def _np_grpo(r, k, eps):
    out = np.empty(len(r))
    for g in range(0, len(r), k):
        x = np.asarray(r[g:g + k], np.float64)
        mean = x.sum() / k
        std = np.sqrt(((x - mean) ** 2).sum() / (k - 1))  # Bessel's, as torch.std and tunix
        out[g:g + k] = (x - mean) / (std + eps)
    return out


def test_rloo_and_grpo_advantages_match_numpy():
    rng = np.random.default_rng(0)
    r = rng.normal(size=12)
    for k in (2, 3, 4):
        got = algorithms.rloo_advantages(r, k)
        assert isinstance(got, np.ndarray) and got.dtype == np.float64  # host numpy, float64
        np.testing.assert_allclose(got, _np_rloo(r, k), rtol=1e-12, atol=1e-12)
        on_device = jax.jit(algorithms.rloo_advantages, static_argnums=1)(jax.numpy.asarray(r), k)
        np.testing.assert_allclose(np.asarray(on_device), _np_rloo(r, k), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(algorithms.grpo_advantages(r, k)),
                                   _np_grpo(r, k, 1e-4), rtol=1e-5, atol=1e-6)
    # a group of equal rewards: advantage 0, not NaN
    flat = np.asarray(algorithms.grpo_advantages(np.array([1.0, 1.0, 2.0, 0.0]), 2))
    np.testing.assert_allclose(flat, [0, 0, 1 / (np.sqrt(2) + 1e-4), -1 / (np.sqrt(2) + 1e-4)],
                               rtol=1e-5)
    for bad, match in (((np.zeros(5), 2), "multiple of group = 2"),
                       ((np.zeros(4), 1), "group must be an integer >= 2"),
                       ((np.zeros((2, 2)), 2), r"\[n\]")):
        for fn in (algorithms.rloo_advantages, algorithms.grpo_advantages):
            with pytest.raises(ValueError, match=match):
                fn(*bad)
    with pytest.raises(ValueError, match="grpo_advantages: eps"):
        algorithms.grpo_advantages(np.zeros(4), 2, eps=-1.0)


def _np_grpo_loss(logp, old, ref, adv, mask, clip, beta, aggregation):
    ratio = np.exp(logp - old)
    surrogate = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - clip, 1 + clip))
    kl = np.exp(ref - logp) - (ref - logp) - 1
    per_token = surrogate + beta * kl
    if aggregation == "token-mean":
        return (per_token * mask).sum() / mask.sum()
    rows = [(p * m).sum() / m.sum() for p, m in zip(per_token, mask) if m.sum()]
    return sum(rows) / len(rows)


def test_k3_kl_and_grpo_loss_match_numpy():
    rng = np.random.default_rng(1)
    b, t = 6, 5
    logp = rng.normal(-1.5, 0.5, (b, t)).astype(np.float32)
    old = (logp + rng.normal(0, 0.3, (b, t))).astype(np.float32)
    ref = (logp + rng.normal(0, 0.4, (b, t))).astype(np.float32)
    adv = np.repeat(rng.normal(size=(b, 1)), t, axis=1).astype(np.float32)
    mask = (np.arange(t)[None] < np.array([5, 3, 1, 4, 0, 2])[:, None]).astype(np.float32)
    r = ref.astype(np.float64) - logp
    np.testing.assert_allclose(np.asarray(algorithms.k3_kl(logp, ref)), np.exp(r) - r - 1,
                               rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(algorithms.k3_kl(logp, ref)) >= 0)
    for aggregation in algorithms.AGGREGATIONS:
        loss, metrics = algorithms.grpo_loss(logp, old, ref, adv, mask, clip=0.2, beta=0.1,
                                             aggregation=aggregation)
        want = _np_grpo_loss(*(x.astype(np.float64) for x in (logp, old, ref, adv, mask)),
                             0.2, 0.1, aggregation)
        np.testing.assert_allclose(float(loss), want, rtol=1e-5)
        assert {"policy_loss", "kl_k3", "clipfrac"} <= set(metrics)
    # beta 0: the PPO clipped loss alone, token-mean
    from clarifyjax.rl.ppo_math import policy_loss
    np.testing.assert_allclose(float(algorithms.grpo_loss(logp, old, ref, adv, mask, beta=0.0)[0]),
                               float(policy_loss(logp, old, adv, mask, 0.2)[0]), rtol=1e-6)
    with pytest.raises(ValueError, match="grpo_loss: beta"):
        algorithms.grpo_loss(logp, old, ref, adv, mask, beta=-0.1)
    with pytest.raises(ValueError, match="aggregation"):
        algorithms.grpo_loss(logp, old, ref, adv, mask, aggregation="sum")
    with pytest.raises(ValueError, match="k3_kl"):
        algorithms.k3_kl(logp, ref[:, :2])


# --------------------------------------------------------------------------- the toy bandit


@pytest.mark.parametrize("algorithm", ["rloo", "grpo"])
def test_group_updates_raise_the_bandits_reward(algorithm):
    """helpers/ppo_bandit.py's toy (one prompt, 64 samples: 16 groups of 4), 30 updates of
    `ppo.make_update` without a value model: P(target token) from ~0.1 to >= 0.8. Each update's
    advantages sum to 0 over each group (so their mean is 0). Recording leaves the state as it was
    bit for bit, and the learner then recomputes the recorded log-probs exactly."""
    import optax

    from clarifyjax.rl import ppo
    from helpers.ppo_bandit import T, TARGET, V, make_rollout, policy_logprobs

    tx = optax.adam(0.05)
    update = jax.jit(ppo.make_update(policy_logprobs, None, tx, None,
                                     ppo.PPOUpdateConfig(algorithm=algorithm), group=4))
    ref = {"logits": jax.random.normal(jax.random.key(0), (T, V)) * 0.3}
    state = ppo.init_ppo_state(ref, None, tx, None, ppo.FixedKL(0.05))
    assert state.value_params is None and state.value_opt_state is None
    rng = jax.random.key(1)
    for _ in range(30):
        rng, k_roll, k_upd = jax.random.split(rng, 3)
        rollout = make_rollout(state.policy_params, ref, {"v": jax.numpy.zeros((T,))}, k_roll)
        kept, _, (logprobs, values) = update(state, rollout, k_upd, np.True_)  # recording
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(kept),
                                                        jax.tree.leaves(state)))
        assert np.all(np.asarray(values) == 0)
        rollout = ppo.recorded(rollout, logprobs, values)
        state, metrics, _ = update(state, rollout, k_upd, np.False_)
        assert float(metrics["max_abs_logprob_diff"]) == 0.0
        assert abs(float(metrics["advantages_raw_mean"])) < 1e-5
    p_ref = float(jax.nn.softmax(ref["logits"][0])[TARGET])
    p_target = float(jax.nn.softmax(state.policy_params["logits"][0])[TARGET])
    assert p_ref < 0.2 and p_target >= 0.8, (p_ref, p_target)
    with pytest.raises(ValueError, match="group must be an integer >= 2"):
        ppo.make_update(policy_logprobs, None, tx, None, ppo.PPOUpdateConfig(algorithm=algorithm))


# --------------------------------------------------------------------------- tiny T5 runs

STEPS = 2
TINY = ["policy.tiny.d_model=16", "policy.tiny.d_ff=32", "policy.tiny.num_heads=2",
        "policy.tiny.num_layers=1", "ppo.batch_size=8", "ppo.samples_per_situation=4",
        "ppo.epochs=2", "ppo.sampling.max_new_tokens=4", "normalizer.fit=false",
        "normalizer.fit_batches=8", "run.async_checkpointing=false", "run.save_every=1",
        f"run.max_to_keep={STEPS}"]
# Each run traces and compiles its own update (seconds each on two busy cores), so the runs are
# few: one per algorithm, the minibatch settings shared among them, and two resumed runs.
RUNS = (("ppo", 2), ("rloo", 2), ("grpo", 1))


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    """(the tiny tokenizer's folder, a training file of 16 situations: tokenizing the 5431 of
    train.tsv would cost each run seconds)."""
    from helpers.env import shared_data
    from helpers.tiny_models import tiny_spm_folder

    folder = tiny_spm_folder(tmp_path_factory, vocab_size=600)
    lines = shared_data("delta-clarify/train.tsv").read_text().splitlines()
    train = tmp_path_factory.mktemp("situations") / "train.tsv"
    train.write_text("\n".join(lines[:17]) + "\n")
    return folder, train


def _short_questions(situations, questions):
    """Pays short questions, so that the policy moves."""
    return np.array([1.0 / (1 + len(q)) for q in questions])


def _train(out, spm, algorithm: str, minibatches: int):
    folder, train = spm
    cfg = ppo_config(out, folder, steps=STEPS, overrides=[
        f"ppo.algorithm={algorithm}", f"ppo.minibatches={minibatches}",
        f"data.train_path={train}", *TINY])
    return loops.train_ppo(cfg, reward_fn=_short_questions, tensorboard=False, progress=False,
                           export=False)


def _digest(state) -> str:
    """sha256 of every leaf of the PPO state (parameters, optimizer states, KL, step), by path."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        h.update(jax.tree_util.keystr(path).encode())
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, spm):
    """algorithm -> (run folder, result) of an uninterrupted run of STEPS steps (a checkpoint
    after each), with the minibatches of `RUNS`."""
    root = tmp_path_factory.mktemp("algorithms")
    return {a: (root / a, _train(root / a, spm, a, m)) for a, m in RUNS}


@pytest.mark.slow  # the module's runs: ~45 s of CPU, five tiny T5 PPO/RLOO/GRPO runs
@pytest.mark.parametrize("algorithm", ["ppo", "rloo", "grpo"])
def test_recorded_logprobs_are_the_learners_exactly(runs, algorithm):
    """Before the first update of each batch, the learner's recomputed log-probs equal the ones
    the rollout recorded, bit for bit (float32, CPU): with 2 minibatches the rollout is scored in
    2 chunks of the learner's shape (a forward pass over the whole batch differs by ~1e-6)."""
    history = runs[algorithm][1]["history"]
    assert len(history) == STEPS
    assert [h["train/max_abs_logprob_diff"] for h in history] == [0.0] * STEPS
    assert history[-1]["train/kl_to_ref"] != 0.0  # the policy did move


@pytest.mark.slow  # the module's runs: ~45 s of CPU, five tiny T5 PPO/RLOO/GRPO runs
@pytest.mark.parametrize("algorithm", ["rloo", "grpo"])
def test_group_algorithms_have_no_value_model(runs, algorithm):
    state = runs[algorithm][1]["state"]
    assert state.value_params is None and state.value_opt_state is None
    row = runs[algorithm][1]["history"][-1]
    assert "train/value_loss" not in row and "train/policy_loss" in row
    assert ("train/kl_k3" in row) == (algorithm == "grpo")


@pytest.mark.slow  # the module's runs: ~45 s of CPU, five tiny T5 PPO/RLOO/GRPO runs
@pytest.mark.parametrize("algorithm", ["ppo", "rloo"])
def test_a_run_killed_and_resumed_is_bitwise_the_uninterrupted_one(runs, spm, tmp_path,
                                                                   algorithm):
    """The uninterrupted run's folder as a run killed right after checkpoint 1 left it (its
    checkpoint 2 never written), resumed by the same config to STEPS: the parameters, optimizer
    states, KL controller and step are bitwise those of the uninterrupted run, and the resumed
    step is exactly on-policy too."""
    folder, uninterrupted = runs[algorithm]
    shutil.copytree(folder, tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / str(STEPS))
    minibatches = dict(RUNS)[algorithm]
    resumed = _train(tmp_path / "run", spm, algorithm, minibatches)
    assert resumed["step"] == STEPS and [h["step"] for h in resumed["history"]] == [STEPS]
    assert resumed["history"][0]["train/max_abs_logprob_diff"] == 0.0
    assert _digest(resumed["state"]) == _digest(uninterrupted["state"])


def test_group_algorithms_need_two_samples_and_no_value_keys(tmp_path):
    spm = tmp_path / "unused"
    with pytest.raises(ConfigError, match=r"ppo.samples_per_situation >= 2"):
        ppo_config(tmp_path, spm, overrides=["ppo.algorithm=grpo", "ppo.samples_per_situation=1"])
    with pytest.raises(ConfigError, match=r"value.head_init .* has no value model"):
        ppo_config(tmp_path, spm, overrides=["ppo.algorithm=rloo", "value.head_init=normal"])
    with pytest.raises(ConfigError, match="ppo.algorithm"):
        ppo_config(tmp_path, spm, overrides=["ppo.algorithm=reinforce"])
