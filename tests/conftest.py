"""pytest's hook file for tests/. The helpers live in the `helpers` package; the names below stay
importable as ``from conftest import ...``.

Markers by cost are derived here, from the source of each test, of the fixtures it uses and of the
module's helper functions it calls (`helpers.tiers`): ``child`` (starts processes), ``e2e`` (runs a
whole command), ``reference`` (compares with PyTorch or a reference package). ``make test-fast``
deselects them and ``slow``. Each test's time is recorded; ``CLARIFYJAX_DURATIONS=FILE`` writes the
times to FILE at the end (``make durations``), and the summary names any test over its tier's budget.
"""
from helpers import compile_cache

compile_cache.configure()  # before any test module imports jax

from helpers.env import REPO_ROOT, in_ci, require, shared_data, shared_data_dir  # noqa: E402
from helpers import tiers  # noqa: E402

__all__ = ["REPO_ROOT", "in_ci", "require", "shared_data", "shared_data_dir"]


def pytest_collection_modifyitems(config, items):
    tiers.mark_items(items)
    tiers.longest_files_first(items)


def pytest_runtest_logreport(report):
    tiers.record(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tiers.summary(terminalreporter, config)


def pytest_unconfigure(config):
    compile_cache.cleanup()
