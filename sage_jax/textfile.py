"""Reading a CSV / TSV / JSONL input file into rows, refusing what is not what it claims to be.

* Every file is read as UTF-8 with an optional byte-order mark (Excel's "CSV UTF-8" starts with
  one); bytes that are not UTF-8 are an error naming the file, the line and the byte (with a hint
  for UTF-16, Excel's "Unicode text").
* A file that cannot be opened (a folder, no permission) is a DataError naming it, not an OSError.
* CSV / TSV: blank lines are skipped; the first non-blank line is the header, whose column names
  must be distinct; every row needs exactly as many fields as the header.
* JSONL: one object per line, keys distinct within it, no NaN / Infinity (not JSON, and no text),
  no string holding a lone surrogate such as "\\ud800" (not encodable text: it would fail inside
  the tokenizer later).

A cell reads as a string; a JSON null as ""; a JSON array or object as NOT_TEXT, which the readers
refuse where the field is needed.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Iterator

from clarifyjax.textfiles import unencodable


class DataError(ValueError):
    """An input file that cannot be read as asked; the message names the file, line or column."""


class _NotText(str):
    """A JSON array or object where a cell should be; refused by the readers where it is used."""


NOT_TEXT = _NotText("<JSON array or object>")


def file_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".tsv", ".tab"):
        return "tsv"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    raise DataError(f"{path}: unknown file type {suffix!r}; expected .csv, .tsv or .jsonl")


def read_text(path: Path) -> str:
    """The file's text: UTF-8, with or without a byte-order mark."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"input file not found: {path}") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, not a file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        hint = (" (it starts with a UTF-16 byte-order mark: save it as UTF-8)"
                if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "; save it as UTF-8")
        raise DataError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start}){hint}") from None


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
        raise DataError(f"{path}:{line_no}: {name} is not valid JSON (write null for a missing value)")

    try:
        obj = json.loads(line, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{line_no}: invalid JSON ({e.msg})") from e
    except RecursionError:
        raise DataError(f"{path}:{line_no}: invalid JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}")
    for key, value in obj.items():
        for text in (key, value):
            at = unencodable(text) if isinstance(text, str) else None
            if at is not None:
                raise DataError(f"{path}:{line_no}: field {key!r} holds {text[at]!r} (a lone surrogate), "
                                "which is not encodable text")
    return obj


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


def _csv_rows(path: Path, text: str, delimiter: str) -> tuple[list[str], list[tuple[int, dict]]]:
    # strict: a quote that is never closed is an error, not the rest of the file read as one field.
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    header, rows, start = None, [], 1
    while True:
        start = reader.line_num + 1  # where the next record begins (it may span several lines)
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise DataError(f"{path}:{start}: malformed {'header' if header is None else 'row'} ({e})") from None
        if _blank(row):
            continue
        if header is None:
            header = [h.strip() for h in row]
            named = [h for h in header if h]
            twice = next((h for i, h in enumerate(named) if h in named[:i]), None)
            if twice is not None:  # a dict per row would keep only the last such column
                raise DataError(f"{path}:{start}: column {twice!r} appears twice in the header")
        elif len(row) != len(header):
            raise DataError(f"{path}:{start}: malformed row: {len(row)} fields, the header has {len(header)}")
        else:
            rows.append((start, dict(zip(header, row))))
    if header is None:
        raise DataError(f"{path}: empty file")
    return header, rows


def read_rows(path: str | os.PathLike) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    """The header and an iterator of (line number, row as column -> string) of a CSV/TSV/JSONL file.

    The header of a JSONL file is the union of the keys of its objects, in order of appearance; a
    key missing from one object reads as None there (callers report it when the field is needed).
    """
    path = Path(path)
    kind = file_kind(path)
    text = read_text(path)
    if kind == "jsonl":
        header, rows = _jsonl_rows(path, text)
    else:
        header, rows = _csv_rows(path, text, "," if kind == "csv" else "\t")
    return header, iter(rows)

