"""Data files: finding them (`resolve_data_path`: a path the user gave must exist) and reading them
as tables (`read_table`: TSV / CSV / JSONL with each row's line number). Every problem is a
`DataError` naming the file, and the line and column where there is one.

`clarifyjax.data` builds pairs and batches on top and re-exports these names.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from pathlib import Path
from typing import Sequence

from clarifyjax.textfiles import read_text_file

REPO_ROOT = Path(__file__).resolve().parents[1]


class DataError(ValueError):
    """A data file that cannot be read as asked; the message names the file, line and column."""


# --------------------------------------------------------------------------- files and tables


def _candidates(path: Path) -> list[Path]:
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, REPO_ROOT / path]
    parts = path.parts
    env = os.environ.get("CLARIFYJAX_SHARED_DATA")
    for i in range(len(parts) - 1):
        if env and parts[i:i + 2] == ("shared", "data"):
            candidates.append(Path(env).joinpath(*parts[i + 2:]))
    return candidates


def resolve_data_path(path: str | os.PathLike, option: str | None = None) -> Path:
    """Find a data file: as given (relative to the working directory), else relative to the
    repository root, else ``$CLARIFYJAX_SHARED_DATA`` for a ``.../shared/data/...`` path.

    There is no fallback to the project's example files: a run must train on the file it names
    (only `clarifyjax.demo` chooses the examples, and says so).

    Raises:
      DataError: none of these exists; one line naming `option` (e.g. ``data.train_path``), the
        path and every place looked at.
    """
    path = Path(path).expanduser()
    candidates = _candidates(path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    where = f"{option}: " if option else ""
    raise DataError(f"{where}data file not found: {path} (looked at "
                    f"{', '.join(str(c) for c in candidates)})")


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


def read_table(path: str | os.PathLike, columns: Sequence[str], *,
               delimiter: str | None = None, resolve: bool = True) -> Table:
    """Read a ``.tsv`` / ``.csv`` (header row, standard quoting) or ``.jsonl`` file.

    Args:
      columns: the columns that must exist and be non-empty in every row.
      delimiter: override the one implied by the suffix (tab for .tsv, comma otherwise).
    Raises:
      DataError: missing file, missing column (naming it and the columns found), a row with the
        wrong number of fields or an empty required field (naming file and line), bad JSON.
    """
    path = resolve_data_path(path) if resolve else Path(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    suffix = path.suffix.lower()  # Windows tools write ".CSV"
    if suffix == ".jsonl":
        header, records = _read_jsonl(path)
    else:
        sep = delimiter or ("\t" if suffix == ".tsv" else ",")
        header, records = _read_delimited(path, sep)
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; the file has columns {list(header)}")
    rows, lines = [], []
    for line, record in records:
        for c in columns:
            value = record.get(c)
            if value is None or not str(value).strip():
                raise DataError(f"{path}:{line}: column {c!r} is empty")
        rows.append({k: str(v) for k, v in record.items()})
        lines.append(line)
    return Table(path, tuple(header), rows, lines)


def _read_delimited(path: Path, sep: str):
    with io.StringIO(read_text_file(path, error=DataError), newline="") as f:
        reader = csv.reader(f, delimiter=sep, strict=True)
        try:
            header = next(reader, None)
            if not header:
                raise DataError(f"{path}: empty file (no header row)")
            header = [h.strip() for h in header]
            records, start = [], reader.line_num + 1
            for fields in reader:
                if fields and len(fields) != len(header):
                    raise DataError(f"{path}:{start}: malformed row: {len(fields)} fields, the "
                                    f"header has {len(header)} ({sep!r}-separated)")
                if fields:
                    records.append((start, dict(zip(header, fields))))
                start = reader.line_num + 1
        except csv.Error as e:
            raise DataError(f"{path}:{reader.line_num}: malformed row: {e}") from e
    return header, records


def _read_jsonl(path: Path):
    records, header = [], {}
    with io.StringIO(read_text_file(path, error=DataError)) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{line_no}: malformed JSON: {e.msg}") from e
            if not isinstance(record, dict):
                raise DataError(f"{path}:{line_no}: expected a JSON object per line")
            header.update(dict.fromkeys(record))
            records.append((line_no, record))
    return list(header), records
