"""The discriminator baseline's training data (paper §5): (situation, question, label) rows from a
δ-CLARIFY file: each situation's gold questions (label 1) and as many hard negatives (label 0),
questions of its most similar other situations by embedding cosine (`hard_negatives`).

The embeddings are an argument (`clarifyjax discriminator-data` uses all-MiniLM-L6-v2). Each split
is built from its own file, so no dev question or situation reaches training."""
from __future__ import annotations

import csv
import io
from collections.abc import Sequence

import numpy as np

from clarifyjax.text import formats
from clarifyjax.files.tables import Table

DISCRIMINATOR_COLUMNS = ("situation", "question", "label")


def gold_questions(table: Table) -> tuple[list[str], list[list[str]]]:
    """(situations in order of first appearance, their distinct gold questions) of a δ-CLARIFY
    table (columns situation, question), whitespace-normalized."""
    questions: dict[str, list[str]] = {}
    for row in table.rows:
        situation = formats.normalize_whitespace(row["situation"])
        question = formats.normalize_whitespace(row["question"])
        listed = questions.setdefault(situation, [])
        if question and question not in listed:
            listed.append(question)
    return list(questions), list(questions.values())


def nearest_other(embeddings: np.ndarray, k: int, block: int = 2048) -> np.ndarray:
    """[n, d] embeddings -> [n, min(k, n - 1)] indices of the most cosine-similar other rows,
    most similar first; ties go to the lower index. Computed in row blocks ([block, n] at once)."""
    x = np.asarray(embeddings, np.float32)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    n = len(x)
    k = min(k, n - 1)
    out = np.zeros((n, max(k, 0)), np.int64)
    for lo in range(0, n, block):
        sim = x[lo:lo + block] @ x.T  # [rows, n]
        rows = np.arange(lo, min(lo + block, n))
        sim[rows - lo, rows] = -np.inf  # never itself
        for j in range(k):  # k argmaxes: the first maximum, so ties go to the lower index
            best = np.argmax(sim, axis=1)
            out[rows, j] = best
            sim[rows - lo, best] = -np.inf
    return out


def _key(question: str) -> str:
    return formats.normalize_whitespace(question).casefold()


def hard_negatives(i: int, questions: Sequence[Sequence[str]], neighbours: np.ndarray,
                   count: int) -> list[str]:
    """Up to `count` questions of situation i's neighbours (round-robin, nearest first) that are
    not gold questions of i.

    Hard yet unambiguous: round-robin (the first question of each neighbour, then the second of
    each, ...) so that one near-duplicate neighbour does not supply them all; never a gold question
    of i compared case-insensitively after whitespace normalization (the same text, e.g. "Why?", is
    often gold for several situations), and never the same question twice."""
    taken = {_key(q) for q in questions[i]}
    chosen: list[str] = []
    depth = max((len(questions[j]) for j in neighbours[i]), default=0)
    for position in range(depth):
        for j in neighbours[i]:
            if len(chosen) == count:
                return chosen
            if position < len(questions[j]) and _key(questions[j][position]) not in taken:
                taken.add(_key(questions[j][position]))
                chosen.append(questions[j][position])
    return chosen


def discriminator_rows(situations: Sequence[str], questions: Sequence[Sequence[str]],
                       embeddings: np.ndarray, neighbours: int = 5) -> list[dict[str, str]]:
    """Rows {situation, question, label ("1" / "0")}: each situation's positives, then as many
    negatives as it has positives (classes balanced, up to situations whose neighbours run out of
    questions). `embeddings` [n, d]: one per situation, in the same order."""
    if len(embeddings) != len(situations) or len(questions) != len(situations):
        raise ValueError(f"discriminator_rows: {len(situations)} situations, {len(questions)} "
                         f"question lists and {len(embeddings)} embeddings")
    nearest = nearest_other(embeddings, neighbours)
    rows = []
    for i, situation in enumerate(situations):
        rows += [{"situation": situation, "question": q, "label": "1"} for q in questions[i]]
        rows += [{"situation": situation, "question": q, "label": "0"}
                 for q in hard_negatives(i, questions, nearest, len(questions[i]))]
    return rows


def rows_tsv(rows: Sequence[dict[str, str]]) -> bytes:
    """The rows as a TSV file (header `DISCRIMINATOR_COLUMNS`) that `tables.read_table` reads back: the csv
    module's quoting (a field with a quote character is quoted), whitespace runs collapsed."""
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n")
    writer.writerow(DISCRIMINATOR_COLUMNS)
    writer.writerows([formats.normalize_whitespace(r[c]) for c in DISCRIMINATOR_COLUMNS] for r in rows)
    return out.getvalue().encode("utf-8")
