"""The five differences between the original ClarifyDelphi and the `_original` preset that
docs/fidelity.md once missed (issue 24), each checked against both resolved presets, so that a
preset changed without its row (tests/clarifyjax/test_fidelity.py checks the rows) fails here too:

* reward whitening at padding: the original's computation (utils/utils.py `whiten`, main.py's GAE
  loop, transcribed in numpy) changes a question's advantages with the padding after it; ours does
  not (the table's fixed row runs our whole update), and without padding the two agree;
* precision: each model's ``precision`` reaches its compiled program (the lowered text's
  `dot_general` precision): the policy's T5, its decoding step and the value model, and the
  answerer, fusion model, judge and NLI classifier as `load_pipeline` loads them;
* evaluation: after which updates it runs, greedy or sampled questions, the dev situations and
  the per-question NLL (the original's "perplexity");
* the text between the models: the questions and the situations that the reward models read,
  with transformers' own `clean_up_tokenization` as the reference;
* the value head's initialisation.
"""
from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clarifyjax import data
from clarifyjax.config import load_config
from clarifyjax.core import sharding
from clarifyjax.rl import ppo
from clarifyjax.text import formats
from clarifyjax.training import builders
from clarifyjax.training import loops
from helpers.env import REPO_ROOT, require
from helpers.tiny_models import tiny_nli_folder, tiny_spm_folder, tiny_t5_folder

PRESETS = {"original": REPO_ROOT / "clarifyjax" / "presets" / "ppo_t5_large_original.yaml",
           "ours": REPO_ROOT / "clarifyjax" / "presets" / "ppo_t5_large.yaml"}


@pytest.fixture(scope="module")
def presets():
    return {name: load_config(path) for name, path in PRESETS.items()}


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    from clarifyjax.text.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(tiny_spm_folder(tmp_path_factory))


# --------------------------------------------------------------------------- reward whitening


def _original_advantages(rewards, values, masks, divisor="sqrt_std", gamma=1.0, lam=0.95):
    """main.py:273-284 with utils/utils.py:20-27, 56-61 (reduce_mean, reduce_std, whiten), as
    numpy: reward whitening without a shift, then GAE over every column, padding included.
    `divisor` "std" is the whitening divisor fixed, as in both presets."""
    def reduce_mean(v, m):
        return (v * m).sum() / m.sum()

    std = np.sqrt(reduce_mean(rewards ** 2, masks) - reduce_mean(rewards, masks) ** 2)
    mean = reduce_mean(rewards, masks)
    scale = np.sqrt(std + 1e-8) if divisor == "sqrt_std" else np.sqrt(std ** 2 + 1e-8)
    rewards = (rewards - mean) / scale + mean  # shift_mean=False: the mean added back everywhere
    last, reversed_advantages = 0.0, []
    for t in reversed(range(rewards.shape[1])):
        next_values = values[:, t + 1] if t < rewards.shape[1] - 1 else 0.0
        last = rewards[:, t] + gamma * next_values - values[:, t] + gamma * lam * last
        reversed_advantages.append(last)
    return np.stack(reversed_advantages[::-1], axis=1)


def _our_advantages(rewards, values, masks):
    whitened = ppo.masked_whiten(jnp.asarray(rewards), masks, shift_mean=False)
    return np.asarray(ppo.gae(whitened, values, masks)[0])


