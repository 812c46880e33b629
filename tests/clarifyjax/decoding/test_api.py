"""Issue 26, item 5: the Python API checks its arguments at the boundary.

`clarifyjax.decoding.generate` / `score` (`decoding/api.py`), `sage_jax.metric`'s public
functions and `clarifyjax.evaluation.bertscore.bertscore`: each bad argument is one TypeError or
ValueError line naming it (and the row / column of a bad value), before any work. What a traced
argument under `jax.jit` cannot show (its values) is said in the docstrings and checked here too:
shapes and dtypes still raise while tracing; a traced bad alpha or weight gives NaN scores.

Each `*_BAD` table below is a list of bad inputs; the count per function is reported with the
issue. Models are tiny and random, their weights drawn on the host (no initializer to compile).
"""
from __future__ import annotations

import math
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clarifyjax.decoding import generate, score
from clarifyjax.decoding.api import check_rng
from clarifyjax.models.causal_lm import CausalLM, CausalLMConfig
from clarifyjax.models.t5 import T5Config
from helpers.t5_builders import FAMILIES, TINY, random_t5
from helpers.env import require

VOCAB = 40
CAUSAL = CausalLMConfig(model_type="llama", vocab_size=VOCAB, hidden_size=16, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=8, ffn_size=32,
                        max_position_embeddings=24, eos_token_ids=(1,))


