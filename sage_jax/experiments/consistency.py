"""The consistency experiments: across models (the SaGE paper's Table 1), against the sampling
temperature (its Figure 3) and with a rule of thumb in the prompt (its Table 4, the reference's
`scripts/improve.py`). Each is one or more `sage-jax run`s (sage_jax.run.pipeline) under the
experiment's folder, `runs/<name>/`, and a report from their per-question scores: every mean with
its bootstrap interval over the questions, and paired differences over the questions two runs
share (sage_jax.experiments.stats).
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import io
import itertools
import json
from pathlib import Path

from clarifyjax.config.loader import ConfigError
from clarifyjax.files.tables import DataError, read_rows, resolve_data_path, text_cell
from sage_jax.experiments import output, stats
from sage_jax.experiments.config import ExperimentConfig
from sage_jax.run.config import SageRunConfig, TargetConfig
from sage_jax.run import pipeline
from sage_jax.run.questions import read_source_questions

# Table 1's columns: the per-question score -> its label (the paper's BLEU, ROUGE, BERTScore and
# SaGE, each on the answers and on the rules of thumb).
TABLE1 = {"bleu": "BLEU (answers)", "bleu_rot": "BLEU (RoTs)", "rouge_l": "ROUGE-L (answers)",
          "rouge_l_rot": "ROUGE-L (RoTs)", "bertscore": "BERTScore (answers)", "bertscore_rot": "BERTScore (RoTs)",
          "sage_answer": "SaGE (answers)", "sage_rot": "SaGE (RoTs)"}
# Table 4's four numbers.
TABLE4 = {"sage_answer": "SaGE", "bleu": "BLEU", "rouge_l": "ROUGE-L", "bertscore": "BERTScore"}


def settings(cfg: ExperimentConfig) -> dict:
    return dataclasses.asdict(cfg.bootstrap)


# The keys of a `sage-jax run` config as the experiment's config spells them: an error of a run
# names the key the user wrote (run.score.embedder, not score.embedder).
RUN_KEYS = (("questions:", "run.questions:"), ("paraphrase.", "run.paraphrase."), ("answer.", "run.answer."),
            ("rot.", "run.rot."), ("score.", "run.score."))


def renamed(error: ValueError, renames) -> ValueError:
    """`error` with its leading key as the experiment's config names it (`renames`: (run key,
    experiment key) prefixes)."""
    message = str(error)
    for old, new in renames:
        if message.startswith(old):
            return type(error)(new + message[len(old):])
    return error


def run_renames(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """The run's keys the experiment spells otherwise: a temperature's model is temperature.model,
    rot_prompt's guided copy models[1] is models[0]."""
    if cfg.kind == "temperature":
        return [(f"models[{i}].", "temperature.model.") for i in range(len(cfg.temperature.temperatures))]
    if cfg.kind == "rot_prompt":
        return [("models[1].", "models[0].")]
    return []


def checked_run(run_cfg: SageRunConfig, questions_file: bytes | None = None, *, renames=(), embedder=None,
                generators=None) -> pipeline.Run:
    """One `sage-jax run` of an experiment, its inputs and what its folder holds checked
    (`Run.check`), so that the experiment can check all its runs before it writes anything;
    `questions_file`: the bytes of a questions file the experiment derives, written by the run. An
    error names the key as the experiment's config spells it (`renames`, then `RUN_KEYS`)."""
    try:
        run = pipeline.Run(run_cfg, embedder=embedder, generators=generators, questions_file=questions_file)
        run.check(pipeline.STAGES)
    except ValueError as e:
        raise renamed(e, (*renames, *RUN_KEYS)) from None
    return run


def scored(run: pipeline.Run) -> dict[str, dict]:
    """A checked run's every stage (a finished one is reused), then each model's per-question
    columns (`report/scores.json`; None for a model with no answered row)."""
    run.run(pipeline.STAGES)
    scores = json.loads((run.out / "report" / "scores.json").read_text())
    return {name: entry["per_question"] for name, entry in scores["models"].items()}


def run_and_score(run_cfg: SageRunConfig, **given) -> dict[str, dict]:
    """`scored` of the run `run_cfg` names (`given`: embedder, generators)."""
    return scored(checked_run(run_cfg, **given))


def _column(per_question: dict | None, key: str) -> list[float]:
    if not per_question or key not in per_question:
        return []
    return [float("nan") if v is None else v for v in per_question[key]]


def _by_question(per_question: dict | None, key: str) -> dict[str, float]:
    return dict(zip(per_question["question_id"], _column(per_question, key))) if per_question else {}


def paired(a: dict | None, b: dict | None, key: str, boot: dict) -> dict:
    """mean(a - b) of `key` over the questions both scored, with its interval."""
    x, y = _by_question(a, key), _by_question(b, key)
    shared = [q for q in x if q in y]
    return stats.paired_difference([x[q] for q in shared], [y[q] for q in shared], **boot)


