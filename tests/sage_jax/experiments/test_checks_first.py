"""Issue 37, class 5: an experiment reads every input before the first answer. Every model folder
(config.json, generation_config.json, the safetensors headers, the tokenizer), every recorded
file with its columns, the embedder and BERTScore's model and layer, of every run of the
experiment, are checked before any run answers (`sage_jax.run.pipeline.Run.check`, the check of
`sage-jax run` itself; `sage_jax.experiments.command.run_experiment` checks every run through
`consistency.checked_run` first). A refusal is one line, exit status 2, and no answer was made.
Nothing here generates: each run is refused first.
"""
from __future__ import annotations

import json
import shutil

import pytest

from helpers.env import require, shared_data
from sage_jax import cli

Q100 = "sage-mcc/q100_gpt-3.5-turbo_rot.csv"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny Llama and a tiny BERT (the embedder), and broken copies of each."""
    require("torch")
    from clarifyjax.models.tiny import tiny_llama_folder
    from helpers.tiny_models import tiny_classifier_folder

    root = tmp_path_factory.mktemp("models")
    llama, bert = tiny_llama_folder(root, seed=7), tiny_classifier_folder(root, model_type="bert")

    def copy(folder, name, *, drop=(), config=None, truncate=None):
        target = root / name
        shutil.copytree(folder, target, ignore=shutil.ignore_patterns(*drop))
        if config:
            (target / "config.json").write_text(json.dumps({**json.loads((target / "config.json").read_text()),
                                                            **config}))
        if truncate:
            data = (target / truncate).read_bytes()
            (target / truncate).write_bytes(data[:len(data) // 2])
        return str(target)

    return {"llama": str(llama), "bert": str(bert),
            "llama_cut": copy(llama, "llama_cut", truncate="model.safetensors"),
            "llama_wide": copy(llama, "llama_wide", config={"hidden_size": 48}),
            "llama_no_tokenizer": copy(llama, "llama_no_tokenizer", drop=["tokenizer*", "chat_template*"]),
            "bert_cut": copy(bert, "bert_cut", truncate="model.safetensors")}


def recorded(name: str, **generator) -> dict:
    return {"name": name, "generator": {"kind": "file", "model": str(shared_data(Q100)), **generator}}


def refused(tmp_path, capsys, raw: dict, *overrides: str) -> str:
    """The experiment of `raw` exits 2 with one line; no run answered anything."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "experiment.yaml"
    path.write_text(json.dumps({"out": str(tmp_path / "exp"), "bootstrap": {"resamples": 99}, **raw}))
    assert cli.main(["experiment", str(path), *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sage-jax: error: ") and "\n" not in err, err
    assert not list((tmp_path / "exp").glob("runs/*/stages/answer")), err  # no model answered
    assert not (tmp_path / "exp" / "accuracy").exists(), err  # no benchmark scored
    return err


def run_settings(folders, **more) -> dict:
    return {"questions": str(shared_data(Q100)), "limit": 2, "quiet": True,
            "score": {"embedder": folders["bert"], "bertscore": False}, **more}


def test_an_unloadable_second_model_is_refused_before_the_first_answers(tmp_path, capsys, folders):
    cases = {"llama_cut": "model.safetensors", "llama_wide": "shape", "llama_no_tokenizer": "tokenizer"}
    for broken, message in cases.items():
        err = refused(tmp_path / broken, capsys, {"kind": "models", "run": run_settings(folders), "models": [
            recorded("gpt"), {"name": "broken", "generator": {"kind": "local", "model": folders[broken]}}]})
        assert "models[1].generator.model: " in err and message in err, err


def test_a_wrong_recorded_column_is_refused_before_the_first_answers(tmp_path, capsys, folders):
    models = {"kind": "models", "run": run_settings(folders)}
    err = refused(tmp_path / "answer", capsys, {**models, "models": [recorded("gpt"),
                                                                   recorded("typo", column="answr")]})
    assert f"models[1].generator: {shared_data(Q100)}: missing column 'answr'" in err, err
    err = refused(tmp_path / "prompt", capsys, {**models, "models": [recorded("gpt"),
                                                                   recorded("typo", prompt_column="questoin")]})
    assert "models[1].generator: " in err and "missing field 'questoin'" in err, err
    rot = run_settings(folders, rot={"generator": {"kind": "file", "model": str(shared_data(Q100)), "column": "rott"}})
    err = refused(tmp_path / "rot", capsys, {**models, "run": rot, "models": [recorded("gpt")]})
    assert f"rot.generator: {shared_data(Q100)}: missing column 'rott'" in err, err


def test_the_second_run_of_an_experiment_is_checked_before_the_first_runs(tmp_path, capsys, folders):
    """Temperature: the `same` run and the `paraphrase` run; the second one's questions lack the
    paraphrase column it reads."""
    model = {"name": "gpt", "chat": True, "generator": {
        "kind": "file", "model": str(shared_data("sage-temperature")) + "/q100_gpt_3.5_t_{temperature}.csv",
        "prompt_column": "question"}}
    run = run_settings(folders, paraphrase={"source": "file", "paraphrase_column": "paraphrazed"})
    err = refused(tmp_path, capsys, {"kind": "temperature", "run": run, "temperature": {
        "temperatures": [0.0], "settings": ["same", "paraphrase"], "model": model}})
    assert "missing column 'paraphrazed'" in err, err


def test_scoring_models_are_checked_before_the_first_answers(tmp_path, capsys, folders):
    models = {"kind": "models", "models": [recorded("gpt")]}
    err = refused(tmp_path / "cut", capsys, {**models, "run": run_settings(folders)},
                  f"run.score.embedder={folders['bert_cut']}")
    assert "score.embedder: " in err and "model.safetensors" in err, err
    err = refused(tmp_path / "layer", capsys, {**models, "run": run_settings(folders)},
                  "run.score.bertscore=true", f"run.score.bertscore_model={folders['bert']}",
                  "run.score.bertscore_layer=9")
    assert "score.bertscore_model: layer 9 is past the 2 layers of" in err, err


def test_accuracy_checks_the_embedder_before_it_scores_the_benchmarks(tmp_path, capsys, folders):
    """It used to score every benchmark with every model, and then find the embedder missing."""
    raw = {"kind": "accuracy", "run": run_settings(folders),
           "models": [{"name": f"m{i}", "generator": {"kind": "local", "model": folders["llama"]}} for i in (0, 1)],
           "benchmarks": [{"task": "truthfulqa_mc1", "file": str(shared_data("benchmarks/TruthfulQA.csv")),
                           "sample": 2}]}
    err = refused(tmp_path / "name", capsys, raw, "run.score.embedder=no/such/embedder")
    assert "score.embedder: no/such/embedder is neither a folder nor in the local Hugging Face cache" in err, err
    err = refused(tmp_path / "cut", capsys, raw, f"run.score.embedder={folders['bert_cut']}")
    assert "score.embedder: " in err and "model.safetensors" in err, err
