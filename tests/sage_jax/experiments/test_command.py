"""`sage-jax experiment`: the SaGE paper's experiments end to end on tiny causal LMs made here and on
the published files (sage_jax.experiments), each table's numbers against scipy and the
krippendorff package on the per-question scores the runs saved, each figure's drawn data against
its table, and `sage_jax.score_details` against `sage-jax run` with a file generator.

The models are random (tiny Llamas, a tiny BERT as the sentence embedder): what is tested is the
plumbing and the statistics, not what the numbers say about a model.
"""
from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from clarifyjax.config.loader import build_root
from helpers.env import REPO_ROOT, require, shared_data
from sage_jax.experiments import command, stats
from sage_jax.experiments.config import ExperimentConfig

Q100 = "sage-mcc/q100_gpt-3.5-turbo_rot.csv"
BOOT = {"resamples": 999, "seed": 3, "confidence": 0.9, "method": "BCa"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two tiny Llamas, a third whose folder the fake rule-of-thumb writer stands in for (it is
    checked before any run, never loaded), and a tiny BERT (embedder and BERTScore)."""
    from clarifyjax.models.tiny import tiny_llama_folder
    from helpers.tiny_models import tiny_classifier_folder

    root = tmp_path_factory.mktemp("models")
    words = {"vocab_size": 2000}  # ~3 characters a token: an answer prompt fits 128 positions
    return {"llama1": str(tiny_llama_folder(root, seed=1, tokenizer=words)),
            "llama2": str(tiny_llama_folder(root, seed=2, tokenizer=words)),
            "rot_writer": str(tiny_llama_folder(root, seed=3, tokenizer=words)),
            "bert": str(tiny_classifier_folder(root, model_type="bert"))}


@pytest.fixture(scope="module")
def embedder(folders):
    from clarifyjax.models.embedder import SentenceEmbedder

    return SentenceEmbedder.from_pretrained(folders["bert"])


def q100_rows(n: int) -> list[dict]:
    with open(shared_data(Q100), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    ids = list(dict.fromkeys(r["question_id"] for r in rows))[:n]
    return [r for r in rows if r["question_id"] in ids]


def experiment(tmp_path, embedder, fake_rot_writer: str | None = None, **raw):
    """Run one experiment; the rot writer whose model is `fake_rot_writer` is helpers.fake_llm's (a
    tiny LLM's 1,400-token RoT prompts would take minutes to compile and run on CPU)."""
    from helpers.fake_llm import FakeGenerator
    from sage_jax.run import pipeline

    cfg = build_root(ExperimentConfig, {"out": str(tmp_path / "exp"), "bootstrap": BOOT, **raw})
    generators = pipeline.Generators(lambda c, b, p: FakeGenerator(name="rot") if c.model == fake_rot_writer
                                     else pipeline.build_generator(c, b, p))
    return cfg, command.run_experiment(cfg, embedder=embedder, generators=generators)


def local(folder: str, name: str) -> dict:
    return {"name": name, "generator": {"kind": "local", "model": folder},
            "sampling": {"max_new_tokens": 8}}


def scipy_mean_interval(values) -> tuple[float, float]:
    import scipy.stats

    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ci = scipy.stats.bootstrap((x,), np.mean, n_resamples=BOOT["resamples"], method=BOOT["method"],
                                   confidence_level=BOOT["confidence"], rng=np.random.default_rng(BOOT["seed"]))
    return float(ci.confidence_interval.low), float(ci.confidence_interval.high)


def assert_interval(entry: dict, values) -> None:
    """A saved mean and interval equal numpy's mean and scipy's bootstrap of the saved values."""
    x = [v for v in values if v is not None and np.isfinite(v)]
    assert entry["n"] == len(x)
    if not x:
        assert entry["mean"] is None
        return
    assert entry["mean"] == pytest.approx(float(np.mean(x)), abs=1e-12)
    low, high = scipy_mean_interval(x)
    for mine, ref in ((entry["low"], low), (entry["high"], high)):
        assert (mine is None and not np.isfinite(ref)) or mine == pytest.approx(ref, abs=1e-12)


def scores(out: Path, run: str) -> dict:
    return json.loads((out / "runs" / run / "report" / "scores.json").read_text())["models"]


@pytest.mark.reference
def test_the_statistics_equal_scipy_and_krippendorff():
    require("scipy")
    require("krippendorff")
    import krippendorff
    import scipy.stats

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=30), rng.normal(size=30)
    y = 0.6 * x + y
    for method in ("BCa", "percentile", "basic"):
        settings = dict(BOOT, method=method)
        ref = scipy.stats.bootstrap((x, y), lambda a, b, axis=-1: scipy.stats.pearsonr(a, b, axis=axis).statistic,
                                    paired=True, n_resamples=999, method=method, confidence_level=0.9,
                                    rng=np.random.default_rng(3)).confidence_interval
        got = stats.correlation(x, y, "pearson", **settings)
        assert (got["low"], got["high"]) == pytest.approx((ref.low, ref.high), abs=1e-12)
        # Spearman's rho is Pearson's r of scipy's average ranks (spearmanr itself takes no row axis)
        ref = scipy.stats.bootstrap((x, y), lambda a, b, axis=-1: scipy.stats.pearsonr(
            scipy.stats.rankdata(a, axis=axis), scipy.stats.rankdata(b, axis=axis), axis=axis).statistic,
            paired=True, n_resamples=999, method=method, confidence_level=0.9,
            rng=np.random.default_rng(3)).confidence_interval
        got = stats.correlation(x, y, "spearman", **settings)
        assert (got["low"], got["high"]) == pytest.approx((ref.low, ref.high), abs=1e-12)
    assert stats.correlation(x, y, "spearman", **BOOT)["r"] == pytest.approx(scipy.stats.spearmanr(x, y).statistic,
                                                                           abs=1e-12)
    ties = np.round(x * 2) / 2  # ties: average ranks
    assert stats.correlation(ties, y, "spearman", **BOOT)["r"] == pytest.approx(
        scipy.stats.spearmanr(ties, y).statistic, abs=1e-12)
    labels = rng.integers(0, 2, (4, 40)).astype(float)
    labels[rng.random((4, 40)) < 0.25] = np.nan
    assert stats.krippendorff_alpha(labels) == pytest.approx(
        krippendorff.alpha(reliability_data=labels, level_of_measurement="nominal"), abs=1e-12)
    assert np.isnan(stats.bootstrap_interval(lambda i: np.zeros(i.shape[:-1]) / 0.0, 5)[0])  # undefined: NaN


