"""sage_jax.metric against published reference vectors and plain per-question numpy references
(helpers/sage_reference.py, written independently of the jitted code).

Compiling is most of this file's time, so its tests share shapes: the random batches are all
[1000, 8, 384] (`random_batch`), the blends all [7, 4, 8] in chunks of 3, and the cosines that
feed the similarity entry points come from one jitted `pairwise_cosine` (`cosines`)."""
from __future__ import annotations

import csv
import math
from collections import defaultdict

import jax
import numpy as np
import pytest

from helpers.env import shared_data
from helpers.sage_reference import (collapsed_reference, cosine_pair_rows, numpy_sage,
                                    random_questions)
from sage_jax import metric
from sage_jax.metric import (blend_similarity, mean_sage, pairwise_cosine, sage, sage_blend, sage_chunked,
                             sage_from_similarity)


QUESTIONS, N_MAX, DIM = 1000, 8, 384  # 1000 = 31 blocks of metric.BLOCK questions and a remainder
cosines = jax.jit(pairwise_cosine)  # the library's cosines, one compile per shape


def random_batch(seed: int, with_groups: bool):
    return random_questions(np.random.default_rng(seed), QUESTIONS, N_MAX, DIM, with_groups)


def numpy_cosines(vectors: np.ndarray) -> np.ndarray:
    """float64 cosines of vectors [k, d]; an all-zero vector has cosine 0 with every text."""
    v = np.asarray(vectors, np.float64)
    norms = np.linalg.norm(v, axis=1)
    v = v / np.where(norms > 0, norms, 1.0)[:, None]
    return v @ v.T


def reference_batch():
    """The five reference vectors of issue 3, padded into one [5, 5, 3] batch."""
    emb = np.zeros((5, 5, 3), np.float32)
    mask = np.zeros((5, 5), bool)
    emb[0, :5] = [1, 2, 3]
    mask[0, :5] = True
    emb[1, :4] = [1, 0, 0]
    emb[1, 4] = [0, 1, 0]
    mask[1, :5] = True
    emb[2, :3] = np.eye(3)
    mask[2, :3] = True
    emb[3, 0, :2] = [1, 0]
    emb[3, 1, :2] = [0.6, 0.8]
    mask[3, :2] = True
    for i, deg in enumerate((0, 120, 240)):
        emb[4, i, :2] = [math.cos(math.radians(deg)), math.sin(math.radians(deg))]
    mask[4, :3] = True
    # Padding holds garbage on purpose: it must not be read.
    emb[~mask] = 7.0
    return emb, mask


def test_reference_vectors_in_one_batched_call():
    emb, mask = reference_batch()
    expected = np.array([1.0, 0.516812, 0.0, 0.6, -0.5])
    got = np.asarray(sage(emb, mask))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    # Distinct texts: collapsing with one group per position changes nothing.
    groups = np.tile(np.arange(5, dtype=np.int32), (5, 1))
    np.testing.assert_allclose(np.asarray(sage(emb, mask, groups=groups)), expected, atol=1e-5, rtol=0)
    # The independent numpy reference agrees on these too.
    ours = [numpy_sage(emb[b][mask[b]]) for b in range(5)]
    np.testing.assert_allclose(ours, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("with_groups", [False, True])
def test_jitted_batch_matches_numpy_reference(with_groups):
    emb, mask, groups, n = random_batch(0 if with_groups else 1, with_groups)
    got = np.asarray(sage(emb, mask, groups=groups))
    want = np.empty(len(emb))
    for b in range(len(emb)):
        vecs = emb[b, :n[b]].astype(np.float64)
        if with_groups:
            want[b] = collapsed_reference(list(groups[b, :n[b]]), cosine_pair_rows(vecs))
        else:
            want[b] = numpy_sage(vecs)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[n == 1]).all()
    ok = ~np.isnan(want)
    err = np.abs(got[ok] - want[ok]).max()
    assert err <= 1e-5, f"max |jitted - numpy| = {err:.2e}"
    if with_groups:
        # The collapse reproduces the reference's bug: all-identical texts score 0.
        distinct = np.array([len(set(groups[b, :n[b]])) for b in range(len(emb))])
        assert ((distinct == 1) & (n >= 2)).any()
        np.testing.assert_array_equal(got[(distinct == 1) & (n >= 2)], 0.0)
        # ... and without collapsing the same questions score (close to) 1.
        plain = np.asarray(sage(emb, mask))
        np.testing.assert_allclose(plain[(distinct == 1) & (n >= 2)], 1.0, atol=1e-5)


