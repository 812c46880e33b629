"""SaGE input files -> questions with their texts -> padded [batch, n] index / mask / groups.

Two layouts are read, each as CSV, TSV or JSONL (by the file's suffix):

* the long format, one row per paraphrase: question id, paraphrase, answer, rule of thumb (column
  names configurable; the defaults are those of the SaGE release, e.g. sage-mcc/q100_*_rot.csv:
  `question_id, question, paraphrased, score, model_output, rot`);
* the reference pairs format, one row per pair of paraphrases: `question_id, paraphrased_1,
  model_output_1, rot_1, paraphrased_2, model_output_2, rot_2` plus numeric edge-weight columns
  (`bleu_*`, `rouge_*`, `cosine_*`). The reference writes the pairs of n paraphrases in
  `itertools.combinations(range(n), 2)` order; each question's n texts are rebuilt from that order
  and must agree across the rows that mention them.

A missing column is an error naming the file and the column; a malformed row names the file and the
line. Empty texts are kept in the questions and masked out (and counted) when batching.
"""
from __future__ import annotations

import csv
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

FIELDS = ("paraphrase", "answer", "rot")


class DataError(ValueError):
    """An input file that cannot be read as asked; the message names the file, line or column."""


@dataclass(frozen=True)
class Columns:
    """Column names of the text fields (long format) or their stems (pairs format: `stem_1`)."""

    question_id: str = "question_id"
    paraphrase: str = "paraphrased"
    answer: str = "model_output"
    rot: str = "rot"

    def name(self, field_name: str) -> str:
        if field_name not in FIELDS:
            raise ValueError(f"unknown text field {field_name!r}; expected one of {FIELDS}")
        return getattr(self, field_name)


@dataclass
class Question:
    """One question: its n paraphrases with the model's answer and rule of thumb for each.

    `paraphrases`, `answers`, `rots` are lists of n strings, or None where the file has no such
    column. `lines[i]` is the file line text i was read from. `pair_values` (pairs format only) maps
    a numeric column to its [n, n] symmetric matrix (NaN on the diagonal).
    """

    question_id: str
    paraphrases: list[str] | None
    answers: list[str] | None
    rots: list[str] | None
    source: str
    lines: list[int]
    pair_values: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.lines)

    def texts(self, field_name: str) -> list[str]:
        values = {"paraphrase": self.paraphrases, "answer": self.answers, "rot": self.rots}[field_name]
        if values is None:
            raise DataError(f"{self.source}: no {field_name} column was read (question {self.question_id})")
        return values


# ----------------------------------------------------------------------------- reading rows


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".tsv", ".tab"):
        return "tsv"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    raise DataError(f"{path}: unknown file type {suffix!r}; expected .csv, .tsv or .jsonl")


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return ""
    return str(value)


