"""`sage-jax run` into a folder that holds a run: a stage of recorded answers resumed from any
batch gets the texts an uninterrupted one got (the file generator counts what it served from the
batch files, not in memory).

The answers and rules of thumb are recorded (tests/helpers/recorded_files.py).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from clarifyjax.config.loader import build_root
from helpers.recorded_files import folder_hashes, write_release
from sage_jax.run import pipeline
from sage_jax.run.config import SageRunConfig

GEN = ("paraphrase", "answer", "rot")


def run_config(release: Path, embedder: str | None = None, **over) -> dict:
    raw = {"questions": str(release), "out": "out", "quiet": True, "paraphrase": {"source": "file"},
           "models": [{"name": "gpt", "generator": {"kind": "file", "model": str(release)}}],
           "rot": {"generator": {"kind": "file", "model": str(release), "column": "rot"}, "batch_size": 4},
           "answer": {"batch_size": 4}, "score": {"embedder": embedder, "bertscore": False}}
    return {**raw, **over}



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
