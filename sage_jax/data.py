"""SaGE input files -> questions with their texts -> padded [batch, n] index / mask / groups.

Two layouts, each as CSV, TSV or JSONL: the long format, one row per paraphrase (question id,
paraphrase, answer, rule of thumb; the default column names are the SaGE release's, e.g.
sage-mcc/q100_*_rot.csv), and the reference's pairs format (described above `read_pairs_format`).
Errors name the file, line and column (`clarifyjax.files.tables`'s rules); empty texts are kept
and masked out when batching; duplicates are handled as written above `_Repeats`."""
from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass, field
from collections.abc import Sequence

import numpy as np

from clarifyjax.files.tables import DataError, read_rows, text_cell
from sage_jax.metric import SIMILARITY_TOLERANCE

__all__ = ["FIELDS", "Columns", "DataError", "DataWarning", "Question", "TextBatch", "detect_format",
           "gather", "pair_matrix", "read_long_format", "read_pairs_format", "read_questions", "read_rows",
           "shared_texts", "text_batch"]

FIELDS = ("paraphrase", "answer", "rot")


class DataWarning(UserWarning):
    """Input that is read, but may not be what was meant; the message names the file and lines."""


@dataclass(frozen=True)
class Columns:
    """Column names of the text fields (long format) or their stems (pairs format: `stem_1`)."""

    question_id: str = "question_id"
    paraphrase: str = "paraphrased"
    answer: str = "model_output"
    rot: str = "rot"
    question: str = "question"  # the original question's text, when the file has it: only checked

    def __post_init__(self):
        names = {key: getattr(self, key) for key in ("question_id", *FIELDS)}
        for key, name in {**names, "question": self.question}.items():
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"{key} column name must be a non-empty string, got {name!r}")
        keys = list(names)
        for i, key in enumerate(keys):  # one column read as two fields is a mistake in the options
            other = next((k for k in keys[:i] if names[k] == names[key]), None)
            if other is not None:
                raise ValueError(f"{other} column and {key} column are both named {names[key]!r}")

    def name(self, field_name: str) -> str:
        if field_name not in FIELDS:
            raise ValueError(f"unknown text field {field_name!r}; expected one of {FIELDS}")
        return getattr(self, field_name)


@dataclass
class Question:
    """One question: its n paraphrases with the model's answer and rule of thumb for each.

    `paraphrases`, `answers`, `rots` are lists of n strings, or None where the file has no such
    column. `lines[i]` is the file line text i was read from. `pair_values` (pairs format only) maps
    a numeric column to its [n, n] symmetric matrix (NaN on the diagonal), read from the lines
    `pair_lines` [n, n] (-1 on the diagonal).
    """

    question_id: str
    paraphrases: list[str] | None
    answers: list[str] | None
    rots: list[str] | None
    source: str
    lines: list[int]
    pair_values: dict[str, np.ndarray] = field(default_factory=dict)
    pair_lines: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.lines)

    def texts(self, field_name: str) -> list[str]:
        values = {"paraphrase": self.paraphrases, "answer": self.answers, "rot": self.rots}[field_name]
        if values is None:
            raise DataError(f"{self.source}: no {field_name} column was read (question {self.question_id})")
        return values


# ----------------------------------------------------------------------------- reading rows


def _require_columns(path, header: Sequence[str], names: Sequence[str]) -> None:
    missing = [c for c in names if c not in header]
    if missing:
        hint = ""
        if len(header) == 1 and any(sep in header[0] for sep in ";|\t,"):
            hint = "; is it separated by another character? .csv files are read with ',' and .tsv with tabs"
        raise DataError(f"{path}: missing column{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(repr(c) for c in missing)} (the file has: {', '.join(header)}){hint}")


def _value(path, line_no: int, row: dict, column: str, optional: bool = False) -> str:
    if optional and row.get(column) is None:  # an optional column the file (or a JSONL object) lacks
        return ""
    return text_cell(row, column, f"{path}:{line_no}")


def _question_id(path, line_no: int, row: dict, columns: Columns) -> str:
    qid = _value(path, line_no, row, columns.question_id).strip()
    if not qid:
        raise DataError(f"{path}:{line_no}: empty {columns.question_id!r}")
    return qid