def used_columns(columns: dict, per_model: dict) -> dict:
    """The columns some model scored (no RoTs: no RoT columns)."""
    return {k: v for k, v in columns.items() if any(
        pq and any(x is not None for x in pq.get(k, [])) for pq in per_model.values())}


def models_runs(cfg: ExperimentConfig, out: Path) -> dict[str, tuple]:
    """The runs of an experiment: name -> (its config, the bytes of its derived questions file or None)."""
    return {"models": (cfg.run.build(out / "runs" / "models", cfg.models), None)}


def models_experiment(cfg: ExperimentConfig, out: Path, runs: dict[str, pipeline.Run]) -> dict:
    """Table 1 with intervals, and the paired comparisons of `pairs` (every pair when empty)."""
    per_model = scored(runs["models"])
    boot = settings(cfg)
    columns = used_columns(TABLE1, per_model)
    table = {name: {k: stats.mean_interval(_column(pq, k), **boot) for k in columns} for name, pq in per_model.items()}
    pairs = [tuple(p.split(":")) for p in cfg.pairs] or list(itertools.combinations([m.name for m in cfg.models], 2))
    comparisons = [{"a": a, "b": b, **{k: paired(per_model[a], per_model[b], k, boot) for k in columns}}
                   for a, b in pairs]
    rows = [[name, *(output.with_interval(table[name][k]) for k in columns)] for name in table]
    rows += [[f"{c['a']} − {c['b']}", *(output.with_interval(c[k]) for k in columns)] for c in comparisons]
    data = {"columns": columns, "models": table, "comparisons": comparisons, "bootstrap": boot}
    output.write_table(out, "table1", ["model", *columns.values()], rows, data, notes=[
        f"Each mean over the questions with its {cfg.bootstrap.confidence:.0%} bootstrap interval "
        f"({cfg.bootstrap.method}, {cfg.bootstrap.resamples} resamples, seed {cfg.bootstrap.seed}); a row a − b is "
        "the mean paired difference over the questions both models answered: an interval that excludes 0 says "
        "which model is more consistent."])
    fig, (ax,) = output.figure(width=7.0)
    for j, name in enumerate(table):
        output.interval_points(ax, list(columns.values()), [table[name][k] for k in columns], label=name,
                               offset=0.1 * (j - (len(table) - 1) / 2))
    ax.set_title("Consistency per model")
    ax.legend(fontsize=7)
    output.save_figure(fig, out, "table1")
    return data


def source_questions(cfg: ExperimentConfig) -> list:
    """run.questions' questions (its first `limit`), without their paraphrases."""
    return read_source_questions(cfg.run.build(Path(cfg.out) / "runs" / "unused", [TargetConfig(name="x")],
                                               paraphrase=dataclasses.replace(cfg.run.paraphrase, source="generate")))


def check_recorded_repeats(cfg: ExperimentConfig) -> None:
    """The `same` setting asks each question `repeats` times (each `answer.samples` answers): a
    recorded file must hold that many answers to each, or the run would serve them again."""
    t = cfg.temperature
    if "same" not in t.settings or t.model.generator.kind != "file":
        return
    need = t.repeats * cfg.run.answer.samples
    questions = source_questions(cfg)
    for target in temperature_targets(cfg):
        column = target.generator.prompt_column
        path = resolve_data_path(target.generator.model, "temperature.model.generator.model")
        header, rows = read_rows(path)
        if column not in header:
            raise DataError(f"temperature.model.generator.prompt_column: {path} has no column {column!r} (it has: "
                            f"{', '.join(header)})")
        counts = collections.Counter(text_cell(row, column, f"{path}:{line}").strip() for line, row in rows)
        fewest = min(questions, key=lambda q: counts[q.question])
        have = counts[fewest.question]
        if have < need:
            asked = f"{t.repeats} x answer.samples {cfg.run.answer.samples}" if need != t.repeats else str(need)
            raise ConfigError(f"temperature.repeats: {t.repeats} asks each question {asked} times, but {path} "
                              f"records {have} answers to question {fewest.question_id} ({fewest.question[:60]!r}); "
                              f"at most {have // cfg.run.answer.samples} without reusing recorded answers",
                              key="temperature.repeats")


def same_question_csv(cfg: ExperimentConfig) -> bytes:
    """The questions file of the `same` setting: each question as its own `repeats` paraphrases."""
    source = source_questions(cfg)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["question_id", "question", "paraphrased", "score"])
    for q in source:
        writer.writerows([q.question_id, q.question, q.question, 1.0] for _ in range(cfg.temperature.repeats))
    return buf.getvalue().encode()


def temperature_targets(cfg: ExperimentConfig) -> list[TargetConfig]:
    """The model at each temperature, `t<T>` (a recorded generator reads the file of that T)."""
    model = cfg.temperature.model
    targets = []
    for t in cfg.temperature.temperatures:
        path = model.generator.model.replace("{temperature}", str(float(t)))
        generator = dataclasses.replace(model.generator, model=path)
        sampling = model.sampling if generator.kind == "file" else dataclasses.replace(model.sampling, temperature=t)
        targets.append(dataclasses.replace(model, name=f"t{float(t)}", generator=generator, sampling=sampling))
    return targets


