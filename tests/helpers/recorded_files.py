"""Recorded outputs for the rerun and resume tests of `sage-jax run`, `sage-jax experiment` and
`sage_jax.score` (tests/sage_jax/run/test_rerun.py, tests/sage_jax/experiments/test_resume.py):
small files in the SaGE release's formats whose every text is distinct, so a text served to the
wrong row shows, with repeated prompts (a repeated paraphrase, identical answers) and an empty
answer (a retry); `folder_hashes`, every file under a folder; `sage_jax_refuses`, a command's
outcome."""
from __future__ import annotations

import hashlib
from pathlib import Path

from helpers.sage_files import write_csv
from sage_jax import cli

QUESTIONS = [("q1", "Is it right to lie to protect a friend?"), ("q2", "Should you return a lost wallet?"),
             ("q3", "May you break a promise to help a stranger?")]
TEMPERATURES = ("0.0", "0.5")


def write_release(path: Path) -> Path:
    """A long-format file (question_id, question, paraphrased, score, model_output, rot): five
    paraphrases per question, the third a copy of the first (the release repeats some)."""
    rows = []
    for qid, question in QUESTIONS:
        paraphrases = [f"{question[:-1]}, in your view?", f"Tell me: {question}", f"{question[:-1]}, in your view?",
                       f"{question} Explain.", f"In short: {question}"]
        rows += [[qid, question, p, 0.9, f"{qid} answer {k}", f"{qid} rule {k}"] for k, p in enumerate(paraphrases)]
    return write_csv(path, ["question_id", "question", "paraphrased", "score", "model_output", "rot"], rows)


def write_temperature_files(folder: Path) -> dict[str, Path]:
    """t_<T>.csv (question_id, question, model_output: five answers to each question asked as it
    is; at 0.0 some identical, at 0.5 one empty) and rot.csv (a rule of thumb per answer)."""
    answers = {"0.0": lambda qid, k: f"{qid} answer {'AABAC'[k]} at 0.0",
               "0.5": lambda qid, k: "" if (qid, k) == ("q2", 1) else f"{qid} answer {k} at 0.5"}
    paths, rots = {}, []
    for t in TEMPERATURES:
        rows = [[qid, question, answers[t](qid, k)] for qid, question in QUESTIONS for k in range(5)]
        paths[t] = write_csv(folder / f"t_{t}.csv", ["question_id", "question", "model_output"], rows)
        rots += [[qid, question, answer, f"{qid} rule {i} at {t}"] for i, (qid, question, answer) in enumerate(rows)
                 if answer]
    paths["rot"] = write_csv(folder / "rot.csv", ["question_id", "paraphrased", "model_output", "rot"], rots)
    return paths


def folder_hashes(root: Path) -> dict[str, str]:
    """Every file under `root` (hidden ones too) -> the SHA-256 of its bytes."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


def sage_jax_refuses(capsys, argv: list[str], refused: str | None) -> None:
    """`sage-jax ARGV` ends with exit status 2 and one error line holding `refused` (None: it runs,
    exit status 0)."""
    capsys.readouterr()
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip()
    if refused is None:
        assert rc == 0, err
    else:
        assert rc == 2 and err.startswith("sage-jax: error:") and refused in err and "\n" not in err, err