def test_identity_groups_equal_no_groups_and_similarity_entry_point():
    emb, mask, _, _ = random_batch(2, False)
    a = np.asarray(sage(emb, mask))
    b = np.asarray(sage(emb, mask, groups=np.tile(np.arange(N_MAX, dtype=np.int32) + 100, (QUESTIONS, 1))))
    sim, ok = cosines(emb)
    c = np.asarray(sage_from_similarity(sim, mask))
    np.testing.assert_allclose(b, a, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(c, a, atol=1e-6, equal_nan=True)


def test_blend_matches_reference_formula():
    rng = np.random.default_rng(3)
    ans = rng.normal(size=(7, 4, 8)).astype(np.float32)
    rot = rng.normal(size=(7, 4, 8)).astype(np.float32)
    sa, _ = cosines(ans)
    sr, _ = cosines(rot)
    blended = np.asarray(blend_similarity(sa, sr))
    np.testing.assert_allclose(blended, 0.8 * np.asarray(sa) + 0.2 * np.asarray(sr), atol=1e-7)
    got = np.asarray(sage_from_similarity(blended))
    for b in range(7):
        rows = [(i, j, float(blended[b, i, j])) for i in range(4) for j in range(i + 1, 4)]
        assert abs(got[b] - collapsed_reference(list(range(4)), rows)) < 1e-5
    np.testing.assert_allclose(np.asarray(blend_similarity(sa, sr, weight=1.0)), np.asarray(sa), atol=1e-7)
    # The fused entry point and the chunked driver (last chunk padded) give the same scores.
    np.testing.assert_allclose(np.asarray(sage_blend(ans, rot)), got, atol=1e-6)
    chunked = np.asarray(sage_chunked(ans, rot_embeddings=rot, blend_weight=0.8, chunk_size=3))
    np.testing.assert_allclose(chunked, got, atol=1e-6)
    half = np.asarray(sage_blend(ans, rot, weight=0.5))
    np.testing.assert_allclose(half, np.asarray(sage_from_similarity(blend_similarity(sa, sr, 0.5))), atol=1e-6)


def test_bad_vectors_and_short_rows_are_nan_and_counted():
    # [5, 5, 3] as `reference_batch`, so the same compiled program; positions 3 and 4 are padding
    emb = np.ones((5, 5, 3), np.float32)
    mask = np.ones((5, 5), bool)
    mask[:, 3:] = False
    emb[0, 1] = 0.0  # all-zero vector: cosine 0 with every text, a finite score
    emb[1, 2, 0] = np.nan  # NaN
    mask[2, 1:] = False  # one paraphrase only
    mask[3] = False  # no text at all
    emb[4, :, 1] = [1.0, 2.0, 3.0, 4.0, 5.0]  # a fine question
    scores = np.asarray(sage(emb, mask))
    assert np.isnan(scores[1:4]).all()
    # W = [[., 0, 1], [0, ., 0], [1, 0, .]]: p = (1/2, 0, 1/2), H = log 2 / log 3, lambda = 1/3
    assert scores[0] == pytest.approx(math.log(2) / math.log(3) / 3, abs=1e-6)
    mean, skipped = mean_sage(scores)
    assert int(skipped) == 3
    assert float(mean) == pytest.approx(float(scores[[0, 4]].mean()))
    # A zero/NaN vector at a padded position is ignored.
    mask2 = mask.copy()
    mask2[0, :3] = [True, False, True]
    assert not np.isnan(np.asarray(sage(emb, mask2))[0])
    # NaN similarity between two valid texts: NaN; all-NaN scores: NaN mean, all skipped.
    sim = np.ones((7, 4, 4), np.float32)  # the blend tests' shape
    sim[0, 0, 2] = sim[0, 2, 0] = np.nan
    assert np.isnan(np.asarray(sage_from_similarity(sim))[0])
    mean, skipped = mean_sage(np.full(5, np.nan))
    assert np.isnan(float(mean)) and int(skipped) == 5


def test_bad_vectors_in_the_blend_and_the_chunked_driver():
    """A NaN/inf answer OR rule-of-thumb vector at a valid position skips the question, in
    `sage_blend` and in `sage_chunked` (whose padded last chunk must not add skips); an all-zero one
    has cosine 0 with every text."""
    rng = np.random.default_rng(5)
    ans = rng.normal(size=(7, 4, 8)).astype(np.float32) + 2.0
    rot = rng.normal(size=(7, 4, 8)).astype(np.float32) + 2.0
    mask = np.ones((7, 4), bool)
    ans[1, 2] = 0.0  # all-zero answer: scored
    rot[3, 0, 5] = np.nan  # NaN rule of thumb
    rot[4, 1] = np.inf
    mask[5, 3] = False
    ans[5, 3] = np.nan  # ... at a padded position: ignored
    want = np.full(7, np.nan)
    for b in (0, 1, 2, 5, 6):  # each question's valid vectors alone, in float64
        k = int(mask[b].sum())
        blended = 0.8 * numpy_cosines(ans[b, :k]) + 0.2 * numpy_cosines(rot[b, :k])
        want[b] = collapsed_reference(list(range(k)), [(i, j, float(blended[i, j]))
                                                       for i in range(k) for j in range(i + 1, k)])
    for got in (sage_blend(ans, rot, mask), sage_chunked(ans, mask, rot_embeddings=rot, chunk_size=3)):
        got = np.asarray(got)
        assert np.array_equal(np.isnan(got), np.isnan(want)), got
        np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], atol=1e-5)
        assert int(mean_sage(got)[1]) == 2


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"\[batch, n, d\]"):
        sage(np.ones((3, 4)))
    with pytest.raises(ValueError, match="mask"):
        sage(np.ones((2, 3, 4)), np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="groups"):
        sage(np.ones((2, 3, 4)), groups=np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"\[batch, n, n\]"):
        sage_from_similarity(np.ones((2, 3, 4)))


