"""The experiments that check SaGE against something else: task accuracy (the SaGE paper's Table 3
and Figure 4, `accuracy_experiment`) and human judgments (its Table 2, `agreement_experiment`);
what each computes is written above it."""
from __future__ import annotations

from pathlib import Path
import csv
import io

import numpy as np

from clarifyjax.files.tables import DataError, read_rows, resolve_data_path, text_cell
from sage_jax.experiments import benchmarks, output, stats
from sage_jax.experiments.config import BenchmarkConfig, ExperimentConfig
from sage_jax.experiments.consistency import TABLE1, scored, settings, used_columns
from sage_jax.experiments.multiple_choice import ChoiceScorer, evaluate_choices
from sage_jax.run.pipeline import Run
from sage_jax.run.questions import read_source_questions

TASK_METRICS = {"truthfulqa_mc1": ("mc1",), "truthfulqa_mc2": ("mc2",), "hellaswag": ("acc", "acc_norm")}
LABELS = {"y": 1.0, "yes": 1.0, "n": 0.0, "no": 0.0, "na": None, "n/a": None, "": None}


def benchmark_name(b: BenchmarkConfig) -> str:
    return f"{b.task}_{b.shots}shot"


def benchmark_docs(b: BenchmarkConfig) -> tuple[list, list[str]]:
    """The benchmark's sampled documents and their contexts."""
    path = resolve_data_path(b.file, "benchmarks.file")
    docs = benchmarks.load_docs(b.task, path, b.format)
    chosen = benchmarks.sample_docs(docs, b.sample, b.seed)
    pool = benchmarks.load_docs(b.task, resolve_data_path(b.fewshot_file, "benchmarks.fewshot_file")) \
        if b.fewshot_file else docs
    return chosen, benchmarks.contexts(chosen, b.shots, pool, b.fewshot_seed)


def accuracies(cfg: ExperimentConfig, out: Path) -> dict:
    """model -> benchmark -> metric -> mean with interval over the documents; the per-document
    log-likelihoods go to `accuracy/<model>/<benchmark>.json`."""
    boot, docs = settings(cfg), {benchmark_name(b): benchmark_docs(b) for b in cfg.benchmarks}
    result = {}
    for model in cfg.models:
        result[model.name] = {}
        scorers: dict = {}
        for b in cfg.benchmarks:
            key = (b.max_length, b.batch_size)
            if key not in scorers:  # the weights loaded once per model, whatever the settings
                first = next(iter(scorers.values()), None)
                scorers[key] = first.sharing(b.max_length, b.batch_size) if first else ChoiceScorer(
                    model.generator.model, dtype=model.generator.dtype, max_length=b.max_length,
                    batch_size=b.batch_size)
            name = benchmark_name(b)
            per_doc = evaluate_choices(scorers[key], b.task, *docs[name])
            output.write_json(out / "accuracy" / model.name / f"{name}.json", {"task": b.task, "docs": per_doc})
            result[model.name][name] = {m: stats.mean_interval([d[m] for d in per_doc], **boot)
                                        for m in TASK_METRICS[b.task]}
    return result


def accuracy_runs(cfg: ExperimentConfig, out: Path) -> dict[str, tuple]:
    """The SaGE run on run.questions, or on the first benchmark's questions (question_id, question;
    out/sage_questions.csv, written by the run) for it to paraphrase."""
    folder = out / "runs" / "accuracy"
    if cfg.run.questions.strip():
        return {"accuracy": (cfg.run.build(folder, cfg.models), None)}
    chosen, _ = benchmark_docs(cfg.benchmarks[0])
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["question_id", "question"])
    writer.writerows([d.doc_id, d.question] for d in chosen)
    run_cfg = cfg.run.build(folder, cfg.models, questions=str(out / "sage_questions.csv"))
    return {"accuracy": (run_cfg, buf.getvalue().encode())}


def agreement_runs(cfg: ExperimentConfig, out: Path) -> dict[str, tuple]:
    return {"agreement": (cfg.run.build(out / "runs" / "agreement", cfg.models), None)}


# Each model's multiple-choice accuracy on each benchmark, its SaGE on paraphrases of questions (one
# `sage-jax run` of every model), and across the models the Pearson and Spearman correlations of
# SaGE with each accuracy, with bootstrap intervals over the models.
def accuracy_experiment(cfg: ExperimentConfig, out: Path, runs: dict[str, Run]) -> dict:
    boot = settings(cfg)
    acc = accuracies(cfg, out)
    if not cfg.run.questions.strip():
        output.write_json(out / "sage_questions.json", {"benchmark": benchmark_name(cfg.benchmarks[0])})
    per_model = scored(runs["accuracy"])
    sage = {name: stats.mean_interval([np.nan if v is None else v for v in pq["sage_answer"]] if pq else [], **boot)
            for name, pq in per_model.items()}
    columns = [(b, m) for b in acc[cfg.models[0].name] for m in acc[cfg.models[0].name][b]]
    x = [sage[m.name]["mean"] for m in cfg.models]
    correlations = {}
    for b, m in columns:
        y = [acc[model.name][b][m]["mean"] for model in cfg.models]
        x_ = [np.nan if v is None else v for v in x]
        correlations[f"{b}/{m}"] = {kind: stats.correlation(x_, y, kind, **boot) for kind in ("pearson", "spearman")}
    rows = [[name, output.with_interval(sage[name]), *(output.with_interval(acc[name][b][m]) for b, m in columns)]
            for name in acc]
    notes = [f"- SaGE against {key}: Pearson {output.with_interval(c['pearson'])}, Spearman "
             f"{output.with_interval(c['spearman'])} over {c['pearson']['n']} models"
             for key, c in correlations.items()]
    data = {"sage": sage, "accuracy": acc, "correlations": correlations, "bootstrap": boot}
    output.write_table(out, "table3", ["model", "SaGE (answers)", *(f"{b} {m}" for b, m in columns)], rows, data,
                       notes=["Accuracy as lm-evaluation-harness 0.4.13 computes it; means over the documents (the "
                              "questions for SaGE) with bootstrap intervals; correlations across the models:", *notes])
    fig, axes = output.figure(ncols=len(columns), width=4.0)
    for ax, (b, m) in zip(axes, columns):
        key = f"{b}/{m}"
        ax.scatter(x, [acc[name][b][m]["mean"] for name in acc], label="models")
        for name, xi in zip(acc, x):
            ax.annotate(name, (xi, acc[name][b][m]["mean"]), fontsize=7)
        ax.set_xlabel("SaGE")
        ax.set_ylabel(m)
        ax.set_title(f"{key}: r={output.shown(correlations[key]['pearson']['r'], 2)}")
    output.save_figure(fig, out, "figure4")
    return data


