"""The situations and questions a user hands to `clarifyjax score-questions`: one text per line,
or a column of a table, each checked (empty, invisible, unencodable) with its file and line named.

Reading the bytes (UTF-8 with an optional byte-order mark) is `clarifyjax.files.textfiles`'s; this module
adds the table formats (`clarifyjax.data.read_table`) and the tokenizer's encodability check, which
is why it sits above both.
"""
from __future__ import annotations

import os
from pathlib import Path

from clarifyjax.data import DataError, read_table
from clarifyjax.files.textfiles import TABLE_SUFFIXES, is_blank, read_text_file, split_lines
from clarifyjax.text.tokenizer import TextEncodingError, check_encodable


def read_texts(path: str | os.PathLike, column: str, *, limit: int | None = None
               ) -> tuple[list[str], list[str]]:
    """(texts, where) from a .tsv / .csv / .jsonl file (column `column`, header row) or any
    other file (one text per line). `where[i]` is "FILE:LINE".

    Raises:
      DataError: the file is missing, not UTF-8, empty, lacks the column, or a text is empty or
        cannot be tokenized (naming file and line).
    """
    path = Path(path)
    suffix = path.suffix.lower()  # Windows tools write ".CSV"
    if suffix == ".json":
        raise DataError(f"{path}: a .json file; give one JSON object per line in a .jsonl file")
    if suffix in TABLE_SUFFIXES:
        table = read_table(path, (column,), resolve=False)  # names file:line:column
        texts = [row[column] for row in table.rows]
        where = [table.where(i) for i in range(len(table))]
        kind = f"column {column!r}"
    else:
        texts = split_lines(read_text_file(path, error=DataError))
        where = [f"{path}:{i}" for i in range(1, len(texts) + 1)]
        kind = f"field {column!r}"
    if not texts:
        raise DataError(f"{path}: no {column}s in the file")
    for text, loc in zip(texts, where):
        if is_blank(text):
            raise DataError(f"{loc}: {kind} is empty")
    if limit is not None:
        texts, where = texts[:limit], where[:limit]
    try:
        check_encodable(texts)
    except TextEncodingError as e:
        raise DataError(f"{where[e.index]}: {column} {e.reason}") from e
    return texts, where


# --------------------------------------------------------------------------- output
