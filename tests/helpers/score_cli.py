"""Inputs of `clarifyjax score-questions` for the CLI tests (clarifyjax/test_cli.py,
clarifyjax/reward/test_command.py): the tiny random models of reward/test_pipeline.py (same seeds,
so a session builds them once), the first rows of δ-CLARIFY dev.tsv, and the command line. The
fixtures `folders` and `rows` (tests/clarifyjax/conftest.py) call these."""
from __future__ import annotations

import csv

from helpers.env import shared_data
from helpers.tiny_models import tiny_nli_folder, tiny_t5_folder

N = 12  # with --batch-size 8: two chunks of 6 rows, the same shapes


def model_folders(tmp_path_factory) -> dict:
    return dict(
        answerer=tiny_t5_folder(tmp_path_factory, seed=21, initializer_factor=3.0),
        fusion=tiny_t5_folder(tmp_path_factory, family="v1.1", seed=12, initializer_factor=3.0),
        judge=tiny_t5_folder(tmp_path_factory, seed=13),
        nli=tiny_nli_folder(tmp_path_factory, seed=14))


def dev_rows() -> tuple[list[str], list[str]]:
    with open(shared_data("delta-clarify/dev.tsv"), newline="", encoding="utf-8") as f:
        data = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:N]
    return [r["situation"] for r in data], [r["question"] for r in data]


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def args_for(folders, situations, questions, out, *extra):
    argv = ["score-questions", "--situations", str(situations), "--questions", str(questions),
            "--out", str(out), "--batch-size", "8", "--answer-max-length", "10",
            "--fusion-max-length", "14", "--judgment-max-length", "6"]
    for name in ("answerer", "fusion", "judge", "nli"):
        if name in folders:
            argv += [f"--{name}", str(folders[name])]
    return argv + list(extra)
