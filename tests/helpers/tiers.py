"""Test tiers by cost: the markers a folder gives its tests, each test's time, and the budgets.

Every test in tests/multiprocess/ is `child` (starts processes) and every test in tests/commands/
is `e2e` (runs a whole command); elsewhere a test carries these markers, and `reference` (compares
with PyTorch or a reference package), explicitly. The markers only select: `make test` runs every
test whatever its marks.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
# tests/<folder>/... -> the marker each of its tests gets
FOLDER_MARKERS = {"multiprocess": "child", "commands": "e2e"}

# Seconds a single test may take (setup, call and teardown together) in each tier; a test in
# several tiers gets the largest. `slow` tests have the largest budget.
BUDGETS = {"fast": 30.0, "reference": 120.0, "child": 180.0, "e2e": 240.0, "slow": 420.0}

_durations: dict[str, float] = {}
_marks: dict[str, list[str]] = {}


def mark_items(items) -> None:
    for item in items:
        path = Path(item.path).resolve()
        folder = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else None
        if folder in FOLDER_MARKERS:
            item.add_marker(getattr(pytest.mark, FOLDER_MARKERS[folder]))
        _marks[item.nodeid] = sorted({m.name for m in item.iter_markers()} & (set(BUDGETS) - {"fast"}))
        item.user_properties.append((TIERS_PROPERTY, _marks[item.nodeid]))


def budget(marks) -> float:
    return max([BUDGETS[m] for m in marks if m in BUDGETS] or [BUDGETS["fast"]])


TIERS_PROPERTY = "clarifyjax_tiers"  # the item's tiers, carried by its reports' user_properties


def record(report) -> None:
    """A test phase's time; its tiers come with the report (`mark_items` puts them in the item's
    user_properties, which xdist sends along), so that the controller of an xdist run, which
    collects nothing itself, knows them too. (Not from the report's keywords: those hold the
    parameter ids too, and a test parametrized with "reference" is not a reference test.)"""
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + float(report.duration)
    for name, value in getattr(report, "user_properties", ()):
        if name == TIERS_PROPERTY:
            _marks[report.nodeid] = sorted(value)
    _marks.setdefault(report.nodeid, [])


def file_seconds(path: Path = TESTS / "durations.json") -> dict[str, float]:
    """Each test file's recorded time (tests/durations.json), {} before the first `make durations`."""
    if not path.exists():
        return {}
    totals: dict[str, float] = {}
    for node, row in json.loads(path.read_text()).items():
        totals[node.split("::")[0]] = totals.get(node.split("::")[0], 0.0) + row["seconds"]
    return totals


def longest_files_first(items) -> None:
    """Reorder `items` in place, whole files kept together, by each file's recorded time, longest
    first (files without a record first of all: they may be slow): with `--dist loadfile
    --no-loadscope-reorder` the two workers then take the long files first and finish together,
    instead of one worker running the slowest files alone at the end."""
    seconds = file_seconds()
    order = {}
    for i, item in enumerate(items):
        order.setdefault(item.nodeid.split("::")[0], i)
    key = {f: (-seconds.get(f, float("inf")), i) for f, i in order.items()}
    items.sort(key=lambda item: key[item.nodeid.split("::")[0]])


def summary(terminalreporter, config) -> None:
    if hasattr(config, "workerinput"):
        return
    over = sorted(((t, n) for n, t in _durations.items() if t > budget(_marks.get(n, ()))),
                  reverse=True)
    if over:
        terminalreporter.write_sep("-", "tests over their tier's time budget (tests/helpers/tiers.py)")
        for t, n in over:
            terminalreporter.write_line(f"{t:7.1f} s > {budget(_marks.get(n, ())):5.0f} s  {n}")
    path = os.environ.get("CLARIFYJAX_DURATIONS")
    if path and _durations:
        rows = {n: {"seconds": round(t, 2), "marks": _marks.get(n, [])}
                for n, t in sorted(_durations.items())}
        tmp = Path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
        terminalreporter.write_line(f"wrote {len(rows)} test durations to {path}")