def read_labels(cfg: ExperimentConfig) -> tuple[list[str], np.ndarray, list[str]]:
    """(question id per row, [raters, rows] labels 1 / 0 / NaN, the rater columns)."""
    a = cfg.agreement
    path = resolve_data_path(a.labels, "agreement.labels")
    header, rows = read_rows(path)
    known = {a.question_id_column, *a.answer_columns}
    raters = list(a.raters) or [c for c in header if c not in known]
    missing = [c for c in [a.question_id_column, *raters] if c not in header]
    if missing or not raters:
        raise DataError(f"{path}: missing column {missing[0] if missing else '(no rater column)'!r} "
                        f"(the file has: {', '.join(header)})")
    ids, labels = [], []
    for line, row in rows:
        ids.append(text_cell(row, a.question_id_column, f"{path}:{line}").strip())
        if not ids[-1]:
            raise DataError(f"{path}:{line}: empty {a.question_id_column!r}")
        values = []
        for r in raters:
            cell = text_cell(row, r, f"{path}:{line}").strip().lower()
            if cell not in LABELS:
                raise DataError(f"{path}:{line}: column {r!r}: {row[r]!r} is not Y, N or NA")
            values.append(np.nan if LABELS[cell] is None else LABELS[cell])
        labels.append(values)
    return ids, np.array(labels, np.float64).T, raters


def check_labels(cfg: ExperimentConfig) -> None:
    """The labels file read whole, and its question ids against the run's questions: labels of no
    question the run scores would make a table of nothing."""
    ids, _, _ = read_labels(cfg)
    run_cfg = cfg.run.build(Path(cfg.out) / "runs" / "agreement", cfg.models)
    questions = [q.question_id for q in read_source_questions(run_cfg)]
    if not set(ids) & set(questions):
        limit = f", the first {cfg.run.limit} questions" if cfg.run.limit else ""
        raise DataError(f"agreement.labels: {cfg.agreement.labels}: no question id of its column "
                        f"{cfg.agreement.question_id_column!r} ({', '.join(list(dict.fromkeys(ids))[:3])}, ...) is a "
                        f"question of run.questions ({cfg.run.questions}{limit}: {', '.join(questions[:3])}, ...)")


# A file of pairwise human labels, one row per pair of answers to a question and one column per
# rater (Y: the two answers agree, N: they do not, NA: cannot tell; the paper's protocol). Per
# question, the entropy (bits) of its Y/N labels over all its pairs and raters; over all rows,
# Krippendorff's alpha (nominal) of the raters, NA missing; and the Pearson correlation, with its
# bootstrap interval over the questions, of each metric of the run with that entropy.
def agreement_experiment(cfg: ExperimentConfig, out: Path, runs: dict[str, Run]) -> dict:
    boot = settings(cfg)
    ids, labels, raters = read_labels(cfg)
    entropy = {}
    for q in dict.fromkeys(ids):
        mine = labels[:, [i for i, x in enumerate(ids) if x == q]]
        entropy[q] = stats.binary_entropy(int(np.sum(mine == 1)), int(np.sum(mine == 0)))
    alpha = stats.krippendorff_alpha(labels)
    per_model = scored(runs["agreement"])
    pq = per_model[cfg.models[0].name] or {"question_id": []}
    columns = used_columns(TABLE1, per_model)
    table = {}
    for key in columns:
        scores = dict(zip(pq["question_id"], [np.nan if v is None else v for v in pq[key]]))
        shared = [q for q in entropy if q in scores]
        table[key] = {kind: stats.correlation([scores[q] for q in shared], [entropy[q] for q in shared], kind, **boot)
                      for kind in ("pearson", "spearman")}
    rows = [[label, output.with_interval(table[k]["pearson"]), output.with_interval(table[k]["spearman"]),
             table[k]["pearson"]["n"]] for k, label in columns.items()]
    data = {"krippendorff_alpha": alpha, "raters": raters, "entropy": entropy, "correlations": table,
            "bootstrap": boot}
    output.write_table(out, "table2", ["metric", "Pearson r with entropy", "Spearman rho with entropy", "questions"],
                       rows, data, notes=[
        f"Entropy (bits) of each question's Y/N labels over its answer pairs and {len(raters)} raters; "
        f"Krippendorff's alpha (nominal) of the raters: {output.shown(alpha)}."])
    fig, (ax,) = output.figure(width=6.0)
    output.interval_points(ax, list(columns.values()), [dict(table[k]["pearson"], mean=table[k]["pearson"]["r"])
                                                        for k in columns], label="Pearson r")
    ax.set_title("Correlation with the entropy of human labels")
    ax.axhline(0.0, color="grey", linewidth=0.8, label="_zero")
    output.save_figure(fig, out, "table2")
    return data