def _same_question(path, seen: dict, qid: str, line_no: int, row: dict, columns: Columns) -> None:
    """Refuse one question id given two different question texts (two questions merged)."""
    if columns.question in (columns.question_id, columns.paraphrase, columns.answer, columns.rot):
        return  # that column is read as a text field, whose values differ by design
    text = _value(path, line_no, row, columns.question, optional=True).strip()
    if not text:
        return
    first_text, first_line = seen.setdefault(qid, (text, line_no))
    if first_text != text:
        raise DataError(f"{path}:{line_no}: question id {qid!r} has a different {columns.question!r} "
                        f"than line {first_line} ({text[:60]!r} vs {first_text[:60]!r}); two questions "
                        "share one id")


# Duplicates, each decided by whether the tool can know what was meant:
# * one question id with two different texts in the `question` column (when the file has one):
#   refused, naming both lines (two questions would be merged into one with twice the texts);
# * a row that repeats an earlier row of the same question word for word: read, and reported by one
#   `DataWarning` naming the lines. It moves the score but is not always a mistake: the SaGE release
#   itself repeats a paraphrase within a question (q100_gpt-3.5-turbo_rot.csv, lines 318-319), and a
#   deterministic model then repeats its answer too. A pairs file whose repeated row breaks the
#   n(n-1)/2 combinations structure is refused by that check;
# * a long-format question with at least twice the median number of rows: read, and reported by a
#   `DataWarning` naming its lines (two questions sharing an id, where no `question` column tells).
class _Repeats:
    """Rows that repeat an earlier row of the same question word for word (warned, not refused)."""

    def __init__(self):
        self.first: dict = {}
        self.pairs: list[tuple[int, int]] = []

    def add(self, qid: str, line_no: int, row: dict) -> None:
        first = self.first.setdefault((qid, tuple(row.values())), line_no)
        if first != line_no:
            self.pairs.append((first, line_no))

    def warn(self, path) -> None:
        if self.pairs:
            shown = ", ".join(f"{b} = {a}" for a, b in self.pairs[:5]) + (", ..." if len(self.pairs) > 5 else "")
            warnings.warn(DataWarning(
                f"{path}: {len(self.pairs)} row{'s' if len(self.pairs) > 1 else ''} repeat an earlier row "
                f"of the same question word for word (lines {shown}); each is scored as one more text"),
                stacklevel=3)


def _warn_oversized(path, questions: list[Question]) -> None:
    """Warn about questions with >= 2x the median number of rows: two questions sharing an id?"""
    median = float(np.median([q.n for q in questions]))
    big = [q for q in questions if median >= 2 and q.n >= 2 * median]
    if big:
        q = big[0]
        lines = ", ".join(map(str, q.lines[:12])) + (", ..." if q.n > 12 else "")
        warnings.warn(DataWarning(
            f"{path}: question {q.question_id} has {q.n} rows where the median question has "
            f"{median:g} (lines {lines}){f' and {len(big) - 1} more such' if len(big) > 1 else ''}; "
            "two questions sharing one id are scored as one"), stacklevel=3)


# ----------------------------------------------------------------------------- the two layouts


def detect_format(header: Sequence[str], columns: Columns = Columns()) -> str:
    """'pairs' if the header has `<answer>_1` and `<answer>_2`, else 'long'."""
    if f"{columns.answer}_1" in header and f"{columns.answer}_2" in header:
        return "pairs"
    return "long"


def read_long_format(path, columns: Columns = Columns(), need: Sequence[str] = ("answer",), *,
              _header_rows=None) -> list[Question]:
    """Long format: one row per paraphrase; rows of a question need not be contiguous.

    `need` lists the text fields that must be present; the others are read when their column
    exists (else None). Duplicates: see above `_Repeats`.
    """
    header, rows = _header_rows or read_rows(path)
    _require_columns(path, header, [columns.question_id] + [columns.name(f) for f in need])
    present = [f for f in FIELDS if columns.name(f) in header]
    by_id: dict[str, dict] = {}
    question_texts: dict = {}
    repeats = _Repeats()
    for line_no, row in rows:
        qid = _question_id(path, line_no, row, columns)
        _same_question(path, question_texts, qid, line_no, row, columns)
        q = by_id.setdefault(qid, {"lines": [], **{f: [] for f in present}})
        q["lines"].append(line_no)
        for f in present:
            q[f].append(_value(path, line_no, row, columns.name(f), optional=f not in need))
        repeats.add(qid, line_no, row)
    if not by_id:
        raise DataError(f"{path}: no data rows")
    repeats.warn(path)
    questions = [Question(question_id=qid, paraphrases=q.get("paraphrase"), answers=q.get("answer"),
                          rots=q.get("rot"), source=str(path), lines=q["lines"])
                 for qid, q in by_id.items()]
    _warn_oversized(path, questions)
    return questions


