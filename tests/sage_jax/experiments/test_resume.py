"""`sage-jax experiment` on recorded answers (file generators; sage_jax/presets/experiments/
temperature_recorded.yaml's shape, with recorded rules of thumb too): killed with SIGKILL in each
stage of its runs and run again, it writes byte for byte the files of an uninterrupted run; rerun
into its finished folder with other settings (another seed, other questions, a missing data
file), it is refused before anything is written, and every file stays byte-identical.

The recorded files are tests/helpers/recorded_files.py's; the embedder is a tiny random BERT.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import experiment_child
from helpers.children import clean_env
from helpers.recorded_files import folder_hashes, sage_jax_refuses, write_temperature_files

# A kill right after each of these files (under the experiment's folder): one point in each stage.
KILL_AT = {"paraphrase": "runs/same/stages/paraphrase/p0of1/rows.jsonl",
           "answer": "runs/same/stages/answer/t0.5/p0of1/batch-000001.jsonl",
           "rot": "runs/same/stages/rot/t0.0/p0of1/batch-000001.jsonl",
           "score": "runs/same/report/t0.0.answers.csv",
           "report": "runs/same/report/table1.csv",
           "experiment": "temperature.md"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    from helpers.tiny_models import tiny_classifier_folder

    folder = tmp_path_factory.mktemp("recorded")
    return {**write_temperature_files(folder), "bert": tiny_classifier_folder(folder, model_type="bert")}


def experiment_config(recorded: dict) -> dict:
    """Figure 3's `same` setting at two temperatures, in batches of 4 rows, so that batches split
    a question's five identical prompts; out is relative (`exp`), so copies compare byte for byte."""
    folder = recorded["rot"].parent
    return {"kind": "temperature", "out": "exp", "bootstrap": {"resamples": 99},
            "run": {"questions": str(recorded["0.0"]), "quiet": True, "answer": {"batch_size": 4},
                    "rot": {"batch_size": 4, "generator": {"kind": "file", "model": str(recorded["rot"]),
                                                           "column": "rot"}},
                    "score": {"embedder": str(recorded["bert"]), "bertscore": False}},
            "temperature": {"temperatures": [0.0, 0.5], "settings": ["same"], "model": {
                "name": "gpt", "chat": True, "generator": {"kind": "file", "model": f"{folder}/t_{{temperature}}.csv",
                                                           "prompt_column": "question"}}}}


def write_config(folder: Path, raw: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder / "config.json"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, recorded):
    """(the folder, the files the experiment wrote in order, every file's hash) of a run without a
    kill, in this process (`experiment_child.main`, the child's own code)."""
    folder = tmp_path_factory.mktemp("whole")
    path = write_config(folder, experiment_config(recorded))
    with pytest.MonkeyPatch.context() as m:
        m.chdir(folder)
        written = experiment_child.main(str(path), "none")
    rows = [json.loads(x) for x in (folder / "exp/runs/same/stages/answer/t0.5/p0of1/rows.jsonl").open()]
    assert [r["answer"] for r in rows if r["question_id"] == "q1"] == [f"q1 answer {k} at 0.5" for k in range(5)]
    assert max(r["attempt"] for r in rows) == 1  # the empty answer was asked again
    return folder, written, folder_hashes(folder / "exp")


@pytest.mark.child
@pytest.mark.slow  # a child per kill point, each loading JAX and the embedder
@pytest.mark.parametrize("stage", list(KILL_AT))
def test_kill_9_in_each_stage_then_the_same_command_writes_the_uninterrupted_files(tmp_path, monkeypatch, stage,
                                                                                   recorded, uninterrupted):
    _, written, expected = uninterrupted
    path = write_config(tmp_path, experiment_config(recorded))
    proc = subprocess.run([sys.executable, "-m", "helpers.experiment_child", str(path),
                           str(written.index(KILL_AT[stage]) + 1)],
                          cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert folder_hashes(tmp_path / "exp") != expected  # it stopped short
    monkeypatch.chdir(tmp_path)
    experiment_child.main(str(path), "none")
    assert folder_hashes(tmp_path / "exp") == expected


@pytest.mark.e2e
@pytest.mark.parametrize("overrides, refused", [
    (["run.seed=1"], "seed differ"),
    (["run.limit=2"], "paraphrase rows of another questions file"),
    (["temperature.temperatures=[0.0,0.5,1.0]"], "temperature.model.generator.model: data file not found"),
    ([], None),  # the same command: nothing changes either
], ids=["seed", "questions", "missing-file", "same"])
def test_a_refused_rerun_leaves_every_file_of_the_finished_experiment_byte_identical(
        tmp_path, monkeypatch, capsys, uninterrupted, overrides, refused):
    whole, _, expected = uninterrupted
    shutil.copytree(whole, tmp_path / "copy")
    monkeypatch.chdir(tmp_path / "copy")
    assert folder_hashes(Path("exp")) == expected
    sage_jax_refuses(capsys, ["experiment", "config.json", *overrides], refused)
    assert folder_hashes(Path("exp")) == expected