def random_causal_lm(config: CausalLMConfig, seed: int = 0) -> CausalLM:
    """A `CausalLM` with weights drawn on the host (norm scales around 1)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0))))
    rng = np.random.RandomState(seed)

    def draw(path, shape):
        scale = 1.0 if "norm" in "/".join(map(str, path)) else 0.0
        return jnp.asarray((scale + rng.randn(*shape) / math.sqrt(shape[0])).astype(np.float32))

    flat = [(p, v.replace(draw(p, v.shape))) for p, v in nnx.to_flat_state(abstract)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


@pytest.fixture(scope="module")
def models():
    t5 = random_t5(T5Config(**{**TINY, **FAMILIES["v1.1"], "vocab_size": VOCAB}), seed=1)
    return {"t5": t5, "causal": random_causal_lm(CAUSAL, seed=2)}


IDS = np.array([[5, 6, 7, 8, 0], [9, 10, 11, 12, 13]], np.int32)
MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], np.int32)
OK = dict(rng=None, greedy=True, max_new_tokens=3)


def _ids(i: int, j: int, value: int):
    ids = IDS.copy()
    ids[i, j] = value
    return ids


def _mask(*rows: str):
    return np.array([[int(c) for c in row] for row in rows])


# (what changes in generate's arguments, the exception, the text its message must hold); each
# runs on the T5 and on the causal LM
GENERATE_BAD = [
    (dict(attention_mask=_mask("11211", "11111")), ValueError, r"attention_mask\[0, 2\] is 2;"),
    (dict(attention_mask=np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, -1]])), ValueError,
     r"attention_mask\[1, 4\] is -1"),
    (dict(attention_mask=np.array([[1, 1, 0.5, 1, 0], [1] * 5])), ValueError,
     r"attention_mask\[0, 2\] is 0\.5"),
    (dict(attention_mask=MASK.astype(np.complex64)), TypeError, "attention_mask must hold 0 and 1"),
    (dict(attention_mask=MASK.astype(str)), TypeError, "attention_mask must hold 0 and 1"),
    (dict(attention_mask=_mask("10110", "11111")), ValueError, "row 0 of attention_mask is not one run"),
    (dict(attention_mask=_mask("11111", "01010")), ValueError, "row 1 of attention_mask is not one run"),
    (dict(attention_mask=_mask("11110", "00000")), ValueError, "row 1 of attention_mask has no token"),
    (dict(input_ids=IDS[:, :0], attention_mask=MASK[:, :0]), ValueError, "input_ids has length 0"),
    (dict(input_ids=_ids(0, 1, VOCAB)), ValueError,
     rf"input_ids\[0, 1\] is {VOCAB}, outside the vocabulary \[0, {VOCAB}\)"),
    (dict(input_ids=_ids(1, 4, -3)), ValueError, r"input_ids\[1, 4\] is -3, outside"),
    (dict(input_ids=_ids(0, 4, 10 ** 6)), ValueError, r"input_ids\[0, 4\] is 1000000"),  # a pad
    (dict(input_ids=np.array([[5, 6, 7, 8, 0], [2 ** 40, 10, 11, 12, 13]], np.int64)), ValueError,
     rf"input_ids\[1, 0\] is {2 ** 40}, outside"),  # not wrapped to int32 first
    (dict(input_ids=IDS.astype(np.float32)), TypeError, "input_ids must be an integer array"),
    (dict(input_ids=IDS.astype(bool)), TypeError, "input_ids must be an integer array"),
    (dict(input_ids=[[5, 6], [7]], attention_mask=[[1, 1], [1]]), ValueError,
     r"input_ids must be a \[batch, length\] array"),
    (dict(input_ids=IDS[0], attention_mask=MASK[0]), ValueError, "must be the same"),
    (dict(attention_mask=MASK[:, :4]), ValueError, r"input_ids \(2, 5\) and attention_mask \(2, 4\)"),
    (dict(max_new_tokens=2.0), TypeError, "max_new_tokens must be an integer, got 2.0"),
    (dict(max_new_tokens="5"), TypeError, "max_new_tokens must be an integer"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens must be an integer"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1, got 0"),
    (dict(max_new_tokens=-3), ValueError, "max_new_tokens must be >= 1, got -3"),
    (dict(max_new_tokens=None), TypeError, "max_new_tokens must be an integer"),
    (dict(min_new_tokens=1.5), TypeError, "min_new_tokens must be an integer"),
    (dict(min_new_tokens=4), ValueError, r"min_new_tokens must be in \[0, max_new_tokens\]"),
    (dict(min_new_tokens=-1), ValueError, "min_new_tokens must be >= 0"),
    (dict(greedy=False, rng=jax.random.key(0), top_k=2.5), TypeError, "top_k must be an integer"),
    (dict(greedy=False, rng=jax.random.key(0), top_k=-1), ValueError, "top_k must be >= 0"),
    (dict(greedy="yes"), TypeError, "greedy must be True or False"),
    (dict(greedy=False, rng=jax.random.key(0), top_p="0.9"), TypeError, "top_p must be a number"),
    (dict(greedy=False, rng=jax.random.key(0), top_p=float("nan")), ValueError, "top_p must be in"),
    (dict(greedy=False, rng=None), ValueError, "needs an rng key"),
    (dict(greedy=False, rng=0), TypeError, "rng must be one JAX PRNG key.*got 0$"),
    (dict(rng=7), TypeError, "rng must be one JAX PRNG key"),
    (dict(rng=np.array([0, 1], np.uint32)), TypeError, "rng must be one JAX PRNG key"),
    (dict(rng=jax.random.split(jax.random.key(0), 2)), TypeError, r"shape \(2,\)"),
    (dict(rng=jnp.zeros(2, jnp.float32)), TypeError, "dtype float32"),
    (dict(rng="seed"), TypeError, "rng must be one JAX PRNG key"),
]
CAUSAL_BAD = [  # the causal LM's own arguments
    (dict(max_new_tokens=20), ValueError,
     r"longest prompt \(5 tokens\) \+ 20 reach 25 tokens, past the model's context "
     r"\(max_position_embeddings 24\)"),
    (dict(max_new_tokens=16, prefix_ids=[3, 4, 5, 6]), ValueError, r"\+ 20 reach 25 tokens"),
    (dict(prefix_ids=[3, VOCAB]), ValueError, rf"prefix_ids holds {VOCAB}, outside the vocabulary"),
    (dict(prefix_ids=[-1]), ValueError, "prefix_ids holds -1"),
    (dict(prefix_ids=[3.0, 4.0]), TypeError, "prefix_ids must be a flat sequence of integer"),
    (dict(prefix_ids=[[3, 4]]), TypeError, "prefix_ids must be a flat sequence"),
    (dict(prefix_ids="ab"), TypeError, "prefix_ids must be a sequence of token ids"),
    (dict(prefix_ids=[]), ValueError, "prefix_ids is empty"),
    (dict(stop_token_ids=[VOCAB + 5]), ValueError, "stop_token_ids holds 45"),
    (dict(stop_token_ids=[1.5]), TypeError, "stop_token_ids must be a flat sequence"),
]
T5_BAD = [  # arguments a T5 does not take
    (dict(stop_token_ids=[3]), ValueError, "stop_token_ids is for causal LMs"),
    (dict(prefix_ids=[3]), ValueError, "prefix_ids is for causal LMs"),
]


@pytest.mark.parametrize("family", ["t5", "causal"])
def test_generate_refuses_each_bad_argument_naming_it(models, family):
    model = models[family]
    table = GENERATE_BAD + (CAUSAL_BAD if family == "causal" else T5_BAD)
    for change, error, message in table:
        kwargs = {"input_ids": IDS, "attention_mask": MASK, **OK, **change}
        with pytest.raises(error) as e:
            generate(model, **kwargs)
        text = str(e.value)
        assert "\n" not in text and text.startswith("generate: "), (change, text)
        assert re.search(message, text), (change, text)
    for not_a_model in ("gpt2", None, nnx.Linear(2, 2, rngs=nnx.Rngs(0))):
        with pytest.raises(TypeError, match="generate: model must be a clarifyjax T5 or CausalLM"):
            generate(not_a_model, IDS, MASK, **OK)


@pytest.mark.parametrize("family", ["t5", "causal"])
def test_generate_accepts_what_the_loops_assume(models, family):
    """Bool and float 0/1 masks, any id of the vocabulary at padding, NumPy integer counts,
    typed and raw uint32 keys, and an empty batch."""
    model = models[family]
    base = generate(model, IDS, MASK, **OK)
    for ids, mask in ((IDS, MASK.astype(bool)), (IDS, MASK.astype(np.float64)),
                      (_ids(0, 4, VOCAB - 1), MASK), (jnp.asarray(IDS), jnp.asarray(MASK))):
        same = generate(model, ids, mask, rng=None, greedy=np.bool_(True),
                        max_new_tokens=np.int64(3))
        np.testing.assert_array_equal(same.tokens, base.tokens)
    for key in (jax.random.key(3), jax.random.PRNGKey(3)):  # typed and raw keys
        assert check_rng(key, "generate") is key
    empty = generate(model, IDS[:0], MASK[:0], **OK)
    assert [x.shape for x in empty] == [(0, 3)] * 3
    assert [x.dtype for x in empty] == [jnp.int32, jnp.float32, jnp.int32]


def test_causal_prompts_may_be_padded_on_either_side(models):
    """The rule the loops assume: a row's tokens are one run, wherever the padding is."""
    model = models["causal"]
    rows = [[5, 6, 7], [9, 10, 11, 12, 13]]
    outputs = []
    for layout in ("left", "right", "both"):
        ids, mask = np.zeros((2, 7), np.int32), np.zeros((2, 7), np.int32)
        for i, row in enumerate(rows):
            start = {"left": 7 - len(row), "right": 0, "both": (7 - len(row)) // 2}[layout]
            ids[i, start:start + len(row)], mask[i, start:start + len(row)] = row, 1
        outputs.append(np.asarray(generate(model, ids, mask, **OK).tokens))
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0], outputs[2])


