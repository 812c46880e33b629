"""The questions file of a `sage-jax run` (`read_source_questions`): one `SourceQuestion` per
question id, with its paraphrases and their ParaScores when paraphrase.source is file, and the rule
of thumb of a guided model (guide_column); every text a model is prompted with checked."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from clarifyjax.files.tables import DataError, read_rows, resolve_data_path, text_cell
from clarifyjax.files.textfiles import text_problem
from sage_jax.run.config import SageRunConfig


@dataclasses.dataclass
class SourceQuestion:
    question_id: str
    question: str
    paraphrases: list[str] | None = None  # paraphrase.source: file
    scores: list[float] | None = None
    guide: str | None = None  # guide_column: the rule of thumb a guided model is given
    guides: list[str] | None = None  # paraphrase.source file: each paraphrase's own row's rule of thumb


# The rule of thumb of a guided model (guide_column) is read from every row, as the reference's
# improve.py prompts each row with its own `imp_rot`: with paraphrase.source file each paraphrase
# gets its row's; a generated paraphrase has no row, so the rows of a question must then agree.
def read_source_questions(cfg: SageRunConfig, data: bytes | None = None) -> list[SourceQuestion]:
    """The questions file: one question per id (a long-format file's repeated ids are one question,
    its paraphrase column the paraphrases when paraphrase.source is file); first `limit`. `data`:
    the file's bytes when the run writes it (`Run`'s questions_file)."""
    path = resolve_data_path(cfg.questions, "questions") if data is None else Path(cfg.questions)
    header, rows = read_rows(path, data)
    from_file = cfg.paraphrase.source == "file"
    need = [cfg.question_id_column, cfg.question_column]
    if from_file:
        need.append(cfg.paraphrase.paraphrase_column)
    if cfg.guide_column:
        need.append(cfg.guide_column)
    missing = [c for c in need if c not in header]
    if missing:
        raise DataError(f"{cfg.questions}: missing column{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(repr, missing))} (the file has: {', '.join(header)})")
    by_id: dict[str, SourceQuestion] = {}
    for line, row in rows:
        cell = {c: text_cell(row, c, f"{cfg.questions}:{line}").strip() for c in need}
        qid, text = cell[cfg.question_id_column], cell[cfg.question_column]
        if not qid or not text:
            column = cfg.question_id_column if not qid else cfg.question_column
            raise DataError(f"{cfg.questions}:{line}: empty {column!r}")
        _check_text(cfg, line, cfg.question_column, text)
        guide = _guide(cfg, cell, line) if cfg.guide_column else None
        q = by_id.get(qid)
        if q is None:
            if cfg.limit is not None and len(by_id) == cfg.limit:
                continue
            q = by_id[qid] = SourceQuestion(qid, text, [] if from_file else None, [] if from_file else None, guide,
                                            [] if from_file and guide is not None else None)
        elif q.question != text:
            raise DataError(f"{cfg.questions}:{line}: question id {qid!r} has another question text than "
                            "its first row; two questions share one id")
        elif guide is not None and not from_file and guide != q.guide:
            raise DataError(f"{cfg.questions}:{line}: question id {qid!r} has another {cfg.guide_column!r} than "
                            "its first row; generated paraphrases are each given the question's one rule of "
                            "thumb (with paraphrase.source file each paraphrase gets its own row's)")
        if from_file:
            q.paraphrases.append(_check_text(cfg, line, cfg.paraphrase.paraphrase_column,
                                             cell[cfg.paraphrase.paraphrase_column]))
            q.scores.append(_score(row))
            if q.guides is not None:
                q.guides.append(guide)
    if not by_id:
        raise DataError(f"{cfg.questions}: no questions")
    return list(by_id.values())


def _score(row) -> float | None:
    """A paraphrase's ParaScore; None (which JSON holds) for a file of paraphrases without one."""
    try:
        score = float(row.get("score") or "nan")
    except ValueError:
        score = float("nan")
    return score if score == score and abs(score) != float("inf") else None


def _guide(cfg: SageRunConfig, cell: dict, line: int) -> str:
    guide = cell[cfg.guide_column]
    if not guide:
        raise DataError(f"{cfg.questions}:{line}: empty {cfg.guide_column!r} (guide_column: every question needs "
                        "the rule of thumb its guided models are given)")
    return guide


def _check_text(cfg: SageRunConfig, line: int, column: str, text: str) -> str:
    """`text` of the questions file's `column` at `line`, which a model will be prompted with:
    DataError when it is empty, invisible or not encodable (`textfiles.text_problem`)."""
    problem = text_problem(text)
    if problem is not None:
        raise DataError(f"{cfg.questions}:{line}: {column!r} {problem}; each one is sent to the "
                        "models as it is")
    return text