def read_rows(path: str | os.PathLike) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    """The header and an iterator of (line number, row as column -> string) of a CSV/TSV/JSONL file.

    The header of a JSONL file is the union of the keys of its objects, in order of appearance; a
    key missing from one object reads as None there (callers report it when the field is needed).
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"input file not found: {path}")
    kind = _kind(path)
    if kind == "jsonl":
        records: list[tuple[int, dict]] = []
        header: dict[str, None] = {}
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{line_no}: invalid JSON ({e.msg})") from e
                if not isinstance(obj, dict):
                    raise DataError(f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}")
                header.update(dict.fromkeys(obj))
                records.append((line_no, obj))
        if not records:
            raise DataError(f"{path}: empty file")

        def jsonl_rows():
            for line_no, obj in records:
                yield line_no, {k: (_cell(obj[k]) if k in obj else None) for k in header}

        return list(header), jsonl_rows()

    delimiter = "," if kind == "csv" else "\t"
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise DataError(f"{path}: empty file") from None
        except csv.Error as e:
            raise DataError(f"{path}:{reader.line_num}: malformed header ({e})") from e

    def csv_rows():  # opens the file again, so that nothing stays open if it is never read
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f, delimiter=delimiter)
            next(reader)
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as e:
                    raise DataError(f"{path}:{reader.line_num}: malformed row ({e})") from e
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(header):
                    raise DataError(f"{path}:{reader.line_num}: malformed row: {len(row)} fields, "
                                    f"the header has {len(header)}")
                yield reader.line_num, dict(zip(header, row))

    return header, csv_rows()


def _require_columns(path, header: Sequence[str], names: Sequence[str]) -> None:
    missing = [c for c in names if c not in header]
    if missing:
        raise DataError(f"{path}: missing column{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(repr(c) for c in missing)} (the file has: {', '.join(header)})")


def _value(path, line_no: int, row: dict, column: str) -> str:
    value = row.get(column)
    if value is None:  # JSONL object without the key
        raise DataError(f"{path}:{line_no}: missing field {column!r}")
    return value


# ----------------------------------------------------------------------------- the two layouts


def detect_format(header: Sequence[str], columns: Columns = Columns()) -> str:
    """'pairs' if the header has `<answer>_1` and `<answer>_2`, else 'long'."""
    if f"{columns.answer}_1" in header and f"{columns.answer}_2" in header:
        return "pairs"
    return "long"


def read_long(path, columns: Columns = Columns(), need: Sequence[str] = ("answer",), *,
              _header_rows=None) -> list[Question]:
    """Long format: one row per paraphrase; rows of a question need not be contiguous.

    `need` lists the text fields that must be present; the others are read when their column
    exists (else None).
    """
    header, rows = _header_rows or read_rows(path)
    _require_columns(path, header, [columns.question_id] + [columns.name(f) for f in need])
    present = [f for f in FIELDS if columns.name(f) in header]
    by_id: dict[str, dict] = {}
    for line_no, row in rows:
        qid = _value(path, line_no, row, columns.question_id).strip()
        if not qid:
            raise DataError(f"{path}:{line_no}: empty {columns.question_id!r}")
        q = by_id.setdefault(qid, {"lines": [], **{f: [] for f in present}})
        q["lines"].append(line_no)
        for f in present:
            q[f].append(_value(path, line_no, row, columns.name(f)) if f in need
                        else (row.get(columns.name(f)) or ""))
    if not by_id:
        raise DataError(f"{path}: no data rows")
    return [Question(question_id=qid, paraphrases=q.get("paraphrase"), answers=q.get("answer"),
                     rots=q.get("rot"), source=str(path), lines=q["lines"])
            for qid, q in by_id.items()]


def _triangular(m: int) -> int | None:
    n = int(round((1 + math.sqrt(1 + 8 * m)) / 2))
    return n if n * (n - 1) // 2 == m else None


def read_pairs(path, columns: Columns = Columns(), need: Sequence[str] = ("answer",),
               weight_columns: Sequence[str] | None = None, *, _header_rows=None) -> list[Question]:
    """Reference pairs format: one row per pair (i < j) of paraphrases, in combinations order.

    weight_columns: numeric columns to keep as [n, n] matrices in `pair_values`; None keeps every
    other column whose values all parse as numbers.
    """
    header, rows = _header_rows or read_rows(path)
    text_cols = {f: (f"{columns.name(f)}_1", f"{columns.name(f)}_2") for f in FIELDS}
    _require_columns(path, header, [columns.question_id] + [c for f in need for c in text_cols[f]])
    present = [f for f in FIELDS if all(c in header for c in text_cols[f])]
    used = {columns.question_id} | {c for f in present for c in text_cols[f]}
    if weight_columns is not None:
        _require_columns(path, header, list(weight_columns))
    candidates = list(weight_columns) if weight_columns is not None else [c for c in header if c not in used]

    by_id: dict[str, list[tuple[int, dict]]] = {}
    for line_no, row in rows:
        qid = _value(path, line_no, row, columns.question_id).strip()
        if not qid:
            raise DataError(f"{path}:{line_no}: empty {columns.question_id!r}")
        by_id.setdefault(qid, []).append((line_no, row))
    if not by_id:
        raise DataError(f"{path}: no data rows")

    # Parse the numeric columns; in auto mode a column with a non-number anywhere is not a weight.
    numeric: dict[str, dict[int, float]] = {}
    for col in candidates:
        values, ok = {}, True
        for pairs in by_id.values():
            for line_no, row in pairs:
                raw = row.get(col)
                try:
                    values[line_no] = float(raw) if raw not in (None, "") else math.nan
                except ValueError:
                    if weight_columns is not None:
                        raise DataError(f"{path}:{line_no}: column {col!r} is not a number: {raw!r}") from None
                    ok = False
                    break
            if not ok:
                break
        if ok:
            numeric[col] = values

    questions = []
    for qid, pairs in by_id.items():
        n = _triangular(len(pairs))
        if n is None:
            raise DataError(f"{path}:{pairs[0][0]}: question {qid} has {len(pairs)} pair rows, which is "
                            "not n(n-1)/2 for any n (rows of a pairs file must cover every pair once)")
        texts: dict[int, tuple] = {}
        seen_at: dict[int, int] = {}
        for (i, j), (line_no, row) in zip(itertools.combinations(range(n), 2), pairs):
            for pos, side in ((i, 0), (j, 1)):
                value = tuple(_value(path, line_no, row, text_cols[f][side]) for f in present)
                if pos in texts and texts[pos] != value:
                    f = present[next(a for a in range(len(present)) if texts[pos][a] != value[a])]
                    raise DataError(
                        f"{path}:{line_no}: pairs rows disagree: column {text_cols[f][side]!r} gives "
                        f"paraphrase {pos} of question {qid} a different {f} than line {seen_at[pos]} "
                        f"({value[present.index(f)][:60]!r} vs {texts[pos][present.index(f)][:60]!r}); "
                        "expected the pairs in itertools.combinations order")
                texts.setdefault(pos, value)
                seen_at.setdefault(pos, line_no)
        values = {}
        for col, by_line in numeric.items():
            mat = np.full((n, n), np.nan, dtype=np.float64)
            for (i, j), (line_no, _) in zip(itertools.combinations(range(n), 2), pairs):
                mat[i, j] = mat[j, i] = by_line[line_no]
            values[col] = mat
        per_field = {f: [texts[p][a] for p in range(n)] for a, f in enumerate(present)}
        questions.append(Question(question_id=qid, paraphrases=per_field.get("paraphrase"),
                                  answers=per_field.get("answer"), rots=per_field.get("rot"),
                                  source=str(path), lines=[seen_at[p] for p in range(n)],
                                  pair_values=values))
    return questions


def read_questions(path, *, format: str = "auto", columns: Columns | None = None,
                   need: Sequence[str] = ("answer",), weight_columns: Sequence[str] | None = None
                   ) -> list[Question]:
    """Read a long or pairs file (format 'auto' decides from the header)."""
    columns = columns or Columns()
    header, rows = read_rows(path)
    if format == "auto":
        format = detect_format(header, columns)
    if format == "long":
        if weight_columns:
            raise DataError(f"{path}: edge-weight columns {list(weight_columns)} need a pairs file")
        return read_long(path, columns, need, _header_rows=(header, rows))
    if format == "pairs":
        return read_pairs(path, columns, need, weight_columns, _header_rows=(header, rows))
    raise ValueError(f"format must be 'auto', 'long' or 'pairs', got {format!r}")


# ----------------------------------------------------------------------------- batching


@dataclass
class TextBatch:
    """Questions laid out as [batch, n] positions over a table of distinct texts.

    index: [batch, n] int32 into `texts`, -1 for padding and empty texts.
    mask: [batch, n] bool, True for a real, non-empty text.
    groups: [batch, n] int32, equal ids = identical strings (the reference's collapsing).
    texts: the distinct non-empty strings; embed each once.
    n_texts: [batch] int32, number of positions before padding (empty texts included).
    n_empty: how many empty texts were masked out.
    """

    question_ids: list[str]
    index: np.ndarray
    mask: np.ndarray
    groups: np.ndarray
    texts: list[str]
    n_texts: np.ndarray
    n_empty: int


def text_batch(questions: Sequence[Question], field_name: str, n_max: int | None = None) -> TextBatch:
    """Pad the `field_name` texts of `questions` to [batch, n_max] (default: the largest n)."""
    n_max = n_max or max((q.n for q in questions), default=1)
    table: dict[str, int] = {}
    index = np.full((len(questions), n_max), -1, dtype=np.int32)
    n_texts = np.zeros(len(questions), dtype=np.int32)
    n_empty = 0
    for b, q in enumerate(questions):
        texts = q.texts(field_name)
        if len(texts) > n_max:
            raise DataError(f"{q.source}:{q.lines[0]}: question {q.question_id} has {len(texts)} "
                            f"texts, more than n_max={n_max}")
        n_texts[b] = len(texts)
        for i, t in enumerate(texts):
            if not t.strip():
                n_empty += 1
                continue
            index[b, i] = table.setdefault(t, len(table))
    mask = index >= 0
    return TextBatch(question_ids=[q.question_id for q in questions], index=index, mask=mask,
                     groups=np.where(mask, index, -1).astype(np.int32), texts=list(table),
                     n_texts=n_texts, n_empty=n_empty)


def gather(vectors: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Place per-text vectors [T, d] at their positions: [batch, n, d], zeros at index -1."""
    vectors = np.asarray(vectors)
    if vectors.ndim != 2:
        raise ValueError(f"vectors must be [texts, d], got shape {vectors.shape}")
    if index.size and index.max(initial=-1) >= len(vectors):
        raise ValueError(f"index refers to text {index.max()} but only {len(vectors)} vectors were given")
    out = vectors[np.clip(index, 0, max(len(vectors) - 1, 0))] if len(vectors) else \
        np.zeros(index.shape + (vectors.shape[-1],), vectors.dtype)
    return np.where((index >= 0)[..., None], out, 0).astype(vectors.dtype)


def pair_matrix(questions: Sequence[Question], column: str, n_max: int | None = None) -> np.ndarray:
    """A pairs file's numeric column as [batch, n_max, n_max] edge weights (0 at padding)."""
    n_max = n_max or max((q.n for q in questions), default=1)
    out = np.zeros((len(questions), n_max, n_max), dtype=np.float32)
    for b, q in enumerate(questions):
        if column not in q.pair_values:
            raise DataError(f"{q.source}: no numeric pair column {column!r} "
                            f"(has: {', '.join(q.pair_values) or 'none; is it a pairs file?'})")
        out[b, :q.n, :q.n] = np.nan_to_num(q.pair_values[column], nan=0.0)
        if np.isnan(q.pair_values[column][~np.eye(q.n, dtype=bool)]).any():
            raise DataError(f"{q.source}:{q.lines[0]}: column {column!r} is empty or NaN for a pair "
                            f"of question {q.question_id}")
    return out


def shared_texts(*batches: TextBatch) -> tuple[list[str], list[np.ndarray]]:
    """One table of the distinct texts of several batches (e.g. answers and rules of thumb), so
    that a text appearing in both is embedded once and all are sorted by length together.

    Returns (texts, indices): indices[k] is batches[k].index re-pointed into `texts` ([batch, n]
    int32, -1 kept).
    """
    table: dict[str, int] = {}
    indices = []
    for batch in batches:
        remap = np.array([table.setdefault(t, len(table)) for t in batch.texts] + [-1], dtype=np.int32)
        indices.append(remap[batch.index])  # index -1 picks the trailing -1
    return list(table), indices