def test_under_jit_shapes_and_dtypes_still_raise_values_are_not_read(models):
    model = models["t5"]

    @jax.jit
    def run(ids, mask):
        return generate(model, ids, mask, **OK).tokens

    np.testing.assert_array_equal(run(IDS, MASK), generate(model, IDS, MASK, **OK).tokens)
    run(IDS, _mask("11211", "11111"))  # traced: its values cannot be read (documented)
    with pytest.raises(TypeError, match="input_ids must be an integer array"):
        run(IDS.astype(np.float32), MASK)
    with pytest.raises(ValueError, match=r"input_ids \(2, 5\) and attention_mask \(2, 4\)"):
        run(IDS, MASK[:, :4])
    with pytest.raises(TypeError, match="rng must be one JAX PRNG key"):
        jax.jit(lambda r: generate(model, IDS, MASK, rng=r, max_new_tokens=2).tokens)(
            jnp.zeros(3, jnp.uint32))


SCORE_BAD = [  # (changes to score's arguments, error, message)
    (dict(attention_mask=_mask("11311", "11111")), ValueError, r"attention_mask\[0, 2\] is 3"),
    (dict(attention_mask=_mask("00000", "11111")), ValueError, "row 0 of attention_mask has no"),
    (dict(target_mask=_mask("011", "111")), ValueError, "row 0 of target_mask is not padded on "
                                                        "the right"),
    (dict(target_mask=_mask("101", "111")), ValueError, "row 0 of target_mask is not padded"),
    (dict(target_mask=_mask("112", "111")), ValueError, r"target_mask\[0, 2\] is 2"),
    (dict(target_ids=np.array([[2, 3, VOCAB], [2, 3, 4]])), ValueError,
     rf"target_ids\[0, 2\] is {VOCAB}, outside"),
    (dict(target_ids=np.array([[2, 3, -4], [2, 3, 4]])), ValueError, r"target_ids\[0, 2\] is -4"),
    (dict(target_ids=np.ones((2, 3), np.float32)), TypeError, "target_ids must be an integer"),
    (dict(target_ids=np.ones((3, 3), np.int32), target_mask=np.ones((3, 3), np.int32)),
     ValueError, "input_ids has 2 rows but target_ids 3"),
    (dict(target_mask=np.ones((2, 2), np.int32)), ValueError, r"target_ids \(2, 3\) and target_mask"),
    (dict(input_ids=_ids(0, 0, VOCAB + 1)), ValueError, r"input_ids\[0, 0\] is 41"),
]


