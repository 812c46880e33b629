"""Issue 38, part B: a decoder-only question policy (a tiny Llama and a tiny Qwen3, d_model 32, 2
layers, vocabulary 259) in PPO. Its teacher-forced log-probs are `decoding.score`'s, its value
model is causal and aligned with them, the rollout's recorded log-probs and values equal the
learner's recomputed ones exactly (float32, CPU), and `clarifyjax train`'s loop runs it, resumes
after a stop to the same parameters bit for bit, and exports a folder that loads again."""
from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

from clarifyjax import decoding
from clarifyjax.config import ConfigError, load_config
from clarifyjax.models.hf import load_causal_lm
from clarifyjax.models.state import split_model
from clarifyjax.rl import policy
from clarifyjax.rl.prompts import CausalPolicyText
from clarifyjax.rl.rollout import RolloutSampler
from clarifyjax.rl.value import CausalValueModel
from clarifyjax.training import builders, loops, programs
from helpers.causal_lm_builders import left_padded, right_padded, tiny_policy_folder
from helpers.env import REPO_ROOT, shared_data

SITUATIONS = ["lying to my friend", "taking a day off", "eating the last cookie", "skipping class",
              "telling my boss", "keeping a secret", "borrowing a car", "ignoring a call",
              "moving out early", "selling my bike", "breaking a promise", "helping a stranger"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny Llama and a tiny Qwen3 policy folder (one tokenizer)."""
    shared_data("delta-clarify/train.tsv")  # the tokenizer's corpus
    llama = tmp_path_factory.mktemp("llama")
    tokenizer = tiny_policy_folder(llama, "llama", seed=1)
    qwen3 = tmp_path_factory.mktemp("qwen3")
    tiny_policy_folder(qwen3, "qwen3", seed=2, tokenizer=tokenizer)
    return {"llama": llama, "qwen3": qwen3}


@pytest.fixture(scope="module")
def situations(tmp_path_factory):
    """(train, dev) files of short situations (a column 'situation')."""
    root = tmp_path_factory.mktemp("situations")
    for name, rows in (("train", SITUATIONS[:8]), ("dev", SITUATIONS[8:])):
        (root / f"{name}.tsv").write_text("situation\n" + "\n".join(rows) + "\n")
    return root / "train.tsv", root / "dev.tsv"


def _batch(rng, vocab: int):
    """Prompts of mixed lengths (left-padded) and right-padded responses [6, 5], int32."""
    prompts = [rng.integers(3, vocab, n).tolist() for n in (3, 7, 1, 5, 6, 2)]
    responses = [rng.integers(3, vocab, n).tolist() for n in (5, 1, 3, 4, 2, 5)]
    return tuple(np.asarray(a, np.int32) for a in (*left_padded(prompts),
                                                   *right_padded(responses)))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_logprobs_are_decoding_score_and_values_are_causal(folders, family):
    _, model = load_causal_lm(folders[family])
    vocab = model.config.vocab_size
    q, qm, r, rm = _batch(np.random.default_rng(0), vocab)
    changed = r.copy()
    changed[:, 2] = (changed[:, 2] + 1) % vocab  # response token 2 of every row
    value = CausalValueModel.from_lm(model, seed=3, head_init="normal")

    @jax.jit
    def forward(r_changed):
        logprobs, entropy = policy.response_logprobs(model, q, qm, r, rm, with_entropy=True)
        return (logprobs, entropy, policy.response_values(value, q, qm, r, rm),
                policy.response_values(value, q, qm, r_changed, rm))

    got, entropy, values, after = (np.asarray(x) for x in forward(changed))
    np.testing.assert_allclose(got, np.asarray(decoding.score(model, q, qm, r, rm)), atol=2e-5)
    assert np.all(got[rm == 0] == 0) and np.all(entropy[rm == 0] == 0)
    assert np.all(entropy[rm == 1] > 0)
    # the value at response position j reads the prompt and the response tokens before j only
    np.testing.assert_allclose(after[:, :3], values[:, :3], atol=1e-5)
    assert np.all(values[rm == 0] == 0) and np.max(np.abs(after[:, 3:] - values[:, 3:])) > 1e-3
    assert len(set(values[:, 0].tolist())) > 1  # the head reads each row's own prompt


def _config(folder, situations, out, steps, overrides=()):
    train, dev = situations
    return load_config(REPO_ROOT / "clarifyjax/presets/ppo_tiny.yaml", [
        f"run.output_dir={out}", f"run.steps={steps}", "run.log_every=1", "run.eval_every=0",
        "run.sample_every=0", "run.save_every=1", f"policy.init={folder}", "policy.tokenizer=null",
        "policy.prompt_format=chat", "policy.prompt_template=Ask about: {situation}",
        "policy.max_input_length=64", f"data.train_path={train}", f"data.dev_path={dev}",
        "data.dev_situations=4", "data.eval_batch_size=4", "data.length_buckets=[64]",
        "ppo.batch_size=8", "ppo.minibatches=2", "ppo.samples_per_situation=2",
        "ppo.sampling.max_new_tokens=6", "optimizer.lr=1e-3", "normalizer.fit=false", "normalizer.fit_batches=8",
        "normalizer.gain=1.0", "normalizer.bias=0.0", *overrides])


def _reward(situations, questions):
    """A stub reward: the number of distinct characters of the question, over 10."""
    return np.array([len(set(q)) / 10 for q in questions], np.float64)


@pytest.mark.slow
def test_train_is_on_policy_resumes_exactly_and_exports(folders, situations, tmp_path,
                                                          monkeypatch):
    """Three steps, then the same run resumed from its checkpoint of step 2 (as after a stop):
    the same parameters bit for bit, and every step exactly on-policy."""
    seen, recorded = [], []
    sample, record = RolloutSampler.rollout, programs.PPOProgram.record

    def spy(self, state, *args, **kwargs):
        out = sample(self, state, *args, **kwargs)
        seen.append(out[1])  # the questions
        return out

    def spy_record(self, state, rollout, key):
        out = record(self, state, rollout, key)
        recorded.append((rollout, out[1]))  # (sampled, recorded by the learner's program)
        return out

    monkeypatch.setattr(RolloutSampler, "rollout", spy)
    monkeypatch.setattr(programs.PPOProgram, "record", spy_record)
    folder = folders["llama"]
    evaluate = ["run.eval_every=3"]  # before the first step and after the last
    whole = loops.train_ppo(_config(folder, situations, tmp_path / "whole", 3, evaluate),
                            reward_fn=_reward, tensorboard=False, progress=False)
    shutil.copytree(tmp_path / "whole", tmp_path / "stopped", ignore=shutil.ignore_patterns("final"))
    shutil.rmtree(tmp_path / "stopped" / "checkpoints" / "3")  # stopped after step 2
    resumed = loops.train_ppo(_config(folder, situations, tmp_path / "stopped", 3, evaluate),
                              reward_fn=_reward, tensorboard=False, progress=False, export=False)
    assert (whole["step"], resumed["step"], len(resumed["history"])) == (3, 3, 1)
    # the dev evaluation of a decoder policy: its questions, and the reference's NLL of them
    assert whole["eval"] == resumed["eval"] and len(whole["eval_rows"]["questions"]) == 4
    assert whole["first_eval"]["eval/ref_nll"] > 0 and whole["eval"]["eval/ref_nll"] > 0
    for a, b in zip(jax.tree.leaves(whole["state"].policy_params),
                    jax.tree.leaves(resumed["state"].policy_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    start = split_model(load_causal_lm(folder)[1])[1]
    assert any(np.any(np.asarray(a) != np.asarray(b)) for a, b in zip(
        jax.tree.leaves(start), jax.tree.leaves(whole["state"].policy_params)))
    # exactly on-policy at every step of both runs: the log-probs the rollout recorded are those
    # the update's first (permuted) minibatch recomputes inside its gradient program, bit for bit
    diffs = [h["train/max_abs_logprob_diff"] for h in whole["history"] + resumed["history"]]
    assert diffs == [0.0] * 4, diffs
    # every row recorded (both minibatches) at the sampling policy: the forward pass alone agrees
    for sampled, learner in recorded:
        for field in ("logprobs", "values"):
            np.testing.assert_allclose(np.asarray(getattr(learner, field)),
                                       np.asarray(getattr(sampled, field)), atol=1e-5)
    assert len(seen) == 4 and all(len(questions) == 8 for questions in seen)
    # the export loads again as the trained policy, and its prompt is the chat template's
    exported = split_model(load_causal_lm(whole["final"])[1])[1]
    for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(whole["state"].policy_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    text = CausalPolicyText(whole["final"], "chat", "Ask about: {situation}")
    assert text.prompt("lying") == "<s>[INST] Ask about: lying [/INST]"


def test_the_policy_family_decides_the_prompt_settings(folders, situations, tmp_path):
    cfg = _config(folders["llama"], situations, tmp_path, 1, ["policy.prompt_format=null",
                                                              "policy.prompt_template=null"])
    with pytest.raises(ConfigError, match="policy.prompt_format: .* is a decoder-only model"):
        builders.check_policy_family(cfg)
    with pytest.raises(ConfigError, match="policy.prompt_template"):
        _config(folders["llama"], situations, tmp_path, 1, ["policy.prompt_template=no slot"])


def test_plain_prompts_and_questions_that_end_at_the_stop_ids(folders):
    text = CausalPolicyText(folders["qwen3"], "plain", "S: {situation}\nQ:", eos_ids=(2, 7))
    assert text.prompt("lying") == "S: lying\nQ:" and text.stop_ids == (2, 7)
    ids, mask = text.encode_batch([text.prompt("lying"), text.prompt("a")], 64)
    assert ids[0, 0] == 1 and mask.sum(axis=1).tolist() == [len(text.tokenizer.encode(
        "S: lying\nQ:")), len(text.tokenizer.encode("S: a\nQ:"))]  # BOS, right-padded
    with pytest.raises(ValueError, match="policy.max_input_length = 4"):
        text.encode_batch([text.prompt("lying")], 4)
    hello = text.tokenizer.encode("Why?", raw_bos=False)
    rows = np.array([hello + [7, 60, 61], hello + [2, 2, 2], hello + [61, 62, 63]])
    assert text.decode_batch(rows) == ["Why?", "Why?", text.tokenizer.decode(rows[2]).strip()]
    # a random policy samples any byte: a NUL reaches the reward models as U+FFFD (they refuse NUL)
    nul = text.tokenizer._tok.convert_tokens_to_ids("\u0100")  # byte-level BPE's name of byte 0
    assert text.tokenizer.decode([nul]) == "\x00"
    assert text.decode_batch(np.array([hello + [nul, 2]])) == ["Why?\ufffd"]
