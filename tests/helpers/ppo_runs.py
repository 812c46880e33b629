"""The tiny PPO run of the training-loop tests (test_train_ppo, test_resume): `ppo_config` and the
toy reward `lower_half_share`."""
from __future__ import annotations

import numpy as np

from helpers.env import REPO_ROOT, shared_data


def lower_half_share(tokenizer):
    """Toy reward (a token-level proxy on the tiny vocabulary): the share of the question's
    SentencePiece tokens among the lower half of the ids (the more frequent pieces)."""
    half = tokenizer.vocab_size // 2

    def reward(situations, questions):
        ids, mask = tokenizer.encode_batch(questions, 64, allow_empty=True)
        real = mask.astype(bool) & (ids != tokenizer.eos_id)
        return np.array([(row[m] < half).mean() if m.any() else 0.0 for row, m in zip(ids, real)])

    return reward


def ppo_config(out_dir, spm, steps=30, overrides=()):
    from clarifyjax.config import load_config

    return load_config(REPO_ROOT / "clarifyjax/presets/ppo_tiny.yaml", [
        f"run.output_dir={out_dir}", f"run.steps={steps}", "run.log_every=1", "run.eval_every=0",
        "run.sample_every=0", f"run.save_every={steps}", "policy.init=null",
        f"policy.tokenizer={spm}", "policy.tiny.vocab_size=608", "policy.tiny.d_model=32",
        "policy.tiny.d_ff=64", "policy.tiny.num_heads=4", "policy.max_input_length=32",
        f"data.train_path={shared_data('delta-clarify/train.tsv')}",
        f"data.dev_path={shared_data('delta-clarify/dev.tsv')}", "data.dev_situations=16",
        "data.eval_batch_size=16", "data.length_buckets=[32]", "ppo.batch_size=16",
        "ppo.minibatches=2", "ppo.sampling.max_new_tokens=10", "optimizer.lr=1e-3",
        "normalizer.fit_batches=2", *overrides])