@pytest.mark.parametrize("family", ["t5", "causal"])
def test_score_refuses_each_bad_argument_and_scores_an_empty_batch(models, family):
    model = models[family]
    targets = dict(target_ids=np.array([[2, 3, 4], [5, 6, 0]]), target_mask=_mask("111", "110"))
    for change, error, message in SCORE_BAD:
        kwargs = {"input_ids": IDS, "attention_mask": MASK, **targets, **change}
        with pytest.raises(error, match=message) as e:
            score(model, **kwargs)
        assert str(e.value).startswith("score: ") and "\n" not in str(e.value)
    logp = np.asarray(score(model, IDS, MASK, **targets))
    assert logp.shape == (2, 3) and logp[1, 2] == 0 and np.all(logp[:, :2] < 0)
    assert score(model, IDS[:0], MASK[:0], targets["target_ids"][:0],
                 targets["target_mask"][:0]).shape == (0, 3)
    if family == "causal":  # the last target is never an input: 5 + 20 tokens fit 24 positions
        with pytest.raises(ValueError, match=r"score: the longest prompt \(5 tokens\) \+ 20"):
            score(model, IDS, MASK, np.ones((2, 21), np.int32), np.ones((2, 21), np.int32))
        assert score(model, IDS, MASK, np.ones((2, 20), np.int32), np.ones((2, 20), np.int32)).shape == (2, 20)


@pytest.mark.parametrize("family", ["t5", "causal"])
def test_score_says_which_targets_greedy_decoding_gives(models, family):
    model = models[family]
    out = generate(model, IDS, MASK, rng=None, greedy=True, max_new_tokens=3)
    tokens, kept = np.asarray(out.tokens), np.asarray(out.mask)
    logp, greedy = score(model, IDS, MASK, tokens, kept, greedy=True)
    assert np.array_equal(logp, score(model, IDS, MASK, tokens, kept))
    assert np.asarray(greedy).all()  # the argmax at every step (True at padding)
    other = tokens.copy()
    other[:, 0] = (tokens[:, 0] + 1) % VOCAB  # not the argmax at step 0; the rest still scored
    _, greedy = score(model, IDS, MASK, other, np.ones_like(kept), greedy=True)
    assert not np.asarray(greedy)[:, 0].any()
    with pytest.raises(TypeError, match="score: greedy must be True or False"):
        score(model, IDS, MASK, tokens, kept, greedy=1)


def test_score_after_prefixes_equals_score_of_the_whole_prompts(models):
    from clarifyjax.decoding.api import score_after_prefixes

    model = models["causal"]
    prefix_ids = np.array([[0, 5, 6, 7], [9, 10, 11, 12]], np.int32)  # the first left-padded
    prefix_mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]], np.int32)
    row_prefix = np.array([1, 0, 1], np.int32)
    inputs = np.array([[20, 21, 22], [23, 24, 0], [25, 0, 0]], np.int32)  # right-padded
    targets = np.array([[21, 22, 30], [24, 31, 0], [32, 0, 0]], np.int32)  # the next tokens
    mask = (inputs > 0).astype(np.int32)
    logp, greedy = score_after_prefixes(model, prefix_ids, prefix_mask, row_prefix, inputs, mask,
                                        targets, mask)
    for r in range(3):  # the same rows as whole prompts (prefix + first input) and continuations
        prefix = prefix_ids[row_prefix[r]][prefix_mask[row_prefix[r]] == 1].tolist()
        n = int(mask[r].sum())
        prompt = np.array([prefix + [int(inputs[r, 0])]], np.int32)
        cont = targets[r:r + 1, :n]
        ref, ref_greedy = score(model, prompt, np.ones_like(prompt), cont, np.ones_like(cont),
                                greedy=True)
        np.testing.assert_allclose(np.asarray(logp)[r, :n], np.asarray(ref)[0], atol=2e-5)
        assert np.array_equal(np.asarray(greedy)[r, :n], np.asarray(ref_greedy)[0])
        assert np.all(np.asarray(logp)[r, n:] == 0)
    with pytest.raises(ValueError, match=r"score_after_prefixes: row_prefix must be in \[0, 2\)"):
        score_after_prefixes(model, prefix_ids, prefix_mask, row_prefix + 1, inputs, mask, targets, mask)
    with pytest.raises(TypeError, match="score_after_prefixes: model must be a CausalLM"):
        score_after_prefixes(models["t5"], prefix_ids, prefix_mask, row_prefix, inputs, mask, targets, mask)


