"""The rows of a Markdown table in a docs file, for the tests that check a table against configs."""
from __future__ import annotations


def table_rows(lines: list[str], start: int, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of the first table at or after line index `start`, as {column: cell}; its header
    must be `columns` and its second line the `---` separator."""
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    table = lines[first:end]
    header = tuple(c.strip() for c in table[0].strip("|").split("|"))
    assert header == columns, header
    assert set(table[1].replace("|", "").strip()) <= {"-"}, table[1]
    rows = []
    for line in table[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(columns), line
        rows.append(dict(zip(columns, cells)))
    return rows
