"""`sage-jax run` and `sage_jax.score` into a folder that holds a run: a rerun with other settings
(another seed, other questions, a missing data file, another batch size for an unfinished stage)
is refused before anything is written, so every file of the finished run stays byte-identical
(each file hashed before and after); the same command again changes nothing either. And a stage of
recorded answers resumed from any batch gets the texts an uninterrupted one got (the file
generator counts what it served from the batch files, not in memory).

The answers and rules of thumb are recorded (tests/helpers/recorded_files.py); the embedder is a
tiny random BERT.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clarifyjax.config.loader import ConfigError, build_root
from helpers.recorded_files import QUESTIONS, folder_hashes, sage_jax_refuses, write_release
from sage_jax import cli
from sage_jax.run import pipeline
from sage_jax.run.config import SageRunConfig

GEN = ("paraphrase", "answer", "rot")


def run_config(release: Path, embedder: str | None = None, **over) -> dict:
    raw = {"questions": str(release), "out": "out", "quiet": True, "paraphrase": {"source": "file"},
           "models": [{"name": "gpt", "generator": {"kind": "file", "model": str(release)}}],
           "rot": {"generator": {"kind": "file", "model": str(release), "column": "rot"}, "batch_size": 4},
           "answer": {"batch_size": 4}, "score": {"embedder": embedder, "bertscore": False}}
    return {**raw, **over}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, embedder):
    """A folder holding a finished `sage-jax run` (run.yaml, out/) of recorded answers."""
    folder = tmp_path_factory.mktemp("finished")
    release = write_release(folder / "release.csv")
    (folder / "run.yaml").write_text(json.dumps(run_config(release, embedder)))
    with pytest.MonkeyPatch.context() as m:
        m.chdir(folder)
        assert cli.main(["run", "run.yaml"]) == 0
    assert (folder / "out" / "report" / "table1.md").exists()
    return folder


def _copy(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


def _answers_file_missing(raw):
    raw["models"] = [{"name": "gpt", "generator": {"kind": "file", "model": "missing.csv"}}]


def _forget_the_answer_stage_end(folder: Path):
    (folder / "out/stages/answer/gpt/p0of1/rows.jsonl").unlink()  # killed before it wrote its rows


@pytest.mark.e2e
@pytest.mark.parametrize("edit, options, killed, refused", [
    (lambda raw: raw.update(seed=1), [], None, "seed differ"),
    (lambda raw: raw.update(seed=1), ["--stages", "report"], None, "seed differ"),  # a stage not asked
    (lambda raw: raw.update(limit=2), [], None, "paraphrase rows of another questions file"),
    (_answers_file_missing, [], None, "models[0].generator.model: data file not found"),
    (lambda raw: raw["answer"].update(batch_size=3), [], _forget_the_answer_stage_end,
     "does not hold the rows this run schedules"),
    (lambda raw: None, [], None, None),  # the same command: nothing changes either
], ids=["seed", "seed-report-only", "questions", "missing-file", "batch-size-unfinished", "same"])
def test_a_refused_rerun_leaves_every_file_of_the_finished_run_byte_identical(
        tmp_path, finished, monkeypatch, capsys, edit, options, killed, refused):
    folder = _copy(finished, tmp_path)
    if killed:
        killed(folder)
    raw = json.loads((folder / "run.yaml").read_text())
    edit(raw)
    (folder / "again.yaml").write_text(json.dumps(raw))
    before = folder_hashes(folder / "out")
    monkeypatch.chdir(folder)
    sage_jax_refuses(capsys, ["run", "again.yaml", *options], refused)
    assert folder_hashes(folder / "out") == before


@pytest.fixture(scope="module")
def loaded_embedder(embedder):
    from clarifyjax.models.embedder import SentenceEmbedder

    return SentenceEmbedder.from_pretrained(embedder)


PARAPHRASES = {q: [f"{q[:-1]}, in your view?", f"Tell me: {q}", f"In short: {q}"] for _, q in QUESTIONS}


def get_response(question: str) -> str:
    return f"answer to {question}"


def score_details(out: Path, **change):
    import sage_jax

    call = {"questions": [q for _, q in QUESTIONS], "paraphrases": PARAPHRASES, "count": 3,
            **change}
    return sage_jax.score_details(call.pop("questions"), get_response, use_rots=False, out=out, **call)


def _no_embedder(folder: str) -> dict:
    return {"embedder": folder, "embedder_model": None}


@pytest.mark.parametrize("change, refused", [
    ({"questions": [QUESTIONS[1][1], QUESTIONS[0][1]]}, "paraphrase rows of another questions file"),
    ({"count": 2}, "tasks differ"),
    (_no_embedder("no-such-folder"), "score.embedder"),
    ({}, None),
], ids=["questions", "count", "missing-embedder", "same"])
def test_a_refused_rerun_of_sage_jax_score_leaves_every_file_byte_identical(tmp_path, loaded_embedder, change,
                                                                            refused):
    out = tmp_path / "run"  # the paraphrases given, no RoTs: questions.csv, the stages, the report
    score_details(out, embedder_model=loaded_embedder)
    before = folder_hashes(out)
    assert "questions.csv" in before and "report/scores.json" in before
    change = {"embedder_model": loaded_embedder, **change}
    if refused is None:
        score_details(out, **change)
    else:
        with pytest.raises(ConfigError, match=refused):
            score_details(out, **change)
    assert folder_hashes(out) == before


def _stage_files(out: Path) -> dict[str, str]:
    return folder_hashes(out / "stages")


def test_a_recorded_stage_resumed_from_any_batch_gets_the_texts_of_an_uninterrupted_one(tmp_path):
    """Each answer and rot batch of a run of recorded answers, as a kill after it leaves the folder
    (that batch and the ones before, nothing after), then the run again: every batch file and row
    as the uninterrupted run's."""
    release = write_release(tmp_path / "release.csv")

    def run(folder: Path):
        raw = run_config(release, **{"out": str(folder / "out")})
        pipeline.Run(build_root(SageRunConfig, raw)).run(GEN)

    run(tmp_path / "whole")
    expected = _stage_files(tmp_path / "whole" / "out")
    kills = [name for name in expected if "/batch-" in name]
    assert sum("answer/" in k for k in kills) >= 3 and sum("rot/" in k for k in kills) >= 3
    for i, last in enumerate(kills):
        folder = tmp_path / f"killed{i}"
        shutil.copytree(tmp_path / "whole", folder)
        stage = last.split("/")[0]
        kept = set(kills[:i + 1]) | {k for k in expected if k.startswith("paraphrase/")
                                     or k.startswith(f"{stage}/") and k.endswith("stage.json")}
        if stage == "rot":
            kept |= {k for k in expected if k.startswith("answer/")}
        for name in expected:
            if name not in kept:
                (folder / "out" / "stages" / name).unlink()
        run(folder)
        assert _stage_files(folder / "out") == expected, f"resumed after {last}"