# --------------------------------------------------------------------------- sage_jax.metric

EMB = np.random.RandomState(0).randn(3, 4, 6).astype(np.float32)
UNIT = EMB / np.linalg.norm(EMB, axis=-1, keepdims=True)
SIM = np.einsum("bid,bjd->bij", UNIT, UNIT)  # cosines


def _metric_bad():
    from sage_jax import metric

    m = np.ones((3, 4), bool)
    return [  # (a call, the text of its ValueError)
        (lambda: metric.sage(EMB[:, :, :0]), r"embeddings must be \[batch, n, d\] with d >= 1"),
        (lambda: metric.sage(EMB.astype(np.complex64)), "embeddings must hold real numbers"),
        (lambda: metric.sage(EMB > 0), "embeddings must hold real numbers.*bool"),
        (lambda: metric.sage(EMB.astype(str)), "embeddings must .*real numbers"),
        (lambda: metric.sage([[[1.0, 2.0]], [[1.0]]]), "embeddings must be an array of real"),
        (lambda: metric.sage(EMB[0]), r"must be \[batch, n, d\]"),
        (lambda: metric.sage(EMB, np.full((3, 4), 2)), r"mask must hold booleans or 0 / 1; mask\[0, 0\] = 2"),
        (lambda: metric.sage(EMB, np.where(m, 0.5, 0.0)), r"mask\[0, 0\] = 0\.5"),
        (lambda: metric.sage(EMB, m.astype(np.complex64)), "mask must hold booleans or 0 / 1, got dtype"),
        (lambda: metric.sage(EMB, m[:, :3]), r"mask must be \[batch, n\] = \(3, 4\)"),
        (lambda: metric.sage(EMB, alpha=-1.0), r"alpha must be a finite number in \(0, 1000000\]"),
        (lambda: metric.sage(EMB, alpha=float("nan")), "alpha must be a finite number"),
        (lambda: metric.sage(EMB, alpha=1j), "alpha must be a number"),
        (lambda: metric.sage(EMB, groups=np.zeros((3, 4), np.float32)), "groups must hold integer"),
        (lambda: metric.pairwise_cosine(EMB[:, :, :0]), "d >= 1"),
        (lambda: metric.pairwise_cosine(EMB.astype(np.complex64)), "real numbers"),
        (lambda: metric.sage_blend(EMB, EMB[:, :, :0]), "rot_embeddings must be .* d >= 1"),
        (lambda: metric.sage_blend(EMB[:, :, :0], EMB), "answer_embeddings must be .* d >= 1"),
        (lambda: metric.sage_blend(EMB, EMB.astype(np.complex64)), "rot_embeddings must hold real"),
        (lambda: metric.sage_blend(EMB, EMB, weight=1.5), r"weight must be a finite number in \[0, 1\]"),
        (lambda: metric.sage_from_similarity(SIM.astype(np.complex64)), "similarity must hold real"),
        (lambda: metric.sage_from_similarity(SIM, np.full((3, 4), 7)), r"mask\[0, 0\] = 7"),
        (lambda: metric.blend_similarity(SIM, SIM.astype(np.complex64)), "sim_rots must hold real"),
        (lambda: metric.sage_chunked(EMB[:, :, :0]), "embeddings must be .* d >= 1"),
        (lambda: metric.sage_chunked(EMB.astype(np.complex64)), "embeddings must hold real"),
        (lambda: metric.sage_chunked(None, similarity=SIM.astype(np.complex64)), "similarity must hold"),
        (lambda: metric.sage_chunked(EMB, np.full((3, 4), 3)), r"mask\[0, 0\] = 3"),
        (lambda: metric.sage_chunked(EMB, rot_embeddings=EMB[:, :, :0]), "rot_embeddings must be"),
        (lambda: metric.sage_chunked(EMB, chunk_size=2.5), "chunk_size must be an integer"),
        (lambda: metric.mean_sage(np.array([0.5, 2.0])), r"scores\[1\] = 2\.0"),
    ]