def test_original_reward_whitening_depends_on_padding_ours_does_not():
    rng = np.random.default_rng(0)
    lengths = np.array([6, 2, 4, 5])
    masks = (np.arange(6)[None] < lengths[:, None]).astype(np.float64)
    kl = rng.normal(0, 0.2, (4, 6))
    scores = np.array([1.5, -0.4, 0.8, 2.0])
    rewards = (-0.15 * kl + scores[:, None] * (np.arange(6)[None] == lengths[:, None] - 1)) * masks
    values = rng.normal(0, 0.5, (4, 6)) * masks  # main.py:168: values *= mask

    def pad(x, extra):
        return np.pad(x, ((0, 0), (0, extra)))

    real = masks > 0
    original = [_original_advantages(pad(rewards, k), pad(values, k), pad(masks, k))[:, :6][real]
                for k in (0, 4)]
    ours = [_our_advantages(pad(rewards, k), pad(values, k), pad(masks, k))[:, :6][real]
            for k in (0, 4)]
    assert np.abs(original[0] - original[1]).max() > 1e-2  # 4 more padding columns move them
    np.testing.assert_allclose(ours[0], ours[1], rtol=1e-6, atol=1e-6)
    # without padding (every question as long as the batch's longest), the divisor fixed, the
    # original's advantages are ours
    full = np.ones_like(masks)
    np.testing.assert_allclose(_our_advantages(rewards, values, full),
                               _original_advantages(rewards, values, full, divisor="std"),
                               rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- precision

_PRECISION = {"original": "HIGHEST", "ours": "DEFAULT"}  # the table's row, as lowered


def _precisions(fn, *args) -> set[str]:
    text = jax.jit(fn).lower(*args).as_text()
    found = re.findall(r"precision = \[(\w+), (\w+)\]", text)
    assert found, "no dot_general in the lowered program"
    return {p for pair in found for p in pair}


def _t5_precisions(model) -> set[str]:
    graphdef, state = nnx.split(model)
    ids = jnp.ones((2, 5), jnp.int32)

    def forward_and_step(state, ids):
        t5 = nnx.merge(graphdef, state)
        logits = t5(ids, ids, ids)
        cache = t5.init_cache(t5.encode(ids, ids), ids, 4)
        return logits, t5.decode_step(ids[:, 0], cache, 0)[0]

    return _precisions(forward_and_step, state, ids)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {"t5": tiny_t5_folder(tmp_path_factory, seed=21),
            "nli": tiny_nli_folder(tmp_path_factory, seed=14)}


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_models_precision_reaches_its_lowered_program(presets, folders, name):
    from clarifyjax.models.encoder import SequenceClassifier
    from clarifyjax.reward.pipeline import load_pipeline

    cfg, want = presets[name], {_PRECISION[name]}
    # the policy as `build_ppo_models` builds it, from a tiny folder; the value model on its T5
    policy_cfg = dataclasses.replace(cfg.policy, init=str(folders["t5"]), tokenizer=None)
    _, policy = builders.build_t5(policy_cfg, seed=0, mesh=None, rules=None)
    assert _t5_precisions(policy) == want
    value = builders.build_value(cfg, policy)
    graphdef, state = nnx.split(value)
    ids = jnp.ones((2, 5), jnp.int32)
    assert _precisions(lambda s, i: nnx.merge(graphdef, s)(i, i, i), state, ids) == want
    # the reward models, loaded from the preset's rewards: section with tiny folders
    r = cfg.rewards

    def tiny(m, folder):
        return dataclasses.replace(m, init=str(folder), tokenizer=None, max_input_length=64)

    rewards = dataclasses.replace(
        r, answerer=tiny(r.answerer, folders["t5"]), fusion=tiny(r.fusion, folders["t5"]),
        judge=dataclasses.replace(r.judge, model=tiny(r.judge.model, folders["t5"])),
        nli=tiny(r.nli, folders["nli"]))
    pipeline = load_pipeline(rewards)
    for t5 in (pipeline.answerer.model, pipeline.fusion.model, pipeline.judge.seq2seq.model):
        assert _t5_precisions(t5) == want
    classifier = SequenceClassifier(pipeline.nli.config, nnx.Rngs(0))  # the NLI filter's config
    graphdef, state = nnx.split(classifier)
    assert _precisions(lambda s, i: nnx.merge(graphdef, s)(i, i, i), state, ids) == want


# --------------------------------------------------------------------------- evaluation


class _StubSampler:
    """What `evaluate_ppo` reads of a `RolloutSampler`: every response token has reference NLL
    0.5, and row i of a batch has 1 + i % 4 tokens."""

    def __init__(self):
        self.mesh = sharding.make_mesh(sharding.MeshConfig(data=1),
                                           devices=jax.devices()[:1])
        self.greedy = []

    def situations(self, batch, texts):
        return [texts[j] for j in batch["index"]]

    def questions(self, params, batch, key, *, greedy=False):
        self.greedy.append(greedy)
        n = len(batch["index"])
        mask = (np.arange(4)[None] < 1 + np.arange(n)[:, None] % 4).astype(np.int32)
        gen = SimpleNamespace(tokens=np.ones((n, 4), np.int32), mask=mask)
        return batch["input_ids"], batch["input_mask"], gen, [f"q{i % 3}?" for i in range(n)]

    def rewards(self, situations, questions, key, normalizer=None):
        return {"raw_reward": np.linspace(0.0, 1.0, len(questions))}

    def ref_nll(self, ref_params, ids, mask, tokens, token_mask):
        token_mask = np.asarray(token_mask)
        return 0.5 * token_mask.sum(), float(token_mask.sum())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_evaluation_runs_as_each_preset_says(presets, spm, name):
    from clarifyjax.reward.jsd import RewardNormalizer
    from clarifyjax.training.ppo_eval import evaluate_ppo

    cfg = presets[name]
    due = [s for s in range(2003) if loops._eval_due(s, cfg)]
    assert due == {"original": [1, 1001, 2001], "ours": [0, 1000, 2000]}[name]
    assert loops._eval_due(cfg.run.steps, cfg) == (name == "ours")  # 6000: not 1 + k * 1000
    _, dev = data.load_ppo_situations(cfg.data)
    assert len(dev) == 500  # all of dev.tsv's unique situations, in both
    assert cfg.data.dev_situations == {"original": None, "ours": 500}[name]

    sampler = _StubSampler()
    dataset = data.situation_dataset(dev[:5], spm, 32)
    metrics = evaluate_ppo(sampler, None, None, dataset, batch_size=4,
                           normalizer=RewardNormalizer(gain=1.0, bias=0.0),
                           key=jax.random.key(0), samples=cfg.ppo.eval_samples)
    draws = max(cfg.ppo.eval_samples, 1)
    assert sampler.greedy == [name == "ours"] * 2 * draws  # the original samples as in training
    tokens = np.r_[1 + np.arange(4) % 4, 1]  # the five kept rows: 4 of batch 1, 1 of batch 2
    assert metrics["eval/ref_nll"] == pytest.approx(0.5)
    assert metrics["eval/ref_nll_per_question"] == pytest.approx(0.5 * tokens.mean())


# --------------------------------------------------------------------------- text between models


@pytest.mark.reference
def test_clean_up_tokenization_is_transformers():
    transformers = require("transformers")
    theirs = transformers.PreTrainedTokenizerBase.clean_up_tokenization
    for text in ("Why ?", "a , b . c ! d ' e", "I can n't , it 's", "you 're , I 've , I 'm",
                 "Is it ok?", " ?? .. ", "don 't", ""):
        assert formats.clean_up_tokenization(text) == theirs(None, text), text


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_reward_models_read_the_text_each_preset_says(presets, spm, name):
    cfg = presets[name]
    models = builders.PPOModels(*[None] * len(builders.PPOModels._fields))
    sampler = loops._sampler(cfg, spm, models, lambda situations, questions: None, None)
    question = "why would you do that ?"
    ids, _ = spm.encode_batch([question], 32)
    assert spm.decode_batch(ids) == [question]  # the tokenizer keeps the space before "?"
    cleaned = {"original": "why would you do that?", "ours": question}[name]
    assert sampler.decode(ids) == [cleaned]

    situation = "helping a friend , even if it costs me"
    dataset = data.situation_dataset([situation], spm, 32)
    batch = next(data.eval_batches(dataset, 1))
    read = {"original": "helping a friend, even if it costs me", "ours": situation}[name]
    assert sampler.situations(batch, dataset.texts["situation"]) == [read]


# --------------------------------------------------------------------------- the value head


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_value_head_starts_as_each_preset_says(presets, name):
    from clarifyjax.models.t5 import T5, T5Config

    config = T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
    value = builders.build_value(presets[name], T5(config, rngs=nnx.Rngs(0)))
    kernel = np.asarray(value.head_kernel[...])
    bias = np.asarray(value.head_bias[...])
    if name == "original":  # nn.Linear(d_model, 1)'s default: weight and bias in +-1/sqrt(d)
        bound = 16 ** -0.5
        assert np.all(np.abs(kernel) <= bound) and np.std(kernel) > 0.3 * bound
        assert 0 < abs(float(bias[0])) <= bound
    else:  # ours: V = 0 until the head learns
        assert not kernel.any() and not bias.any()


# --------------------------------------------------------------------------- a measured figure


def test_training_situations_without_a_period_as_the_table_says(presets):
    train_situations, _ = data.load_ppo_situations(presets["original"].data)
    missing = sum(not s.endswith(".") for s in train_situations)
    assert (missing, len(train_situations)) == (2298, 5431)
    doc = (REPO_ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8")
    assert doc.count("2,298 of the 5,431") == 2 and "2,313" not in doc
