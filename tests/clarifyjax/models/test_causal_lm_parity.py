"""Our NNX `CausalLM` against PyTorch `transformers` on the same weights, for every model_type
and switch of issue 12 (helpers.causal_lm_builders.CASES): llama with GQA, llama3 rope scaling
and biases; mistral with a sliding window (4) shorter than the prompts (up to 12 tokens); qwen2
(q/k/v biases, tied embeddings); qwen3 (q/k norms, head_dim 12 != 32/4); opt pre-LN with and
without project_in/out and post-LN; falcon multi-query parallel, new_decoder_architecture (GQA,
fused biases) and the old multi-head sequential layout.

One body per case checks, in float32:
  * logits of a mixed-length batch, right- and left-padded, against each row run alone in
    torch: within 1e-4 (measured <= 1e-5);
  * greedy `generate` of 16 mixed-length prompts against transformers `generate` on the same
    prompts left-padded, with our input left- and right-padded: identical tokens;
  * `score` of random continuations against torch's log_softmax: within 1e-4;
  * `Generation.logprobs` of a sampled run at temperature 1, no truncation, against `score` of
    the same tokens: within 1e-4 (measured ~2e-6);
  * greedy `generate` with a shared `prefix_ids` (9 tokens, longer than mistral's window) and
    each row's own 1-6 tokens, against transformers `generate` on the whole prompts: identical
    tokens, and the same logprobs as our run on the whole prompts within 1e-4; a sampled run
    with the prefix gives the same tokens as one without (same key).

Compiling is most of the time: every batch that `generate` or `score` sees is ROWS rows whose
prompts pad to the 16-token bucket, so the runs without a prefix (greedy, sampled) and `score`
are one program each per case, shared by the checks. test_causal_lm and test_causal_lm_sharded
run two of these models (llama-gqa-llama3, falcon-new-architecture) with the same shapes (the
logits of [8, 12], greedy runs and `score` of 16 rows), so in a whole run the file that comes
second loads those programs from the compile cache.
"""
from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from helpers.env import require
from helpers.causal_lm_builders import (CASES, EOS, left_padded, make_hf_causal_lm, prompts,
                                        right_padded)

from clarifyjax.decoding import generate, score
from clarifyjax.models.hf import load_causal_lm

pytestmark = pytest.mark.reference

TOL = 1e-4
MAX_NEW = 8
ROWS = 16  # rows of every generate / score batch, whose longest prompt has 10-15 tokens
forward = nnx.jit(lambda model, ids, mask: model(ids, mask))


def torch_rows(torch_model, rows):
    """Each row alone through torch -> list of [len, V] logits."""
    torch = require("torch")
    with torch.no_grad():
        return [torch_model(torch.tensor([r])).logits[0].numpy() for r in rows]


def check_logits(torch_model, model, rng):
    rows = prompts(rng, [1, 5, 12, 3, 9, 7, 10, 4])  # [8, 12]
    reference = torch_rows(torch_model, rows)
    for pad in (right_padded, left_padded):
        ids, mask = pad(rows, 12)
        ours = np.asarray(forward(model, ids, mask))
        for i, ref in enumerate(reference):
            np.testing.assert_allclose(ours[i][mask[i] == 1], ref, atol=TOL, rtol=0,
                                       err_msg=f"{pad.__name__} row {i}")


def check_greedy(torch_model, model, rng):
    torch = require("torch")
    rows = prompts(rng, [12, *rng.randint(1, 13, ROWS - 1)])
    ids, mask = left_padded(rows)
    with torch.no_grad():
        out = torch_model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                                   max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
    reference = out[:, ids.shape[1]:].numpy()
    for pad in (left_padded, right_padded):
        got = generate(model, *pad(rows), rng=None, max_new_tokens=MAX_NEW, greedy=True)
        tokens, kept = np.asarray(got.tokens), np.asarray(got.mask).astype(bool)
        # transformers stops a row after EOS and pads the rest; so do we
        assert kept.sum() == (np.cumsum(reference == EOS, 1) - (reference == EOS) == 0).sum()
        np.testing.assert_array_equal(tokens[kept], reference[:, :MAX_NEW][kept],
                                      err_msg=pad.__name__)
    assert len(np.unique(reference)) >= 6, "degenerate random model: greedy repeats itself"


