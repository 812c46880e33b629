"""The sage_jax Python API given bad parameters or values (tracker issue 11): concrete bad
parameters are a ValueError naming them, traced ones pass; scores do not depend on the scale of
the embeddings (float64 numpy reference at 1e-30 .. 1e30); zero vectors and similarities outside
[-1, 1] have documented results. test_count_of_bad_inputs counts the distinct bad inputs."""
from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from sage_jax.data import Columns, pair_matrix, read_questions, text_batch
from clarifyjax.files.textfiles import check_texts
from sage_jax.metric import (mean_sage, pairwise_cosine, sage, sage_blend, sage_chunked,
                             sage_from_similarity)
from helpers.sage_files import pairs_file


SHAPE = (4, 5, 16)  # [questions, texts, d] of the random batches below: one compiled program for all

# ----------------------------------------------------------------------------- Python API parameters

BAD_ALPHAS = [0, 0.0, -1, float("nan"), float("inf"), -float("inf"), 1e7, "10", np.array([1.0, 2.0]), True]


@pytest.mark.parametrize("alpha", BAD_ALPHAS, ids=repr)
def test_bad_alpha_is_a_value_error_in_every_entry_point(alpha):
    emb = np.ones((2, 3, 4), np.float32)
    calls = [lambda: sage(emb, alpha=alpha), lambda: sage_from_similarity(np.ones((2, 3, 3)), alpha=alpha),
             lambda: sage_blend(emb, emb, alpha=alpha), lambda: sage_chunked(emb, alpha=alpha)]
    for call in calls:
        with pytest.raises(ValueError, match="alpha must be"):
            call()


@pytest.mark.parametrize("kwargs,needle", [
    (dict(weight=-0.1), "weight must be"), (dict(weight=1.5), "weight must be"),
    (dict(weight=float("nan")), "weight must be")])
def test_bad_blend_weight(kwargs, needle):
    emb = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=needle):
        sage_blend(emb, emb, **kwargs)
    with pytest.raises(ValueError, match="blend_weight must be"):
        sage_chunked(emb, rot_embeddings=emb, blend_weight=kwargs["weight"])


@pytest.mark.parametrize("chunk_size", [0, -3, 2.5, float("nan")])
def test_bad_chunk_size(chunk_size):
    with pytest.raises(ValueError, match="chunk_size must be an integer"):
        sage_chunked(np.ones((2, 3, 4), np.float32), chunk_size=chunk_size)


@pytest.mark.parametrize("scores,needle", [([0.5, 2.0], r"scores\[1\] = 2.0"), ([np.inf, 0.2], r"scores\[0\] = inf"),
                                           ([-np.inf, 0.1], "-inf"), ([[0.1]], r"\[batch\]"),
                                           (["0.5", "0.2"], "scores must be an array of real numbers"),
                                           ([True, False], "scores must hold real numbers .* got dtype bool")])
def test_mean_sage_refuses_what_no_score_is(scores, needle):
    with pytest.raises(ValueError, match=needle):
        mean_sage(np.array(scores))


def test_traced_parameters_are_not_checked_under_jit():
    emb = np.random.default_rng(0).normal(size=SHAPE).astype(np.float32)
    got = jax.jit(lambda e, a: sage(e, alpha=a))(emb, 10.0)
    np.testing.assert_allclose(got, sage(emb), atol=1e-6)
    mean, skipped = jax.jit(mean_sage)(np.array([0.2, np.nan], np.float32))
    assert float(mean) == pytest.approx(0.2) and int(skipped) == 1
    with pytest.raises(ValueError, match="scores must hold real numbers"):  # True is no score of 1
        jax.jit(mean_sage)(np.array([True, False]))


@pytest.mark.parametrize("call,needle", [
    (lambda p: read_questions(p, format="xml"), "format must be"),
    (lambda p: read_questions(p, need=("answers",)), "unknown text field 'answers'"),
    (lambda p: read_questions(p, weight_columns="cosine_rot"), "a list of column names"),
    (lambda p: read_questions(p, columns=Columns(answer=" ")), "answer column name must be"),
    (lambda p: read_questions(p, columns=Columns(rot="model_output")), "answer column and rot column"),
    (lambda p: text_batch(read_questions(p), "answer", n_max=0), "n_max must be a positive integer"),
    (lambda p: pair_matrix(read_questions(p), "cosine_rot", n_max=2), "more than n_max=2"),
])
def test_bad_reader_parameters_are_value_errors(tmp_path, call, needle):
    with pytest.raises(ValueError, match=needle):
        call(pairs_file(tmp_path / "p.csv"))