def drawn(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.series.json").read_text())


@pytest.mark.reference
@pytest.mark.slow  # the module's first scoring run: the embedder's, BERTScore's, SaGE's, two tiny LLMs' compiles
def test_models_table1_with_intervals_and_paired_comparisons(tmp_path, folders, embedder):
    cfg, data = experiment(tmp_path, embedder, fake_rot_writer=folders["rot_writer"], kind="models", run={
        "questions": str(shared_data(Q100)), "limit": 3, "quiet": True, "answer": {"max_attempts": 2},
        "rot": {"generator": {"kind": "local", "model": folders["rot_writer"]}},
        "score": {"embedder": folders["bert"], "bertscore_model": folders["bert"]}},
        models=[local(folders["llama1"], "m1"), local(folders["llama2"], "m2"),
                {"name": "gpt", "generator": {"kind": "file", "model": str(shared_data(Q100))}}])
    out = tmp_path / "exp"
    per_model = scores(out, "models")
    assert set(data["columns"]) == {"bleu", "bleu_rot", "rouge_l", "rouge_l_rot", "bertscore", "bertscore_rot",
                                    "sage_answer", "sage_rot"}
    for name in ("m1", "m2", "gpt"):
        for key in data["columns"]:
            assert_interval(data["models"][name][key], per_model[name]["per_question"][key])
    assert [(c["a"], c["b"]) for c in data["comparisons"]] == [("m1", "m2"), ("m1", "gpt"), ("m2", "gpt")]
    gpt, m1 = per_model["gpt"]["per_question"], per_model["m1"]["per_question"]
    diff = [a - b for a, b in zip(m1["sage_answer"], gpt["sage_answer"]) if a is not None and b is not None]
    assert_interval(data["comparisons"][1]["sage_answer"], diff)
    assert "| m1 − gpt |" in (out / "table1.md").read_text()
    bars = {s["label"]: s for s in drawn(out, "table1")["Consistency per model"]}
    for name, bar in bars.items():
        shown = [data["models"][name][k] for k in data["columns"] if data["models"][name][k]["low"] is not None]
        assert bar["y"] == pytest.approx([s["mean"] for s in shown])
        assert bar["low"] == pytest.approx([s["low"] for s in shown])
        assert bar["high"] == pytest.approx([s["high"] for s in shown])


@pytest.mark.reference
def test_temperature_on_the_recorded_gpt35_answers(tmp_path, embedder, folders):
    cfg, data = experiment(tmp_path, embedder, kind="temperature", run={
        "questions": str(shared_data("sage-temperature/q100_gpt_3.5_t_0.0.csv")), "limit": 4, "quiet": True,
        "score": {"embedder": folders["bert"], "bertscore": False}}, temperature={
        "temperatures": [0.0, 1.5], "settings": ["same"], "model": {"name": "gpt", "chat": True, "generator": {
            "kind": "file", "model": str(shared_data("sage-temperature")) + "/q100_gpt_3.5_t_{temperature}.csv",
            "prompt_column": "question"}}})
    from sage_jax.lexical import rouge_l_consistency

    out = tmp_path / "exp"
    per_model = scores(out, "same")
    for t in ("0.0", "1.5"):
        with open(shared_data(f"sage-temperature/q100_gpt_3.5_t_{t}.csv"), newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        pq = per_model[f"t{t}"]["per_question"]
        answers = [[r["model_output"] for r in rows if r["question_id"] == q] for q in pq["question_id"]]
        assert [len(a) for a in answers] == [5] * 4
        assert pq["rouge_l"] == pytest.approx(list(rouge_l_consistency(answers)), abs=1e-12)
        for key in ("sage_answer", "rouge_l"):
            assert_interval(data["settings"]["same"][t][key], pq[key])
    lines = {s["label"]: s for s in drawn(out, "temperature")["Consistency against temperature"]}
    assert set(lines) == {"SaGE (same question)", "ROUGE-L (same question)"}
    assert all(line["linestyle"] == "--" and line["x"] == [0.0, 1.5] for line in lines.values())
    assert lines["SaGE (same question)"]["y"] == pytest.approx(
        [data["settings"]["same"][t]["sage_answer"]["mean"] for t in ("0.0", "1.5")])
    # The README shows the figure of the whole recorded set.
    readme = (REPO_ROOT / "README.md").read_text()
    assert "docs/figures/sage_temperature_gpt35.png" in readme
    assert (REPO_ROOT / "docs/figures/sage_temperature_gpt35.png").stat().st_size > 10_000


@pytest.mark.slow  # a tiny LLM at two temperatures in two settings: its generate and the scoring compiles
def test_temperature_on_a_tiny_llm_both_settings(tmp_path, embedder, folders):
    model = local(folders["llama1"], "llama")
    cfg, data = experiment(tmp_path, embedder, kind="temperature", run={
        "questions": str(shared_data(Q100)), "limit": 2, "quiet": True, "answer": {"max_attempts": 2},
        "score": {"embedder": folders["bert"], "bertscore": False}},
        temperature={"temperatures": [0.0, 1.0], "model": model})
    out = tmp_path / "exp"
    same = scores(out, "same")["t0.0"]["per_question"]
    answered = out / "runs/same/stages/answer/t0.0/p0of1/rows.jsonl"
    rows = [json.loads(line) for line in answered.read_text().splitlines()]
    for q in same["question_id"]:  # greedy decoding of one prompt five times: five equal answers
        answers = {r["answer"] for r in rows if r["question_id"] == q and r["status"] == "ok"}
        assert len(answers) <= 1
    lines = {s["label"]: s for s in drawn(out, "temperature")["Consistency against temperature"]}
    assert {lines[k]["linestyle"] for k in lines if "paraphrased" in k} == {"-"}
    assert {lines[k]["linestyle"] for k in lines if "same question" in k} == {"--"}
    for setting, label in (("paraphrase", "paraphrased"), ("same", "same question")):
        assert lines[f"ROUGE-L ({label})"]["y"] == pytest.approx(
            [data["settings"][setting][t]["rouge_l"]["mean"] for t in ("0.0", "1.0")], nan_ok=True)


@pytest.mark.reference
def test_rot_prompt_table4(tmp_path, embedder, folders):
    rows = q100_rows(3)
    path = tmp_path / "imp.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["question_id", "question", "imp_rot", "paraphrased", "score"])
        writer.writeheader()
        first_rot = {}
        for r in rows:
            first_rot.setdefault(r["question_id"], r["rot"])
            writer.writerow({"question_id": r["question_id"], "question": r["question"],
                             "imp_rot": first_rot[r["question_id"]], "paraphrased": r["paraphrased"],
                             "score": r["score"]})
    cfg, data = experiment(tmp_path, embedder, kind="rot_prompt", run={
        "questions": str(path), "quiet": True, "answer": {"max_attempts": 2},
        "score": {"embedder": folders["bert"], "bertscore_model": folders["bert"]}},
        models=[local(folders["llama1"], "llama")])
    out = tmp_path / "exp"
    for target, guided in (("llama", False), ("llama-rot", True)):
        answered = [json.loads(x) for x in
                    (out / f"runs/rot_prompt/stages/answer/{target}/p0of1/rows.jsonl").read_text().splitlines()]
        assert len(answered) == 15
        for r in answered:
            assert (f"# Rule of Thumb\n{first_rot[r['question_id']]}\n" in r["prompt"]) == guided
    per_model = scores(out, "rot_prompt")
    before, after = per_model["llama"]["per_question"], per_model["llama-rot"]["per_question"]
    for key in ("sage_answer", "bleu", "rouge_l", "bertscore"):
        assert_interval(data["metrics"][key]["before"], before[key])
        assert_interval(data["metrics"][key]["after"], after[key])
        d = [a - b for a, b in zip(after[key], before[key]) if a is not None and b is not None]
        assert_interval(data["metrics"][key]["difference"], d)
    bars = {s["label"]: s for s in drawn(out, "table4")["Rules of thumb in the prompt"]}
    assert set(bars) <= {"without RoT", "with RoT"}


@pytest.mark.reference
def test_agreement_table2_against_people(tmp_path, embedder, folders):
    require("scipy")
    require("krippendorff")
    import krippendorff
    import scipy.stats

    rows = q100_rows(6)
    rng = np.random.default_rng(5)
    labels_path = tmp_path / "labels.csv"
    with open(labels_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["question_id", "question", "model_output_1", "model_output_2", "r1", "r2", "r3"])
        for q in dict.fromkeys(r["question_id"] for r in rows):
            answers = [r["model_output"] for r in rows if r["question_id"] == q]
            agree = rng.random()  # each question its own share of "Y"
            for i in range(5):
                for j in range(i + 1, 5):
                    writer.writerow([q, "", answers[i], answers[j],
                                     *rng.choice(["Y", "N", "NA"], 3, p=[0.8 * agree, 0.8 * (1 - agree), 0.2])])
    cfg, data = experiment(tmp_path, embedder, kind="agreement", run={
        "questions": str(shared_data(Q100)), "limit": 6, "quiet": True,
        "rot": {"generator": {"kind": "file", "model": str(shared_data(Q100)), "column": "rot"}},
        "score": {"embedder": folders["bert"], "bertscore_model": folders["bert"]}},
        models=[{"name": "gpt", "generator": {"kind": "file", "model": str(shared_data(Q100))}}],
        agreement={"labels": str(labels_path), "answer_columns": ["question", "model_output_1", "model_output_2"]})
    with open(labels_path, newline="") as f:
        table = list(csv.DictReader(f))
    matrix = np.array([[{"Y": 1.0, "N": 0.0}.get(r[k], np.nan) for r in table] for k in ("r1", "r2", "r3")])
    assert data["raters"] == ["r1", "r2", "r3"]
    assert data["krippendorff_alpha"] == pytest.approx(
        krippendorff.alpha(reliability_data=matrix, level_of_measurement="nominal"), abs=1e-12)
    for q, h in data["entropy"].items():
        mine = matrix[:, [i for i, r in enumerate(table) if r["question_id"] == q]]
        counts = [np.sum(mine == 1), np.sum(mine == 0)]
        assert h == pytest.approx(scipy.stats.entropy(counts, base=2), abs=1e-12)
    pq = scores(tmp_path / "exp", "agreement")["gpt"]["per_question"]
    entropy = [data["entropy"][q] for q in pq["question_id"]]
    for key in ("sage_answer", "sage_rot", "bleu", "rouge_l", "bertscore"):
        x = np.array(pq[key], np.float64)
        got = data["correlations"][key]["pearson"]
        assert got["r"] == pytest.approx(scipy.stats.pearsonr(x, entropy).statistic, abs=1e-12)
        ref = scipy.stats.bootstrap((x, np.array(entropy)), lambda a, b, axis=-1: scipy.stats.pearsonr(
            a, b, axis=axis).statistic, paired=True, n_resamples=999, method="BCa", confidence_level=0.9,
            rng=np.random.default_rng(3)).confidence_interval
        assert (got["low"], got["high"]) == pytest.approx((ref.low, ref.high), abs=1e-12)


def test_score_equals_sage_jax_run_with_the_callables_answers_in_a_file(tmp_path, embedder):
    import sage_jax
    from sage_jax.experiments.consistency import run_and_score
    from sage_jax.run.config import (GeneratorConfig, ParaphraseConfig, SageRunConfig, ScoreConfig,
                                     StageConfig, TargetConfig)

    rows = q100_rows(3)
    questions = list(dict.fromkeys(r["question"] for r in rows))
    paraphrases = {q: [r["paraphrased"] for r in rows if r["question"] == q] for q in questions}
    answer_of = {r["paraphrased"]: r["model_output"] for r in rows}
    rot_of = {r["model_output"]: r["rot"] for r in rows}
    calls: dict = {}

    def get_response(question: str) -> str:
        calls[question] = calls.get(question, 0) + 1
        if calls[question] == 1:
            raise TimeoutError("the endpoint timed out")  # every first call fails: retried
        return answer_of[question]

    def rot_writer(prompt: str) -> str:
        return next(rot for answer, rot in rot_of.items() if f"Answer: {answer}\n" in prompt)

    result = sage_jax.score_details(questions, get_response, use_rots=True, out=tmp_path / "lib",
                                    paraphrases=paraphrases, rot_writer=rot_writer, embedder_model=embedder,
                                    sleep=lambda s: None)
    assert all(n == 2 for n in calls.values()) and len(calls) == 15
    recorded = SageRunConfig(
        questions=str(shared_data(Q100)), out=str(tmp_path / "run"), limit=3, quiet=True,
        paraphrase=ParaphraseConfig(source="file"),
        models=(TargetConfig(name="m", generator=GeneratorConfig(
            kind="file", model=str(shared_data(Q100)))),),
        rot=StageConfig(generator=GeneratorConfig(kind="file", model=str(shared_data(Q100)),
                                                                        column="rot")),
        score=ScoreConfig(bertscore=False, lexical=False))
    pq = run_and_score(recorded, embedder=embedder)["m"]
    by_text = {next(r["question"] for r in rows if r["question_id"] == q): s
               for q, s in zip(pq["question_id"], pq["sage_blend"])}
    assert [r["sage"] for r in result.per_question] == pytest.approx([by_text[q] for q in questions], abs=1e-12)
    assert result.mean == pytest.approx(np.mean([by_text[q] for q in questions]), abs=1e-12)


@pytest.mark.e2e
def test_bad_configs_are_one_line_errors_before_any_work(tmp_path, capsys):
    from sage_jax import cli

    bad = [("kind: models\nout: o\nrun: {questions: q.csv}\nmodels: [{name: a, generator: {kind: file, model: x}}]\n"
            "benchmarks: [{file: b}]\n", "benchmarks: kind models does not use this section"),
           ("kind: accuracy\nout: o\nrun: {questions: q.csv}\nbenchmarks: [{file: b}]\n"
            "models: [{name: a, generator: {kind: local, model: x}}, {name: b, generator: {kind: openai, model: m, "
            "base_url: 'http://x'}}]\n", "models[1].generator.kind: accuracy scores each choice's log-likelihood"),
           ("kind: temperature\nout: o\nrun: {questions: q.csv}\ntemperature: {temperatures: [0.1, 1.0], model: "
            "{name: a, generator: {kind: file, model: t.csv}}}\n", "needs {temperature} in its path"),
           (f"kind: models\nout: {tmp_path}/o\nrun: {{questions: {tmp_path}/missing.csv}}\n"
            "models: [{name: a, generator: {kind: file, model: x}}]\n", "run.questions: data file not found")]
    for i, (text, message) in enumerate(bad):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(text)
        assert cli.main(["experiment", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("sage-jax: error:") and message in err and "\n" not in err, err
    assert not (tmp_path / "o").exists()


def test_the_usage_page_shows_the_corpus_plan_as_launch_sage_plan_computes_it():
    import importlib.util

    root = REPO_ROOT
    spec = importlib.util.spec_from_file_location("sage_plan", root / "launch" / "sage_plan.py")
    plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    result = plan.plan()
    for h in result.values():  # each stage's hours are positive and add up to the total
        assert all(v > 0 for v in h["hours"].values())
        assert sum(h["hours"].values()) == pytest.approx(h["total_hours"])
    assert result["1 x H100"]["total_hours"] < result["CPU host"]["total_hours"]
    doc = (root / "docs" / "usage.md").read_text()
    shown = plan.doc_block(doc)
    assert plan.doc_with(doc, shown) == doc  # what --docs writes puts it back in place
    assert shown.strip() == (plan.markdown(result) + "\n\n" + plan.assumptions()).strip(), (
        "docs/usage.md's corpus plan is stale (benchmarks/results changed): run python launch/sage_plan.py --docs")