def test_chunked_driver_equals_one_call_and_compiles_once():
    emb, mask, groups, _ = random_batch(4, True)
    whole = np.asarray(sage(emb, mask, groups=groups))
    seen = []
    metric._sage_jit.clear_cache()
    chunked = np.asarray(sage_chunked(emb, mask, groups=groups, chunk_size=96,
                                      on_chunk=lambda done, total: seen.append(done)))
    # float32 Gram matrices of different batch sizes may round differently.
    np.testing.assert_allclose(chunked, whole, atol=1e-5, equal_nan=True)
    assert seen[-1] == QUESTIONS and len(seen) == math.ceil(QUESTIONS / 96)
    assert metric._sage_jit._cache_size() == 1  # the padded last chunk reuses the compiled shape
    sim, _ = cosines(emb)
    via_sim = np.asarray(sage_chunked(None, mask, groups=groups, similarity=np.asarray(sim), chunk_size=320))
    np.testing.assert_allclose(via_sim, whole, atol=1e-5, equal_nan=True)


def test_pairs_file_cosine_rot_collapsed_mean_matches_reference():
    """vicuna pairs file: the file's cosine_rot as edge weights, identical answers collapsed."""
    from sage_jax.data import pair_matrix, read_questions, text_batch

    path = shared_data("sage-mcc/vicuna-7b-v1.5_pairs_0.csv")
    # The reference side reads the file with csv alone: one row = one edge between two texts.
    rows_by_q: dict[str, list] = defaultdict(list)
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            rows_by_q[row["question_id"]].append(row)
    want = []
    for rows in rows_by_q.values():
        keys, pair_rows, index = [], [], {}
        for row in rows:  # positions = distinct (paraphrase, answer, rot) triples, first seen first
            ends = []
            for side in ("1", "2"):
                triple = (row[f"paraphrased_{side}"], row[f"model_output_{side}"], row[f"rot_{side}"])
                if triple not in index:
                    index[triple] = len(keys)
                    keys.append(triple[1])  # node key: the answer text
                ends.append(index[triple])
            pair_rows.append((ends[0], ends[1], float(row["cosine_rot"])))
        want.append(collapsed_reference(keys, pair_rows))
    want_mean = float(np.mean(want))

    questions = read_questions(path, need=("answer", "rot"))
    batch = text_batch(questions, "answer")
    weights = pair_matrix(questions, "cosine_rot")
    scores = sage_from_similarity(weights, batch.mask, groups=batch.groups)
    mean, skipped = mean_sage(scores)
    assert int(skipped) == 0
    n_collapsed = sum(len(set(q.answers)) < q.n for q in questions)
    assert n_collapsed >= 10  # the file really exercises the collapsing
    assert abs(float(mean) - want_mean) <= 1e-6, (float(mean), want_mean)
    np.testing.assert_allclose(np.asarray(scores), want, atol=1e-5)
    # Without collapsing the mean is higher (the reference's bug lowers it).
    plain, _ = mean_sage(sage_from_similarity(weights, batch.mask))
    assert float(plain) > float(mean)


