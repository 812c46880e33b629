"""Data files: finding them (`resolve_data_path`: a path the user gave must exist) and reading them
as rows (`read_rows`) or as tables with required columns (`read_table`), UTF-8 CSV, TSV or JSONL.
Every problem is a `DataError` naming the file, and the line and column where there is one. Both
packages read their inputs here; `clarifyjax.data` builds pairs and batches on top."""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from pathlib import Path
from collections.abc import Iterator, Sequence

from clarifyjax.files.textfiles import decode_utf8, read_text_file, unencodable

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout, or site-packages when installed
# The data folder: relative data paths of a config (a preset's `delta-clarify/train.tsv`) are read
# from it. The commands' --data-dir sets the variable, so that child processes inherit it.
DATA_ENV = "CLARIFYJAX_DATA"
DATA_OPTION = "--data-dir"


class DataError(ValueError):
    """A data file that cannot be read as asked; the message names the file, line and column."""


# --------------------------------------------------------------------------- files and tables


def data_dir() -> Path | None:
    """The data folder: ``$CLARIFYJAX_DATA`` (which ``--data-dir`` sets); else, in a checkout of
    the repository only, ``../shared/data`` beside it; else None. Never the installed package.

    Raises:
      DataError: the variable names no folder (one line naming it and the option).
    """
    env = os.environ.get(DATA_ENV, "").strip()
    if env:
        folder = Path(env).expanduser()
        if not folder.is_dir():
            raise DataError(f"{DATA_ENV}={env}: no such data folder (name the folder holding the data "
                            f"files with {DATA_OPTION} or {DATA_ENV})")
        return folder
    if (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "clarifyjax").is_dir():
        return REPO_ROOT.parent / "shared" / "data"
    return None


