"""Every test's recorded time is within its tier's budget (tests/helpers/tiers.py), so a test that
grows slow is flagged here, not only felt.

`make durations` records two files on the 2-core machine that CI runs on: tests/durations.json,
every test's setup + call + teardown in a whole `make test` run (three workers), and
tests/durations_fast.json, the fast tier's tests in a `make test-fast` run (two workers). A fast test is judged by
its time in the fast run: in the whole run it shares the machine with the heavy tests' child
processes, which stretch it two- or threefold. A renamed test gets a fresh entry.
"""
from __future__ import annotations

import json

import pytest

from helpers.env import REPO_ROOT
from helpers import tiers

DURATIONS = REPO_ROOT / "tests" / "durations.json"
FAST_DURATIONS = REPO_ROOT / "tests" / "durations_fast.json"
SLOW_TIERS = {"slow", "child", "e2e", "reference"}


@pytest.fixture(scope="module")
def recorded() -> dict:
    rows = json.loads(DURATIONS.read_text())
    assert len(rows) > 500, f"{DURATIONS}: {len(rows)} tests; run `make durations` on a full suite"
    return rows


@pytest.fixture(scope="module")
def recorded_fast(recorded) -> dict:
    rows = json.loads(FAST_DURATIONS.read_text())
    assert len(rows) > 400, f"{FAST_DURATIONS}: {len(rows)} tests; run `make durations-fast`"
    slow = {node for node, row in rows.items() if SLOW_TIERS & set(row["marks"])}
    slow |= {node for node in rows if SLOW_TIERS & set(recorded.get(node, {}).get("marks", []))}
    assert not slow, f"{FAST_DURATIONS} holds tests outside the fast tier: {sorted(slow)[:5]}"
    return rows


def test_every_recorded_test_is_within_its_tiers_budget(recorded, recorded_fast):
    seconds = {node: recorded_fast.get(node, row)["seconds"] for node, row in recorded.items()}
    over = {node: f"{seconds[node]} s > {tiers.budget(row['marks'])} s ({row['marks'] or 'fast'})"
            for node, row in recorded.items() if seconds[node] > tiers.budget(row["marks"])}
    assert not over, over


def test_the_fast_tier_fits_in_five_minutes_on_two_workers(recorded_fast):
    """`make test-fast` (no slow, child, e2e or reference test) in under 5 minutes: the fast run's
    recorded time, shared by two workers, with whole files on one worker each (--dist loadfile)."""
    per_file: dict[str, float] = {}
    for node, row in recorded_fast.items():
        per_file[node.split("::")[0]] = per_file.get(node.split("::")[0], 0.0) + row["seconds"]
    workers = [0.0, 0.0]
    for seconds in sorted(per_file.values(), reverse=True):  # longest file first, to the idler
        workers[workers.index(min(workers))] += seconds
    assert max(workers) < 300, f"make test-fast would take about {max(workers):.0f} s"


def test_the_budget_rule_flags_a_slow_test():
    assert tiers.budget([]) == tiers.BUDGETS["fast"] < tiers.budget(["child"]) <= tiers.budget(["slow"])
    assert tiers.budget(["reference", "e2e"]) == max(tiers.BUDGETS["reference"], tiers.BUDGETS["e2e"])
