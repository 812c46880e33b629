"""The situations and questions a user hands to `clarifyjax score-questions`: one text per line,
or a column of a table, each checked (empty, invisible, unencodable) with its file and line named.

Reading the bytes (UTF-8 with an optional byte-order mark) is `clarifyjax.files.textfiles`'s; this module
adds the table formats (`clarifyjax.files.tables.read_table`) and checks each text by the one rule of a
user's text (`textfiles.text_problem`: a JSON number is not a situation; empty, invisible, NUL and
lone surrogates are refused).
"""
from __future__ import annotations

import os
from pathlib import Path

from clarifyjax.files.tables import DataError, read_table
from clarifyjax.files.tables import jsonl_objects
from clarifyjax.files.textfiles import (TABLE_SUFFIXES, is_blank, read_text_file, split_lines,
                                        text_problem)


def read_texts(path: str | os.PathLike, column: str, *, limit: int | None = None
               ) -> tuple[list[str], list[str]]:
    """(texts, where) from a .tsv / .csv / .jsonl file (column `column`, header row) or any
    other file (one text per line). `where[i]` is "FILE:LINE".

    Raises:
      DataError: the file is missing, not UTF-8, empty, lacks the column, or a text breaks
        `textfiles.text_problem`: not a string in JSON, empty or invisible, a NUL or lone
        surrogate (naming file and line).
    """
    path = Path(path)
    suffix = path.suffix.lower()  # Windows tools write ".CSV"
    if suffix == ".json":
        raise DataError(f"{path}: a .json file; give one JSON object per line in a .jsonl file")
    if suffix in TABLE_SUFFIXES:
        table = read_table(path, (column,), resolve=False)  # names file:line:column
        texts = [row[column] for row in table.rows]
        where = [table.where(i) for i in range(len(table))]
        kind = f"{'field' if suffix == '.jsonl' else 'column'} {column!r}"
    else:
        texts = split_lines(read_text_file(path, error=DataError))
        where = [f"{path}:{i}" for i in range(1, len(texts) + 1)]
        kind = f"field {column!r}"
    if not texts:
        raise DataError(f"{path}: no {column}s in the file")
    if suffix == ".jsonl":  # the reader gives every cell as text; a JSON 5 is not a situation
        for line, obj in jsonl_objects(path):
            if obj.get(column) is not None and not isinstance(obj[column], str):
                raise DataError(f"{path}:{line}: {kind} {text_problem(obj[column])}")
    for text, loc in zip(texts, where):
        if is_blank(text):
            raise DataError(f"{loc}: {kind} {text_problem(text)}")
    if limit is not None:
        texts, where = texts[:limit], where[:limit]
    for text, loc in zip(texts, where):
        problem = text_problem(text)
        if problem is not None:
            raise DataError(f"{loc}: {column} {problem}")
    return texts, where


# --------------------------------------------------------------------------- output