def use_data_dir(folder: str | os.PathLike) -> None:
    """``--data-dir FOLDER``: the data folder of this run and of the processes it starts."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise DataError(f"{DATA_OPTION} {folder}: no such data folder (the folder holding the data files; "
                        f"{DATA_ENV} names it too)")
    os.environ[DATA_ENV] = str(path.resolve())


def _candidates(path: Path) -> list[Path]:
    if path.is_absolute():
        return [path]
    candidates, folder = [Path.cwd() / path], data_dir()
    if folder is not None:
        candidates.append(folder / path)
        parts = path.parts  # a config written for the checkout's layout: ../shared/data/x -> DATA/x
        for i in range(len(parts) - 1):
            if parts[i:i + 2] == ("shared", "data"):
                candidates.append(folder.joinpath(*parts[i + 2:]))
    return candidates


def resolve_data_path(path: str | os.PathLike, option: str | None = None) -> Path:
    """Find a data file: as given (relative to the working directory), else in the data folder
    (`data_dir`; a ``.../shared/data/X`` path as the data folder's X too).

    There is no fallback to the project's example files: a run must train on the file it names
    (only `clarifyjax.demo` chooses the examples, and says so).

    Raises:
      DataError: none of these exists; one line naming `option` (e.g. ``data.train_path``), the
        path and every place looked at (and, without a data folder, how to name one).
    """
    path = Path(path).expanduser()
    candidates = _candidates(path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    where = f"{option}: " if option else ""
    hint = "" if path.is_absolute() or data_dir() is not None else (
        f"; relative data paths are read from the data folder: name it with {DATA_OPTION} or {DATA_ENV}")
    raise DataError(f"{where}data file not found: {path} (looked at "
                    f"{', '.join(str(c) for c in candidates)}){hint}")


def check_data_paths(data, at: str = "data") -> None:
    """Resolve every ``*_path`` of a data config (`SFTDataConfig`, `PPODataConfig`), so that a
    missing file stops a run before any model is built, naming its option.

    Raises:
      DataError: see `resolve_data_path`.
    """
    for field in dataclasses.fields(data):
        value = getattr(data, field.name)
        if field.name.endswith("_path") and value is not None:
            resolve_data_path(value, f"{at}.{field.name}")


@dataclasses.dataclass(frozen=True)
class Table:
    """Rows of one file: ``rows[i][column]`` is a str; ``lines[i]`` its 1-based line number."""

    path: Path
    columns: tuple[str, ...]
    rows: list[dict[str, str]]
    lines: list[int]

    def where(self, i: int) -> str:
        return f"{self.path}:{self.lines[i]}"

    def __len__(self) -> int:
        return len(self.rows)


def read_table(path: str | os.PathLike, columns: Sequence[str], *, resolve: bool = True) -> Table:
    """Read a ``.tsv`` / ``.csv`` (header row, standard quoting) or ``.jsonl`` file.

    Args:
      columns: the columns that must exist and hold text in every row.
    Raises:
      DataError: missing file, missing column (naming it and the columns found), a row with the
        wrong number of fields or an empty required field (naming file and line), bad JSON.
    """
    path = resolve_data_path(path) if resolve else Path(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    header, records = read_rows(path)
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; the file has columns {list(header)}")
    rows, lines = [], []
    for line, record in records:
        for c in columns:
            value = record[c]
            if value is NOT_TEXT:
                raise DataError(f"{path}:{line}: column {c!r} holds a JSON array or object, not text")
            if value is None or not value.strip():
                raise DataError(f"{path}:{line}: column {c!r} is empty")
        rows.append({k: "" if v is None else str(v) for k, v in record.items()})
        lines.append(line)
    return Table(path, tuple(header), rows, lines)


# --------------------------------------------------------------------------- rows


class _NotText(str):
    """A JSON array or object where a cell should be; refused by the readers where it is used."""


NOT_TEXT = _NotText("<JSON array or object>")


def text_cell(row: dict, column: str, where: str) -> str:
    """`row[column]` of a row of `read_rows` as text; `where` ("file:line") names it in the
    `DataError` for a key a JSONL object lacks and for a JSON array or object, which would
    otherwise reach a model as the words of `NOT_TEXT`."""
    value = row.get(column)
    if value is None:
        raise DataError(f"{where}: missing field {column!r}")
    if value is NOT_TEXT:
        raise DataError(f"{where}: field {column!r} is a JSON array or object, expected text")
    return value


def file_kind(path: Path) -> str:
    """"csv", "tsv" or "jsonl", from the file's suffix (any case: Windows tools write ".CSV")."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".tsv", ".tab"):
        return "tsv"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    raise DataError(f"{path}: unknown file type {suffix!r}; expected .csv, .tsv or .jsonl")


def read_rows(path: str | os.PathLike, data: bytes | None = None
              ) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    """The header and an iterator of (line number, row as column -> string) of a CSV/TSV/JSONL file.

    CSV / TSV: blank lines skipped; the first non-blank line is the header, its names distinct;
    every row has exactly the header's field count; an unclosed quote is an error (not the rest of
    the file as one field). JSONL: one object per line, keys distinct, no NaN / Infinity, no lone
    surrogate such as "\\ud800" (it would fail in the tokenizer later). A JSON null reads as "", a
    number as its text, an array or object as `NOT_TEXT`, refused where the field is needed.

    The header of a JSONL file is the union of the keys of its objects, in order of appearance; a
    key missing from one object reads as None there (callers report it when the field is needed).
    `data`: the file's bytes, when the caller holds them (a file it writes only after its checks);
    `path` then only names the file.
    """
    path = Path(path)
    kind = file_kind(path)
    text = read_text_file(path, error=DataError) if data is None else decode_utf8(data, str(path), error=DataError)
    if kind == "jsonl":
        header, rows = _jsonl_rows(path, text)
    else:
        header, rows = _csv_rows(path, text, "," if kind == "csv" else "\t")
    return header, iter(rows)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return NOT_TEXT
    return str(value)


def _json_object(path: Path, line_no: int, line: str) -> dict:
    def pairs(items):
        keys = [k for k, _ in items]
        twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        if twice is not None:  # json.loads would keep the last value silently
            raise DataError(f"{path}:{line_no}: key {twice!r} appears twice in one object")
        return dict(items)

    def constant(name):
        raise DataError(f"{path}:{line_no}: {name} is not valid JSON (write null for a missing "
                        "value)")

    try:
        obj = json.loads(line, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{line_no}: malformed JSON ({e.msg})") from e
    except RecursionError:
        raise DataError(f"{path}:{line_no}: malformed JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}")
    for key, value in obj.items():
        for text in (key, value):
            at = unencodable(text) if isinstance(text, str) else None
            if at is not None:
                raise DataError(f"{path}:{line_no}: field {key!r} holds {text[at]!r} (a lone "
                                "surrogate), which is not encodable text")
    return obj


def jsonl_objects(path: str | os.PathLike) -> list[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSONL file, values as JSON gave them
    (for rows whose fields are lists, numbers or objects), with the same checks as `read_rows`."""
    path = Path(path)
    text = read_text_file(path, error=DataError)
    objects = [(n, _json_object(path, n, line))
               for n, line in enumerate(io.StringIO(text, newline=None), start=1) if line.strip()]
    if not objects:
        raise DataError(f"{path}: empty file")
    return objects


def _jsonl_rows(path: Path, text: str) -> tuple[list[str], list[tuple[int, dict]]]:
    records: list[tuple[int, dict]] = []
    header: dict[str, None] = {}
    for line_no, line in enumerate(io.StringIO(text, newline=None), start=1):
        if line.strip():
            obj = _json_object(path, line_no, line)
            header.update(dict.fromkeys(obj))
            records.append((line_no, obj))
    if not records:
        raise DataError(f"{path}: empty file")
    return list(header), [(n, {k: (_cell(obj[k]) if k in obj else None) for k in header})
                          for n, obj in records]


def _blank(row: list[str]) -> bool:
    return not row or all(not cell.strip() for cell in row)


# Python's csv module stops at fields over 128 KiB by default; a long answer or rule of thumb that
# the project wrote itself (answers.csv, a questions file) must read back.
FIELD_SIZE_LIMIT = 2 ** 31 - 1


def _csv_rows(path: Path, text: str, delimiter: str) -> tuple[list[str], list[tuple[int, dict]]]:
    if csv.field_size_limit() < FIELD_SIZE_LIMIT:
        csv.field_size_limit(FIELD_SIZE_LIMIT)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    header, rows = None, []
    while True:
        start = reader.line_num + 1  # where the next record begins (it may span several lines)
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            what = "header" if header is None else "row"
            raise DataError(f"{path}:{start}: malformed {what} ({e})") from None
        if _blank(row):
            continue
        if header is None:
            header = [h.strip() for h in row]
            named = [h for h in header if h]
            twice = next((h for i, h in enumerate(named) if h in named[:i]), None)
            if twice is not None:  # a dict per row would keep only the last such column
                raise DataError(f"{path}:{start}: column {twice!r} appears twice in the header")
        elif len(row) != len(header):
            raise DataError(f"{path}:{start}: malformed row: {len(row)} fields, the header has "
                            f"{len(header)} ({delimiter!r}-separated)")
        else:
            rows.append((start, dict(zip(header, row))))
    if header is None:
        raise DataError(f"{path}: empty file")
    return header, rows
