"""`sage-jax experiment`'s inputs, each refused in one line naming the key, file, row or field before
any model is loaded, where it used to give a silent result or a traceback: recorded answers fewer
than `temperature.repeats` (they were served again), HellaSwag `endings` given as a string (one
choice per character) and a label 1.5 (truncated to 1), bad TruthfulQA labels, two benchmarks of
one task (the second overwrote the first), a labels file of no question (a table of n/a, exit 0),
an `out` that is a file, and keys of the runs named as the experiment's config spells them.
"""
from __future__ import annotations

import csv
import json

import pytest

from clarifyjax.config.loader import ConfigError, build_root
from clarifyjax.files.tables import DataError
from sage_jax.experiments import benchmarks, command
from sage_jax.experiments.config import ExperimentConfig

ENDING = ["and waits.", "and eats it.", "then sings.", "and leaves."]


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def questions_file(tmp_path, n=2):
    return write_csv(tmp_path / "q.csv", ["question_id", "question", "paraphrased"],
                     [[f"q{i}", f"Is it right to do thing {i}?", f"Is thing {i} right?"] for i in range(n)])


def hellaswag(tmp_path, **row):
    base = {"ind": 0, "activity_label": "Baking", "ctx_a": "A woman bakes.", "ctx_b": "she", "endings": ENDING,
            "label": 1}
    path = tmp_path / "hs.jsonl"
    path.write_text(json.dumps({**base, **row}) + "\n")
    return path


def experiment(tmp_path, **raw):
    return build_root(ExperimentConfig, {"out": str(tmp_path / "exp"), **raw})


def temperature_experiment(tmp_path, answers_per_question: int, repeats: int):
    questions = questions_file(tmp_path)
    rows = [[f"q{i}", f"Is it right to do thing {i}?", f"answer {k}"] for i in range(2)
            for k in range(answers_per_question)]
    write_csv(tmp_path / "t_0.0.csv", ["question_id", "question", "model_output"], rows)
    return experiment(tmp_path, kind="temperature", run={"questions": str(questions)}, temperature={
        "temperatures": [0.0], "settings": ["same"], "repeats": repeats, "model": {
            "name": "gpt", "chat": True, "generator": {"kind": "file", "model": str(tmp_path / "t_{temperature}.csv"),
                                                      "prompt_column": "question"}}})


def test_repeats_above_the_recorded_answers_are_refused_naming_the_count(tmp_path):
    with pytest.raises(ConfigError, match=r"temperature.repeats: 6 asks each question 6 times, but .*t_0.0.csv "
                                          r"records 5 answers to question q0 .* at most 5"):
        command.check_experiment_inputs(temperature_experiment(tmp_path, answers_per_question=5, repeats=6))
    command.check_experiment_inputs(temperature_experiment(tmp_path, answers_per_question=5, repeats=5))


def test_hellaswag_endings_as_a_string_are_refused_naming_the_row_and_field(tmp_path):
    path = hellaswag(tmp_path, endings="and waits.")
    with pytest.raises(DataError, match=rf"{path}:1: field 'endings': must be a list of texts, got str"):
        benchmarks.load_docs("hellaswag", path)


def test_a_hellaswag_label_that_is_not_an_integer_is_refused(tmp_path):
    path = hellaswag(tmp_path, label=1.5)
    with pytest.raises(DataError, match=rf"{path}:1: field 'label': 1.5 is not an integer"):
        benchmarks.load_docs("hellaswag", path)
    assert benchmarks.load_docs("hellaswag", hellaswag(tmp_path, label=2.0))[0].gold == 2  # integral: read