def _triangular(m: int) -> int | None:
    n = int(round((1 + math.sqrt(1 + 8 * m)) / 2))
    return n if n * (n - 1) // 2 == m else None


def _numeric_columns(path, by_id: dict, candidates: Sequence[str], explicit: bool) -> dict[str, dict[int, float]]:
    """Parse the candidate weight columns (line -> value, NaN for an empty cell). In auto mode a
    column with a non-number anywhere is simply not a weight; an explicit one is an error."""
    numeric: dict[str, dict[int, float]] = {}
    for col in candidates:
        values: dict[int, float] = {}
        try:
            for line_no, row in itertools.chain.from_iterable(by_id.values()):
                raw = row.get(col)
                values[line_no] = math.nan if raw in (None, "") else float(raw)
        except ValueError:
            if explicit:
                raise DataError(f"{path}:{line_no}: column {col!r} is not a number: {raw!r}") from None
            continue
        numeric[col] = values
    return numeric


def _pairs_question(path, qid: str, pairs: list, present: list, text_cols: dict,
                    numeric: dict) -> Question:
    """Rebuild one question's n texts from its n(n-1)/2 pair rows (combinations order)."""
    n = _triangular(len(pairs))
    if n is None:
        raise DataError(f"{path}:{pairs[0][0]}: question {qid} has {len(pairs)} pair rows, which is "
                        "not n(n-1)/2 for any n (rows of a pairs file must cover every pair once)")
    combos = list(itertools.combinations(range(n), 2))
    texts: dict[int, tuple] = {}
    seen_at: dict[int, int] = {}
    for (i, j), (line_no, row) in zip(combos, pairs):
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
    per_field = {f: [texts[p][a] for p in range(n)] for a, f in enumerate(present)}
    pair_lines = np.full((n, n), -1, dtype=np.int64)
    for (i, j), (line_no, _) in zip(combos, pairs):
        pair_lines[i, j] = pair_lines[j, i] = line_no
    values = {}
    for col, by_line in numeric.items():
        mat = np.full((n, n), np.nan, dtype=np.float64)
        for (i, j), (line_no, _) in zip(combos, pairs):
            mat[i, j] = mat[j, i] = by_line[line_no]
        values[col] = mat
    return Question(question_id=qid, paraphrases=per_field.get("paraphrase"),
                    answers=per_field.get("answer"), rots=per_field.get("rot"), source=str(path),
                    lines=[seen_at[p] for p in range(n)], pair_values=values, pair_lines=pair_lines)


# The reference pairs format: one row per pair of paraphrases, `question_id, paraphrased_1,
# model_output_1, rot_1, paraphrased_2, model_output_2, rot_2` plus numeric edge-weight columns
# (`bleu_*`, `rouge_*`, `cosine_*`). The reference writes the pairs of n paraphrases in
# `itertools.combinations(range(n), 2)` order; each question's n texts are rebuilt from that order
# and must agree across the rows that mention them.
def read_pairs_format(path, columns: Columns = Columns(), need: Sequence[str] = ("answer",),
               weight_columns: Sequence[str] | None = None, *, _header_rows=None) -> list[Question]:
    """Reference pairs format: one row per pair (i < j) of paraphrases, in combinations order.

    weight_columns: numeric columns to keep as [n, n] matrices in `pair_values`, each checked to
    be in [-1, 1] for every pair; None keeps every other column whose values all parse as numbers
    (unchecked until `pair_matrix` uses one).
    """
    weight_columns = _weight_columns(weight_columns)
    header, rows = _header_rows or read_rows(path)
    text_cols = {f: (f"{columns.name(f)}_1", f"{columns.name(f)}_2") for f in FIELDS}
    _require_columns(path, header, [columns.question_id] + [c for f in need for c in text_cols[f]])
    present = [f for f in FIELDS if all(c in header for c in text_cols[f])]
    used = {columns.question_id, columns.question} | {c for f in present for c in text_cols[f]}
    if weight_columns is not None:
        _require_columns(path, header, weight_columns)
    candidates = weight_columns if weight_columns is not None else [c for c in header if c not in used]

    by_id: dict[str, list[tuple[int, dict]]] = {}
    question_texts: dict = {}
    repeats = _Repeats()
    for line_no, row in rows:
        qid = _question_id(path, line_no, row, columns)
        _same_question(path, question_texts, qid, line_no, row, columns)
        repeats.add(qid, line_no, row)
        by_id.setdefault(qid, []).append((line_no, row))
    if not by_id:
        raise DataError(f"{path}: no data rows")
    repeats.warn(path)
    numeric = _numeric_columns(path, by_id, candidates, explicit=weight_columns is not None)
    questions = [_pairs_question(path, qid, pairs, present, text_cols, numeric) for qid, pairs in by_id.items()]
    for col in weight_columns or ():
        for q in questions:
            _check_weights(q, col)
    return questions


