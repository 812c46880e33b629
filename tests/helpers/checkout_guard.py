"""The suite fails if a test touches the checkout: every test and child works in temporary folders.
Both checks (files changed outside runs/, and any access under runs/ through the audit hook of
startup/sitecustomize.py, logged to ``$CLARIFYJAX_TEST_CHECKOUT_LOG``) are made in the run's first
process (the xdist controller, or the only process)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from helpers.env import REPO_ROOT

LOG_ENV = "CLARIFYJAX_TEST_CHECKOUT_LOG"
OWNER_ENV = "CLARIFYJAX_TEST_CHECKOUT_OWNER"
SKIPPED = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache"}

_start: dict[str, tuple[int, int]] = {}
_problems: list[str] = []


def configure() -> None:
    """Call at the conftest's import: the first process of the run names the log its workers and
    children inherit."""
    if LOG_ENV not in os.environ:
        fd, path = tempfile.mkstemp(prefix="clarifyjax-checkout-", suffix=".log")
        os.close(fd)
        os.environ[LOG_ENV] = path
        os.environ[OWNER_ENV] = str(os.getpid())


def _owner() -> bool:
    return os.environ.get(OWNER_ENV) == str(os.getpid())


# Every file of the checkout outside runs/ (and outside .git, .venv and the caches) is listed with
# its size and mtime at the start and compared at the end: anything added, changed or removed is
# named. Accesses under runs/ (reads too: `make demo` leaves its runs there) are caught by the audit
# hook of startup/sitecustomize.py, which every process of the run loads.
def snapshot(root: Path = REPO_ROOT) -> dict[str, tuple[int, int]]:
    """{path relative to root: (size, mtime in ns)} of every file outside SKIPPED folders."""
    files = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED]
        for name in names:
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            files[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return files


def changes(before: dict, after: dict) -> list[str]:
    """What differs between two snapshots, one line per file."""
    lines = []
    for path in sorted(set(before) | set(after)):
        if path not in after:
            lines.append(f"removed {path}")
        elif path not in before:
            lines.append(f"added {path}")
        elif before[path] != after[path]:
            lines.append(f"changed {path}")
    return lines


def start() -> None:
    if _owner():
        _start.update(snapshot())


def finish(session) -> None:
    """Fail the run (exit status 1) when the checkout changed or runs/ was touched."""
    if not _owner():
        return
    _problems.extend(changes(_start, snapshot()))
    log = Path(os.environ[LOG_ENV])
    seen = set()
    for line in log.read_text(encoding="utf-8").splitlines():
        event, path, test = line.split("\t")
        if (path, test) not in seen:
            seen.add((path, test))
            _problems.append(f"{event} {path} (in {test})")
    log.unlink()
    if _problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def report(terminalreporter) -> None:
    if _problems:
        terminalreporter.write_sep("=", "the tests touched the checkout (tests/helpers/checkout_guard.py)",
                                   red=True)
        for line in _problems[:50]:
            terminalreporter.write_line(line)
        if len(_problems) > 50:
            terminalreporter.write_line(f"... and {len(_problems) - 50} more")
