"""The checkout guard (tests/helpers/checkout_guard.py): a test run fails, naming the path and the
test, when a test or one of its children reads or writes under the checkout's runs/, and the
checkout's snapshot names every file added, changed or removed."""
from __future__ import annotations

import os
import subprocess
import sys

from helpers import checkout_guard
from helpers.children import clean_env
from helpers.env import REPO_ROOT

TOUCHING = f'''
import os, subprocess, sys
RUNS = {str(REPO_ROOT / "runs")!r}

def test_reads_runs():
    try:
        open(os.path.join(RUNS, "no_such_run", "metrics.jsonl")).close()
    except FileNotFoundError:
        pass

def test_writes_runs():
    try:
        open(os.path.join(RUNS, "no_such_run", "new.txt"), "w").close()
    except FileNotFoundError:  # the folder is not there: nothing is written
        pass

def test_a_child_lists_runs():
    code = "import os\\ntry: os.listdir(os.path.join(%r, 'no_such_run'))\\nexcept OSError: pass" % RUNS
    subprocess.run([sys.executable, "-c", code], check=True)

def test_touches_nothing():
    open("here.txt", "w").close()  # the test's own folder
'''


def test_a_run_that_touches_runs_fails_and_names_each_access(tmp_path):
    (tmp_path / "test_touching.py").write_text(TOUCHING)
    env = {k: v for k, v in clean_env().items()
           if k not in (checkout_guard.LOG_ENV, checkout_guard.OWNER_ENV, "PYTEST_CURRENT_TEST",
                        "CLARIFYJAX_DURATIONS")}  # `make durations` records the outer run only
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           "test_touching.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "4 passed" in out, out  # the tests pass; the guard fails the run
    runs = REPO_ROOT / "runs" / "no_such_run"
    for line in (f"read {runs / 'metrics.jsonl'} (in test_touching.py::test_reads_runs (call))",
                 f"write {runs / 'new.txt'} (in test_touching.py::test_writes_runs (call))",
                 f"os.listdir {runs} (in test_touching.py::test_a_child_lists_runs (call))"):
        assert line in out, out
    assert "test_touches_nothing" not in out.split("the tests touched the checkout")[1], out


def test_the_snapshot_names_what_was_added_changed_and_removed(tmp_path):
    for name in ("kept.txt", "changed.txt", "removed.txt", "runs/old.txt", ".venv/x.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("a")
    before = checkout_guard.snapshot(tmp_path)
    assert set(before) == {"kept.txt", "changed.txt", "removed.txt"}  # runs/ is the audit hook's
    (tmp_path / "changed.txt").write_text("ab")
    (tmp_path / "removed.txt").unlink()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "added.txt").write_text("a")
    (tmp_path / "runs" / "new.txt").write_text("a")
    assert checkout_guard.changes(before, checkout_guard.snapshot(tmp_path)) == [
        "changed changed.txt", "removed removed.txt", f"added {os.path.join('sub', 'added.txt')}"]