def _weight_columns(weight_columns) -> list[str] | None:
    if weight_columns is None:
        return None
    if isinstance(weight_columns, str):  # list("cosine_rot") would be eleven one-letter columns
        raise ValueError(f"weight_columns must be a list of column names, got the string {weight_columns!r}")
    weight_columns = list(weight_columns)
    if not all(isinstance(c, str) and c.strip() for c in weight_columns):
        raise ValueError(f"weight_columns must be non-empty column names, got {weight_columns!r}")
    return weight_columns


def read_questions(path, *, format: str = "auto", columns: Columns | None = None,
                   need: Sequence[str] = ("answer",), weight_columns: Sequence[str] | None = None
                   ) -> list[Question]:
    """Read a long or pairs file (format 'auto' decides from the header)."""
    if format not in ("auto", "long", "pairs"):
        raise ValueError(f"format must be 'auto', 'long' or 'pairs', got {format!r}")
    columns = columns or Columns()
    for f in need:
        columns.name(f)  # an unknown field is a ValueError before the file is read
    header, rows = read_rows(path)
    if format == "auto":
        format = detect_format(header, columns)
    if format == "long":
        if weight_columns:
            raise DataError(f"{path}: edge-weight columns {list(weight_columns)} need a pairs file")
        return read_long_format(path, columns, need, _header_rows=(header, rows))
    return read_pairs_format(path, columns, need, weight_columns, _header_rows=(header, rows))


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
    n_max = _n_max(questions, n_max)
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


def _check_weights(q: Question, column: str) -> None:
    """Every pair of `q` has a similarity in [-1, 1] in `column`, else a DataError naming the line."""
    if column not in q.pair_values:
        raise DataError(f"{q.source}: no numeric pair column {column!r} "
                        f"(has: {', '.join(q.pair_values) or 'none; is it a pairs file?'})")
    values = q.pair_values[column]
    bad = ~np.eye(q.n, dtype=bool) & ~(np.abs(values) <= 1.0 + SIMILARITY_TOLERANCE)  # NaN is bad
    if bad.any():
        i, j = np.argwhere(bad)[0]
        value = values[i, j]
        what = "is empty or NaN" if np.isnan(value) else f"is {float(value)!r}, outside [-1, 1]"
        line = q.pair_lines[i, j] if q.pair_lines is not None else q.lines[0]
        raise DataError(f"{q.source}:{line}: column {column!r} {what} (question {q.question_id}, "
                        f"texts {i} and {j}); edge weights must be similarities in [-1, 1]")


def _n_max(questions: Sequence[Question], n_max) -> int:
    largest = max((q.n for q in questions), default=1)
    if n_max is None:
        return largest
    if isinstance(n_max, bool) or not isinstance(n_max, (int, np.integer)) or n_max < 1:
        raise ValueError(f"n_max must be a positive integer, got {n_max!r}")
    return int(n_max)


# Edge-weight columns must hold a number in [-1, 1] for every pair (up to float32 rounding,
# `SIMILARITY_TOLERANCE`): empty cells, NaN, inf and values outside are refused with the line.
def pair_matrix(questions: Sequence[Question], column: str, n_max: int | None = None) -> np.ndarray:
    """A pairs file's numeric column as [batch, n_max, n_max] edge weights (0 at padding); every
    pair must hold a number in [-1, 1] (a DataError naming the line otherwise)."""
    n_max = _n_max(questions, n_max)
    out = np.zeros((len(questions), n_max, n_max), dtype=np.float32)
    for b, q in enumerate(questions):
        _check_weights(q, column)
        if q.n > n_max:
            raise DataError(f"{q.source}:{q.lines[0]}: question {q.question_id} has {q.n} texts, "
                            f"more than n_max={n_max}")
        out[b, :q.n, :q.n] = np.clip(np.nan_to_num(q.pair_values[column], nan=0.0), -1.0, 1.0)
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