def reference_entropy(edges, alpha=10):
    """The reference's `entropy(edges)` (vnnm404/SaGE generate_scores.py) transcribed: nodes are
    texts, each edge row adds its positive weight to both ends, `avg` is the mean weight of every
    row (rows between identical texts included), logs in base 2, strengths scaled by 10."""
    nodes = sorted({e[0] for e in edges} | {e[1] for e in edges})
    strength = dict.fromkeys(nodes, 1e-20)
    for a, b, w in edges:
        if w > 0:
            strength[a] += w
            strength[b] += w
    avg = sum(w for _, _, w in edges) / len(edges)
    infos = [float((s * 10) ** alpha) for s in strength.values()]
    probs = [x / sum(infos) for x in infos]
    max_entropy = math.log2(len(probs)) if len(probs) != 1 else 1
    return avg * -sum(p * math.log2(p) for p in probs if p != 0) / max_entropy


def test_collapsed_answers_mean_of_the_vicuna_pairs_file_is_the_references():
    """The reference code on the vicuna pairs file without RoTs (nodes keyed by answer text, edge
    weights cosine_model_output) gives a mean of 0.545784589475723; 16 of its 250 questions hold
    identical answers. Averaging over distinct node pairs only (this mode before the fix) gave
    0.546143; without collapsing the mean is 0.575004."""
    from sage_jax.data import pair_matrix, read_questions, text_batch

    path = shared_data("sage-mcc/vicuna-7b-v1.5_pairs_0.csv")
    by_q: dict[str, list] = defaultdict(list)
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            by_q[row["question_id"]].append(row)
    want = [reference_entropy([(r["model_output_1"], r["model_output_2"], float(r["cosine_model_output"]))
                               for r in rows]) for rows in by_q.values()]
    assert float(np.mean(want)) == pytest.approx(0.545784589475723, abs=1e-12)

    questions = read_questions(path, need=("answer",))
    batch = text_batch(questions, "answer")
    scores = sage_from_similarity(pair_matrix(questions, "cosine_model_output"), batch.mask, groups=batch.groups)
    # float32: one question's lambda is ~1e-6, the cancellation of weights of both signs
    np.testing.assert_allclose(np.asarray(scores), want, atol=3e-6)
    mean, skipped = mean_sage(scores)
    assert int(skipped) == 0 and abs(float(mean) - 0.545784589475723) <= 1e-6
    assert abs(float(mean) - 0.546143) > 3e-4  # the fix changes the value
