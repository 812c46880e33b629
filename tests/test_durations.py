"""Every test's recorded time (tests/durations.json, written by `make durations`) is within its
tier's budget (tests/helpers/tiers.py), so a test that grows slow is flagged here, not only felt.

The file records each test's setup + call + teardown on the 2-core machine that CI runs on, with
`make test`'s two workers; its tests must all still exist (a renamed test gets a fresh entry).
"""
from __future__ import annotations

import json

import pytest

from conftest import REPO_ROOT
from helpers import tiers

DURATIONS = REPO_ROOT / "tests" / "durations.json"


@pytest.fixture(scope="module")
def recorded() -> dict:
    rows = json.loads(DURATIONS.read_text())
    assert len(rows) > 500, f"{DURATIONS}: {len(rows)} tests; run `make durations` on a full suite"
    return rows


def test_every_recorded_test_is_within_its_tiers_budget(recorded):
    over = {node: f"{row['seconds']} s > {tiers.budget(row['marks'])} s ({row['marks'] or 'fast'})"
            for node, row in recorded.items() if row["seconds"] > tiers.budget(row["marks"])}
    assert not over, over


def test_the_fast_tier_fits_in_five_minutes_on_two_workers(recorded):
    """`make test-fast` (no slow, child, e2e or reference test) in under 5 minutes: its recorded
    time, shared by two workers, with whole files on one worker each (--dist loadfile)."""
    slow_tiers = {"slow", "child", "e2e", "reference"}
    per_file: dict[str, float] = {}
    for node, row in recorded.items():
        if not slow_tiers & set(row["marks"]):
            per_file[node.split("::")[0]] = per_file.get(node.split("::")[0], 0.0) + row["seconds"]
    workers = [0.0, 0.0]
    for seconds in sorted(per_file.values(), reverse=True):  # longest file first, to the idler
        workers[workers.index(min(workers))] += seconds
    assert max(workers) < 300, f"make test-fast would take about {max(workers):.0f} s"


def test_the_budget_rule_flags_a_slow_test():
    assert tiers.budget([]) == tiers.BUDGETS["fast"] < tiers.budget(["child"]) <= tiers.budget(["slow"])
    assert tiers.budget(["reference", "e2e"]) == max(tiers.BUDGETS["reference"], tiers.BUDGETS["e2e"])