def test_a_hellaswag_row_without_a_field_is_one_line_not_a_traceback(tmp_path):
    path = tmp_path / "hs.jsonl"
    good = {"activity_label": "Baking", "ctx_a": "A.", "ctx_b": "b", "endings": ENDING, "label": "0"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({k: v for k, v in good.items() if k != "ctx_b"}) + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: missing field 'ctx_b'"):
        benchmarks.load_docs("hellaswag", path)


def test_a_truthfulqa_label_that_is_not_0_or_1_is_refused(tmp_path):
    path = tmp_path / "mc.jsonl"
    targets = {"choices": ["Yes.", "No."], "labels": [1, 0]}
    path.write_text(json.dumps({"question": "Q?", "mc1_targets": targets,
                                "mc2_targets": {"choices": ["Yes.", "No."], "labels": [1, 0.5]}}) + "\n")
    with pytest.raises(DataError, match=r"mc.jsonl:1: field 'mc2_targets'.labels\[1\]: 0.5 is not an integer"):
        benchmarks.load_docs("truthfulqa_mc2", path)


def test_two_benchmarks_of_one_task_are_refused_naming_both(tmp_path):
    one = {"task": "hellaswag", "file": "a.jsonl"}
    with pytest.raises(ConfigError, match=r"benchmarks\[1\]: task hellaswag at 0 shots is benchmarks\[0\] too"):
        experiment(tmp_path, kind="accuracy", benchmarks=[one, {**one, "file": "b.jsonl"}], models=[
            {"name": n, "generator": {"kind": "local", "model": "m"}} for n in ("a", "b")])


def test_a_labels_file_of_no_question_is_an_error_with_exit_status_2(tmp_path, capsys):
    from sage_jax import cli

    questions = questions_file(tmp_path)
    labels = write_csv(tmp_path / "labels.csv", ["question_id", "model_output_1", "model_output_2", "r1"],
                       [["other", "a", "b", "Y"]])
    config = tmp_path / "exp.yaml"
    config.write_text(json.dumps({"kind": "agreement", "out": str(tmp_path / "exp"), "run": {
        "questions": str(questions)}, "agreement": {"labels": str(labels)},
        "models": [{"name": "m", "generator": {"kind": "file", "model": str(questions)}}]}))
    assert cli.main(["experiment", str(config)]) == 2
    err = capsys.readouterr().err
    assert "agreement.labels:" in err and "no question id of its column 'question_id' (other, ...)" in err
    assert err.count("\n") == 1 and not (tmp_path / "exp").exists()


def test_an_out_that_is_a_file_is_refused_naming_out(tmp_path, capsys):
    from sage_jax import cli

    (tmp_path / "exp").write_text("not a folder")
    config = tmp_path / "exp.yaml"
    config.write_text(json.dumps({"kind": "models", "out": str(tmp_path / "exp"), "run": {
        "questions": str(questions_file(tmp_path))},
        "models": [{"name": "m", "generator": {"kind": "file", "model": str(tmp_path / "q.csv")}}]}))
    assert cli.main(["experiment", str(config)]) == 2
    assert f"out {tmp_path / 'exp'}: is a file" in capsys.readouterr().err


def test_the_temperature_model_is_named_as_the_config_writes_it(tmp_path):
    cfg = experiment(tmp_path, kind="temperature", run={"questions": str(questions_file(tmp_path))},
                     temperature={"temperatures": [0.0], "model": {
                         "name": "m", "generator": {"kind": "local", "model": str(tmp_path / "missing")}}})
    with pytest.raises(ConfigError, match=r"^temperature.model.generator.model: .*missing: no such folder"):
        command.check_experiment_inputs(cfg)


def test_a_run_key_is_named_with_its_run_prefix(tmp_path):
    from sage_jax.experiments.consistency import run_and_score

    answers = write_csv(tmp_path / "answers.csv", ["question_id", "paraphrased", "model_output"],
                        [[f"q{i}", f"Is thing {i} right?", "Yes."] for i in range(2)])  # read before the embedder
    cfg = experiment(tmp_path, kind="models", run={"questions": str(questions_file(tmp_path)),
                                                   "score": {"embedder": str(tmp_path / "no-embedder")}},
                     models=[{"name": "m", "generator": {"kind": "file", "model": str(answers)}}])
    with pytest.raises(ConfigError, match=r"^run.score.embedder: .*no-embedder is neither a folder"):
        run_and_score(cfg.run.build(tmp_path / "exp" / "runs" / "models", cfg.models))


def test_a_temperature_given_twice_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"temperature.temperatures: 0.5 is given twice"):
        experiment(tmp_path, kind="temperature", run={"questions": "q.csv"}, temperature={
            "temperatures": [0.5, 1.0, 0.5], "model": {"name": "m", "generator": {"kind": "local", "model": "x"}}})
