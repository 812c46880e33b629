"""Test tiers by cost: markers derived from the source, each test's time, and the time budgets.

A test is marked when its own source, the source of the fixtures it requests (from tests/, through
their own fixtures) or of the test module's helper functions it calls (two calls deep) matches a
tier's pattern. The markers only select: `make test` runs every test whatever its marks.
"""
from __future__ import annotations

import inspect
import json
import os
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

PATTERNS = {
    # starts a process: a child Python, fake devices, a launcher, a browser, a server process
    "child": re.compile(r"\b(run_child|run_with_fake_devices|run_processes|run_launcher|subprocess|"
                        r"Popen|multiprocessing|start_browser|webdriver|chromium)\b"),
    # runs a whole command: the CLIs' main, the demo, the README's commands
    "e2e": re.compile(r"\b(cli\.main|sage_cli\.main|main\(\[|run_cli|run_score_cli|demo\.main|"
                      r"readme_blocks|score_cli)\b|-m clarifyjax|\"clarifyjax\", \""),
    # compares with a reference implementation: PyTorch, transformers' models, reference packages
    "reference": re.compile(r"\b(torch|bert_score|sentence_transformers|tensorflow_text|rouge_score|"
                            r"nltk|scipy|krippendorff|lm_eval|sage_reference|bert_score_package|"
                            r"require\(|AutoModel\w*|\w+For(CausalLM|ConditionalGeneration|"
                            r"SequenceClassification|QuestionAnswering))\b"),
}
# Seconds a single test may take (setup, call and teardown together) in each tier; a test in
# several tiers gets the largest. `slow` tests have the largest budget.
BUDGETS = {"fast": 30.0, "reference": 120.0, "child": 180.0, "e2e": 240.0, "slow": 420.0}

_durations: dict[str, float] = {}
_marks: dict[str, list[str]] = {}


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _in_tests(obj) -> bool:
    try:
        return Path(inspect.getsourcefile(obj) or "").resolve().is_relative_to(TESTS)
    except TypeError:
        return False


def _fixture_sources(item) -> list[str]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    sources = []
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if _in_tests(fixturedef.func):
                sources.append(_source(fixturedef.func))
    return sources


def _called_helpers(source: str, module, depth: int = 2) -> list[str]:
    """The sources of the test module's own functions that `source` calls, `depth` calls deep."""
    found, frontier = [], [source]
    seen: set[str] = set()
    for _ in range(depth):
        nxt = []
        for text in frontier:
            for name in set(re.findall(r"\b([A-Za-z_]\w*)\(", text)) - seen:
                fn = getattr(module, name, None)
                if inspect.isfunction(fn) and _in_tests(fn) and not name.startswith("test_"):
                    seen.add(name)
                    nxt.append(_source(fn))
        found += nxt
        frontier = nxt
    return found


def tiers_of(item) -> list[str]:
    fn = getattr(item, "function", None)
    own = _source(fn) if fn is not None else ""
    texts = [own, *_fixture_sources(item)]
    texts += _called_helpers("\n".join(texts), getattr(item, "module", None))
    text = "\n".join(texts)
    return [tier for tier, pattern in PATTERNS.items() if pattern.search(text)]


def mark_items(items) -> None:
    import pytest

    for item in items:
        for tier in tiers_of(item):
            if tier not in {m.name for m in item.iter_markers()}:
                item.add_marker(getattr(pytest.mark, tier))
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