def check_score(torch_model, model, rng):
    torch = require("torch")
    rows = prompts(rng, [4, 1, 9, 6, 12, *rng.randint(1, 13, ROWS - 5)])
    targets = prompts(rng, [5, 3, 1, 7, *rng.randint(1, 8, ROWS - 4)])
    target_ids, target_mask = right_padded(targets)
    reference = []
    with torch.no_grad():
        for r, t in zip(rows, targets):
            logp = torch.log_softmax(torch_model(torch.tensor([r + t])).logits[0], -1)
            reference.append(logp[len(r) - 1:-1].numpy()[np.arange(len(t)), t])
    for pad in (left_padded, right_padded):
        got = np.asarray(score(model, *pad(rows), target_ids, target_mask))
        for i, (ref, t) in enumerate(zip(reference, targets)):
            np.testing.assert_allclose(got[i, :len(t)], ref, atol=TOL, rtol=0,
                                       err_msg=f"{pad.__name__} row {i}")
            assert (got[i, len(t):] == 0).all()


def check_sampled_logprobs(model, rng):
    import jax
    rows = prompts(rng, [3, 10, 1, 6, *rng.randint(1, 13, ROWS - 4)])
    ids, mask = right_padded(rows)
    got = generate(model, ids, mask, rng=jax.random.key(0), max_new_tokens=MAX_NEW)
    scored = np.asarray(score(model, ids, mask, got.tokens, got.mask))
    np.testing.assert_allclose(np.asarray(got.logprobs), scored, atol=TOL, rtol=0)


def check_shared_prefix(torch_model, model, rng):
    import jax
    torch = require("torch")
    prefix = prompts(rng, [9])[0]
    own = prompts(rng, [3, 1, 6, 2, 5, 4, *rng.randint(1, 7, ROWS - 6)])
    whole = [prefix + r for r in own]
    ids, mask = left_padded(whole)
    with torch.no_grad():
        out = torch_model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                                   max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
    reference = out[:, ids.shape[1]:].numpy()
    full = generate(model, ids, mask, rng=None, max_new_tokens=MAX_NEW, greedy=True)
    for pad in (left_padded, right_padded):
        got = generate(model, *pad(own), rng=None, max_new_tokens=MAX_NEW, greedy=True,
                       prefix_ids=prefix)
        kept = np.asarray(got.mask).astype(bool)
        np.testing.assert_array_equal(kept, np.asarray(full.mask).astype(bool))
        np.testing.assert_array_equal(np.asarray(got.tokens)[kept], reference[:, :MAX_NEW][kept],
                                      err_msg=pad.__name__)
        np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(full.logprobs),
                                   atol=TOL, rtol=0)
    sampled = [generate(model, *args, rng=jax.random.key(3), max_new_tokens=MAX_NEW, **kw).tokens
               for args, kw in (((ids, mask), {}), (right_padded(own), {"prefix_ids": prefix}))]
    np.testing.assert_array_equal(*map(np.asarray, sampled))


@pytest.mark.slow  # ten families, four compiled programs each: ~60-120 s on 2 busy cores
@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers(case, tmp_path):
    torch_model = make_hf_causal_lm(tmp_path, case)
    config, model = load_causal_lm(tmp_path)
    assert config.model_type == torch_model.config.model_type
    rng = np.random.RandomState(0)
    check_logits(torch_model, model, rng)
    check_greedy(torch_model, model, rng)
    check_score(torch_model, model, rng)
    check_sampled_logprobs(model, rng)
    check_shared_prefix(torch_model, model, rng)