def temperature_runs(cfg: ExperimentConfig, out: Path) -> dict[str, tuple]:
    """One run per setting: `same` asks each question itself (same_question.csv), `paraphrase`
    its paraphrases."""
    targets, runs = temperature_targets(cfg), {}
    for setting in cfg.temperature.settings:
        if setting == "same":
            paraphrase = dataclasses.replace(cfg.run.paraphrase, source="file", paraphrase_column="paraphrased")
            runs[setting] = (cfg.run.build(out / "runs" / "same", targets, questions=str(out / "same_question.csv"),
                                           question_id_column="question_id", question_column="question",
                                           paraphrase=paraphrase), same_question_csv(cfg))
        else:
            runs[setting] = (cfg.run.build(out / "runs" / "paraphrase", targets), None)
    return runs


def temperature_experiment(cfg: ExperimentConfig, out: Path, runs: dict[str, pipeline.Run]) -> dict:
    """Figure 3: SaGE and ROUGE-L per temperature, with paraphrases and with the same question."""
    boot, targets = settings(cfg), temperature_targets(cfg)
    results = {}
    for setting in cfg.temperature.settings:
        per_model = scored(runs[setting])
        results[setting] = {str(float(t)): {k: stats.mean_interval(_column(per_model[target.name], k), **boot)
                                            for k in ("sage_answer", "rouge_l")}
                            for t, target in zip(cfg.temperature.temperatures, targets)}
    rows = [[setting, t, output.with_interval(v["sage_answer"]), output.with_interval(v["rouge_l"]),
             v["sage_answer"]["n"]] for setting, by_t in results.items() for t, v in by_t.items()]
    data = {"temperatures": [float(t) for t in cfg.temperature.temperatures], "settings": results, "bootstrap": boot}
    output.write_table(out, "temperature", ["setting", "temperature", "SaGE (answers)", "ROUGE-L (answers)",
                                            "questions"], rows, data, notes=[
        "paraphrase: each question's paraphrases, one answer each; same: the question itself asked "
        f"{cfg.temperature.repeats} times. Means over the questions with bootstrap intervals."])
    fig, (ax,) = output.figure(width=6.0)
    style = {"paraphrase": "-", "same": "--"}
    for setting, by_t in results.items():
        for key, label, color in (("sage_answer", "SaGE", "C0"), ("rouge_l", "ROUGE-L", "C1")):
            ax.plot(data["temperatures"], [v[key]["mean"] for v in by_t.values()], style[setting], color=color,
                    marker="o", label=f"{label} ({'paraphrased' if setting == 'paraphrase' else 'same question'})")
    ax.set_xlabel("temperature")
    ax.set_ylabel("consistency")
    ax.set_title("Consistency against temperature")
    ax.legend(fontsize=7)
    output.save_figure(fig, out, "temperature")
    return data


def guided_model(cfg: ExperimentConfig) -> TargetConfig:
    model = cfg.models[0]
    return dataclasses.replace(model, name=f"{model.name}-rot", guided=True)


def rot_prompt_runs(cfg: ExperimentConfig, out: Path) -> dict[str, tuple]:
    return {"rot_prompt": (cfg.run.build(out / "runs" / "rot_prompt", [cfg.models[0], guided_model(cfg)],
                                         guide_column=cfg.guide_column), None)}


def rot_prompt_experiment(cfg: ExperimentConfig, out: Path, runs: dict[str, pipeline.Run]) -> dict:
    """Table 4: the model without and with its question's rule of thumb in the prompt (the same
    paraphrases), each metric's mean before and after and their paired difference."""
    model, guided = cfg.models[0], guided_model(cfg)
    per_model = scored(runs["rot_prompt"])
    boot = settings(cfg)
    before, after = per_model[model.name], per_model[guided.name]
    data = {"bootstrap": boot, "metrics": {k: {
        "before": stats.mean_interval(_column(before, k), **boot),
        "after": stats.mean_interval(_column(after, k), **boot),
        "difference": paired(after, before, k, boot)} for k in TABLE4}}
    rows = [[label, *(output.with_interval(data["metrics"][k][w]) for w in ("before", "after", "difference"))]
            for k, label in TABLE4.items()]
    output.write_table(out, "table4", ["metric", "without RoT", "with RoT", "difference (paired)"], rows, data, notes=[
        f"{model.name}, prompted with scripts/improve.py's rule-of-thumb prompt (column {cfg.guide_column!r}) and "
        "without it, on the same paraphrases."])
    fig, (ax,) = output.figure(width=6.0)
    for j, when in enumerate(("before", "after")):
        output.interval_points(ax, list(TABLE4.values()), [data["metrics"][k][when] for k in TABLE4],
                               label="without RoT" if when == "before" else "with RoT", offset=0.15 * (2 * j - 1))
    ax.set_title("Rules of thumb in the prompt")
    ax.legend(fontsize=7)
    output.save_figure(fig, out, "table4")
    return data