def test_sage_metric_refuses_each_bad_argument_naming_it():
    for call, message in _metric_bad():
        with pytest.raises(ValueError) as e:
            call()
        assert "\n" not in str(e.value) and re.search(message, str(e.value)), (message, e.value)


def test_sage_metric_under_jit_and_on_non_finite_inputs():
    """Traced alpha / weight outside their ranges give NaN scores (they cannot raise); shapes
    and dtypes still raise while tracing; a traced mask counts nonzero as valid; a non-finite
    vector skips its own question only."""
    from sage_jax import metric

    eager = np.asarray(metric.sage(EMB, alpha=10.0))
    by_alpha = jax.jit(lambda a: metric.sage(EMB, alpha=a))
    np.testing.assert_allclose(by_alpha(10.0), eager, rtol=1e-6)
    for bad in (-1.0, 0.0, float("nan"), float("inf"), 2e6):
        assert np.all(np.isnan(by_alpha(bad))), bad
    by_weight = jax.jit(lambda w: metric.sage_blend(EMB, EMB[::-1], weight=w))
    assert np.all(np.isfinite(by_weight(0.8)))
    for bad in (-0.1, 1.5, float("nan")):
        assert np.all(np.isnan(by_weight(bad))), bad
    with pytest.raises(ValueError, match="d >= 1"):
        jax.jit(metric.sage)(EMB[:, :, :0])
    with pytest.raises(ValueError, match="real numbers"):
        jax.jit(metric.sage)(EMB.astype(np.complex64))
    traced_mask = jax.jit(lambda m: metric.sage(EMB, m))(np.full((3, 4), 2))
    np.testing.assert_allclose(traced_mask, eager, rtol=1e-6)  # documented: nonzero is valid
    mean, skipped = jax.jit(metric.mean_sage)(jnp.array([0.5, 3.0]))  # traced: unchecked
    assert int(skipped) == 0 and float(mean) == pytest.approx(1.75)
    bad = EMB.copy()
    bad[1, 2, 0] = np.nan
    scores = np.asarray(metric.sage(bad))
    assert np.isnan(scores[1]) and np.all(np.isfinite(scores[[0, 2]]))
    mask = np.ones((3, 4), bool)
    mask[1, 2] = False  # masked out: not read
    assert np.isfinite(np.asarray(metric.sage(bad, mask))[1])
    assert metric.sage(np.zeros((0, 4, 6), np.float32)).shape == (0,)


# --------------------------------------------------------------------------- bertscore


@pytest.mark.reference
def test_bertscore_warns_about_empty_texts(tmp_path_factory):
    from clarifyjax.evaluation.bertscore import EmptyTextWarning, bertscore
    from helpers.bert_score_package import tiny_roberta_folder

    require("torch")
    folder = tiny_roberta_folder(tmp_path_factory.mktemp("bertscore_empty"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p, r, f = bertscore(["a cat", "", "dog", "  \t "], ["a cat", "b", ["x", ""], "y"],
                            model=folder, layer=1)
    found = [w for w in caught if issubclass(w.category, EmptyTextWarning)]
    assert len(found) == 1, [str(w.message) for w in caught]
    assert str(found[0].message) == (
        "bertscore: 2 empty candidate(s) (the first: candidates[1]) and 1 empty reference(s) "
        "(the first: references[2]): their raw P and R are 0, as bert-score sets them")
    assert p[1] == r[1] == f[1] == 0 and p[3] == r[3] == 0 and f[0] > 0.99
    with warnings.catch_warnings():
        warnings.simplefilter("error", EmptyTextWarning)  # texts with tokens: no warning
        bertscore(["a cat"], ["the dog"], model=folder, layer=1)
    with pytest.raises(TypeError, match=r"candidates\[0\] is NoneType"):
        bertscore([None], ["x"], model=folder, layer=1)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        bertscore(["a"], ["b"], model=folder, layer=1, batch_size=0)
