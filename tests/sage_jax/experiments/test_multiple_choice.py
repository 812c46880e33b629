"""`sage-jax experiment` kind accuracy (the SaGE paper's Table 3 and Figure 4) on three tiny Llama
folders: TruthfulQA MC1 / MC2 from the shared generation CSV and HellaSwag (a small file in the
official JSONL format) zero- and two-shot; each choice's log-likelihood against
lm-evaluation-harness 0.4.13's `hf` model on the same folder and files (DESIGN §7: its own task
YAMLs over local files), and the correlations against scipy on the saved per-model numbers.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from clarifyjax.config.loader import build_root
from helpers.env import require, shared_data
from helpers.lm_eval_tasks import hellaswag_rows
from sage_jax.experiments import benchmarks, command
from sage_jax.experiments.config import ExperimentConfig

BOOT = {"resamples": 999, "seed": 1, "confidence": 0.95, "method": "percentile"}
MAX_LENGTH = 512
TQA = 3  # TruthfulQA questions


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from clarifyjax.models.tiny import tiny_llama_folder
    from helpers.tiny_models import tiny_classifier_folder

    root = tmp_path_factory.mktemp("accuracy")
    words = {"vocab_size": 2000}
    models = [tiny_llama_folder(root, seed=s, tokenizer=words, max_position_embeddings=MAX_LENGTH) for s in (4, 5, 6)]
    bert = tiny_classifier_folder(root, model_type="bert")
    for name, rows in (("hs.jsonl", hellaswag_rows(6)), ("hs_train.jsonl", hellaswag_rows(6, 100))):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    # SaGE on paraphrases: the published q100 questions and paraphrases stand in for the benchmark's
    cfg = build_root(ExperimentConfig, {
        "kind": "accuracy", "out": str(root / "exp"), "bootstrap": BOOT,
        "run": {"questions": str(shared_data("sage-mcc/q100_gpt-3.5-turbo_rot.csv")), "limit": 3, "quiet": True,
                "answer": {"max_attempts": 2}, "score": {"embedder": str(bert), "bertscore": False}},
        "models": [{"name": f"m{i}", "generator": {"kind": "local", "model": str(m)},
                    "sampling": {"max_new_tokens": 8}} for i, m in enumerate(models)],
        "benchmarks": [
            {"task": "truthfulqa_mc1", "file": str(shared_data("benchmarks/TruthfulQA.csv")), "sample": TQA,
             "seed": 2, "max_length": MAX_LENGTH},
            {"task": "truthfulqa_mc2", "file": str(shared_data("benchmarks/TruthfulQA.csv")), "sample": TQA,
             "seed": 2, "max_length": MAX_LENGTH},
            {"task": "hellaswag", "file": str(root / "hs.jsonl"), "max_length": MAX_LENGTH},
            {"task": "hellaswag", "file": str(root / "hs.jsonl"), "shots": 2,
             "fewshot_file": str(root / "hs_train.jsonl"), "max_length": MAX_LENGTH}]})
    from clarifyjax.models.embedder import SentenceEmbedder

    data = command.run_experiment(cfg, embedder=SentenceEmbedder.from_pretrained(bert))
    return {"root": root, "models": models, "data": data, "out": root / "exp"}


def saved(setup, model: str, name: str) -> list[dict]:
    return json.loads((setup["out"] / "accuracy" / model / f"{name}.json").read_text())["docs"]


@pytest.mark.reference
@pytest.mark.slow  # the module's experiment: three tiny LLMs answering, the scoring, every benchmark's compiles
def test_table3_and_figure4_correlations_equal_scipy_on_the_saved_numbers(setup):
    require("scipy")
    import scipy.stats

    data, out = setup["data"], setup["out"]
    names = ["m0", "m1", "m2"]
    pq = json.loads((out / "runs/accuracy/report/scores.json").read_text())["models"]
    for name in names:
        sage = [v for v in pq[name]["per_question"]["sage_answer"] if v is not None]
        assert data["sage"][name]["mean"] == pytest.approx(np.mean(sage), abs=1e-12)
        for bench, metrics in data["accuracy"][name].items():
            docs = saved(setup, name, bench)
            for metric, entry in metrics.items():  # each document's metric recomputed from its saved lls
                values = []
                for d in docs:
                    lls = np.array(d["loglikelihoods"])
                    values.append(d[metric])
                    if metric in ("mc1", "acc"):
                        assert d[metric] == float(np.argmax(lls) == (0 if metric == "mc1" else d["gold"]))
                assert entry["mean"] == pytest.approx(np.mean(values), abs=1e-12)
    x = [data["sage"][n]["mean"] for n in names]
    for key, corr in data["correlations"].items():
        bench, metric = key.split("/")
        y = [data["accuracy"][n][bench][metric]["mean"] for n in names]
        if np.ptp(y) == 0 or np.ptp(x) == 0:
            assert corr["pearson"]["r"] is None
            continue
        assert corr["pearson"]["r"] == pytest.approx(scipy.stats.pearsonr(x, y).statistic, abs=1e-12)
        assert corr["spearman"]["r"] == pytest.approx(scipy.stats.spearmanr(x, y).statistic, abs=1e-12)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = scipy.stats.bootstrap((np.array(x), np.array(y)), lambda a, b, axis=-1: scipy.stats.pearsonr(
                a, b, axis=axis).statistic, paired=True, n_resamples=999, method="percentile",
                rng=np.random.default_rng(1)).confidence_interval
        mine = corr["pearson"]
        assert (np.nan if mine["low"] is None else mine["low"]) == pytest.approx(ref.low, abs=1e-12, nan_ok=True)
        assert (np.nan if mine["high"] is None else mine["high"]) == pytest.approx(ref.high, abs=1e-12, nan_ok=True)
    series = json.loads((out / "figure4.series.json").read_text())
    assert len(series) == len(data["correlations"])
    for title, drawn in series.items():
        bench, metric = title.split(":")[0].split("/")
        (points,) = [d for d in drawn if d["type"] == "scatter"]
        assert points["x"] == pytest.approx(x)
        assert points["y"] == pytest.approx([data["accuracy"][n][bench][metric]["mean"] for n in names])


def test_the_hellaswag_and_truthfulqa_readers_follow_lm_eval():
    rows = benchmarks.truthfulqa_csv(shared_data("benchmarks/TruthfulQA.csv"))
    assert len(rows) == 817
    first = rows[0]
    assert first["mc1_targets"]["choices"][0] == "The watermelon seeds pass through your digestive system."
    assert first["mc1_targets"]["labels"] == [1] + [0] * 7
    assert sum(first["mc2_targets"]["labels"]) == 5
    assert benchmarks.hellaswag_preprocess("A  b [title] c [x]d") == "A b. c d"


@pytest.mark.reference
@pytest.mark.slow  # the module's experiment: three tiny LLMs answering, the scoring, every benchmark's compiles
def test_every_choice_equals_lm_eval_hf_on_the_same_folder_and_files(setup, tmp_path):
    require("lm_eval")
    import torch

    from clarifyjax.harness.local_tasks import write_tasks
    from helpers.lm_eval_tasks import loglikelihoods

    torch.set_num_threads(1)
    root = setup["root"]
    tqa = tmp_path / "truthfulqa_mc.jsonl"  # the CSV's questions the experiment sampled, as MC JSON
    csv_rows = benchmarks.truthfulqa_csv(shared_data("benchmarks/TruthfulQA.csv"))
    chosen = benchmarks.sample_docs(benchmarks.load_docs("truthfulqa_mc1", shared_data("benchmarks/TruthfulQA.csv")),
                                    TQA, 2)
    tqa.write_text("".join(json.dumps(csv_rows[int(d.doc_id)]) + "\n" for d in chosen))
    tasks = write_tasks(tmp_path / "tasks", hellaswag=root / "hs.jsonl", hellaswag_train=root / "hs_train.jsonl",
                        truthfulqa=tqa)
    ref = loglikelihoods(tasks, setup["models"][0], ["local_hellaswag", "local_hellaswag_2shot",
                                                     "local_truthfulqa_mc1", "local_truthfulqa_mc2"], MAX_LENGTH)
    pairs = {"hellaswag_0shot": "local_hellaswag", "hellaswag_2shot": "local_hellaswag_2shot",
             "truthfulqa_mc1_0shot": "local_truthfulqa_mc1", "truthfulqa_mc2_0shot": "local_truthfulqa_mc2"}
    for ours, theirs in pairs.items():
        docs = saved(setup, "m0", ours)
        assert len(docs) == len(ref[theirs]["lls"])
        for mine, other in zip(docs, ref[theirs]["lls"]):
            assert mine["loglikelihoods"] == pytest.approx(other, abs=2e-4)  # float32, two frameworks
        metrics = setup["data"]["accuracy"]["m0"][ours]
        for metric, entry in metrics.items():
            key = "acc,none" if metric in ("mc1", "mc2") else f"{metric},none"
            assert entry["mean"] == pytest.approx(float(ref[theirs]["metrics"][key]), abs=1e-4)
