"""One persistent JAX compilation cache for a whole test run, shared by its xdist workers and by
every child process they start (children inherit the environment).

Most of the suite's time is XLA compiling the same tiny programs again: each CLI child, README
block and fake-device child starts a fresh interpreter and recompiles what an earlier one already
compiled. With the cache, a program compiled once in the run is loaded from disk by the others.

The first process of the run (the xdist controller, or the only process with ``-n 0``) makes a
temporary folder and names it in ``JAX_COMPILATION_CACHE_DIR`` before any worker starts; it
removes it at the end. A cache size limit is set because it is what makes JAX take a file lock
around every read and write (`jax._src.lru_cache.LRUCache`), so that two processes compiling the
same program at the same moment (two workers, or the processes of a multi-host test) never read
a half-written entry. A run started with ``JAX_COMPILATION_CACHE_DIR`` already set uses that
folder and keeps it (useful for iterating: the second run compiles almost nothing).
"""
from __future__ import annotations

import os
import shutil
import tempfile

OWNER_ENV = "CLARIFYJAX_TEST_COMPILE_CACHE_OWNER"
MAX_BYTES = 8 << 30


def configure() -> None:
    """Call before jax is imported in this process (the conftest's import time)."""
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="clarifyjax-xla-cache-")
        os.environ[OWNER_ENV] = str(os.getpid())
    # Cache every program, however quick its compile: the tiny models' programs take 0.05-2 s
    # each, and there are thousands of them in a run.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(MAX_BYTES))


def cleanup() -> None:
    """Remove the run's cache folder, from the process that made it."""
    if os.environ.get(OWNER_ENV) == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