def test_unencodable_text_is_refused_before_the_tokenizer():
    with pytest.raises(ValueError, match=r"texts\[1\] holds '\\ud800' at character 2"):
        check_texts(["fine", "a \ud800 b"])


# ----------------------------------------------------------------------------- scale invariance


def numpy_cosine_sage(vectors, alpha=10.0):
    """float64 reference; all-zero vectors have cosine 0 with everything (documented)."""
    v = np.asarray(vectors, np.float64)
    v = v / np.max(np.abs(v), axis=1, keepdims=True).clip(min=np.finfo(np.float64).tiny)
    norms = np.linalg.norm(v, axis=1)
    w = (v @ v.T) / np.outer(np.where(norms > 0, norms, 1), np.where(norms > 0, norms, 1))
    k = len(v)
    s = 1e-20 + np.array([sum(max(w[i, j], 0) for j in range(k) if j != i) for i in range(k)])
    logp = alpha * np.log(s) - np.logaddexp.reduce(alpha * np.log(s))
    h = -np.sum(np.exp(logp) * logp) / math.log(k)
    return float(np.mean(w[np.triu_indices(k, 1)]) * h)


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e-10, 1.0, 1e10, 1e20, 1e30])
def test_scores_do_not_depend_on_the_scale(scale):
    rng = np.random.default_rng(7)
    base = rng.normal(size=SHAPE) + 0.5
    emb = (base * scale).astype(np.float32)
    assert np.isfinite(emb).all() and (emb != 0).any()
    got = np.asarray(sage(emb))
    want = [numpy_cosine_sage(base[b]) for b in range(len(base))]
    np.testing.assert_allclose(got, want, atol=2e-5)
    sim, ok = pairwise_cosine(emb)
    assert bool(ok.all()) and float(np.abs(np.asarray(sim)).max()) <= 1.0


def test_tiny_and_huge_vectors_mixed_and_zero_vectors():
    rng = np.random.default_rng(8)
    base = rng.normal(size=SHAPE) + 0.3
    scales = np.array([1e-30, 1e30, 1.0, 1e-15, 1e25])[None, :, None]
    got = np.asarray(sage((base * scales).astype(np.float32)))
    np.testing.assert_allclose(got, [numpy_cosine_sage(b) for b in base], atol=2e-5)
    zero = base.astype(np.float32)
    zero[0, 2] = 0.0  # one zero vector: cosine 0 with the others, a finite score
    zero[1, :] = 0.0  # all zero: every cosine 0, strengths equal -> lambda = 0
    got = np.asarray(sage(zero))
    assert np.isfinite(got).all() and got[1] == 0.0
    assert got[0] == pytest.approx(numpy_cosine_sage(zero[0]), abs=2e-5)
    assert np.asarray(sage(zero * np.float32(1e30)))[0] == pytest.approx(got[0], abs=2e-5)


def test_masked_positions_do_not_change_the_valid_cosines():
    """Whatever sits at a masked position (zero padding, NaN, huge or tiny), the valid positions'
    cosines and scores are those of the clean vectors (whichever way they were computed)."""
    rng = np.random.default_rng(9)
    clean = (rng.normal(size=SHAPE) + 0.3).astype(np.float32)
    mask = np.ones(SHAPE[:2], bool)
    mask[:, -1] = False
    dirty = clean.copy()
    dirty[:, -1] = np.array([0.0, np.nan, 1e30, 1e-30], np.float32)[:, None]
    want_sim = np.asarray(pairwise_cosine(clean)[0])[:, :4, :4]
    got_sim = np.asarray(pairwise_cosine(dirty, mask)[0])[:, :4, :4]
    np.testing.assert_allclose(got_sim, want_sim, atol=1e-6)
    np.testing.assert_allclose(np.asarray(sage(dirty, mask)), np.asarray(sage(clean, mask)),
                               atol=1e-6)
    # a scaled copy goes through the rescaled cosines and agrees with the direct ones
    np.testing.assert_allclose(np.asarray(pairwise_cosine(clean * np.float32(1e25))[0]),
                               np.asarray(pairwise_cosine(clean)[0]), atol=1e-6)


def test_similarities_outside_the_cosine_range_skip_the_question():
    sim = np.full((3, 3, 3), 0.5, np.float32)
    sim[0, 0, 1] = sim[0, 1, 0] = 1.5
    sim[1, 0, 2] = -np.inf
    sim[2, 1, 2] = 1.0000001  # float32 rounding of a cosine of 1: fine
    got = np.asarray(sage_from_similarity(sim))
    assert np.isnan(got[:2]).all() and -1.0 <= got[2] <= 1.0
