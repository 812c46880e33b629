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

The run also compiles with XLA's backend optimization level 0 (``TEST_XLA_FLAGS``, added to
``XLA_FLAGS``, which children inherit: `inherited_xla_flags`): the tests' models are tiny, so
compiling is most of their time and running them very little. Measured on tests/test_sft.py
(one process, a fresh cache): 155 s of CPU at the default level, 94 s at level 0; a tiny T5
decoding loop compiles in 1.2 s instead of 3.1 s and runs in 0.13 s instead of 0.07 s. The
level changes no result beyond float rounding (no LLVM fast-math either way), which the tests'
tolerances already allow for. ``CLARIFYJAX_TEST_XLA_OPTIMIZE=1`` keeps the default level.
"""
from __future__ import annotations

import os
import shutil
import tempfile

OWNER_ENV = "CLARIFYJAX_TEST_COMPILE_CACHE_OWNER"
MAX_BYTES = 8 << 30
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def configure() -> None:
    """Call before jax is imported in this process (the conftest's import time)."""
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="clarifyjax-xla-cache-")
        os.environ[OWNER_ENV] = str(os.getpid())
    # Cache every program, however quick its compile: the tiny models' programs take 0.05-2 s
    # each, and there are thousands of them in a run.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(MAX_BYTES))
    if os.environ.get("CLARIFYJAX_TEST_XLA_OPTIMIZE") != "1":
        flags = os.environ.get("XLA_FLAGS", "").split()
        if not any(f.startswith("--xla_backend_optimization_level") for f in flags):
            os.environ["XLA_FLAGS"] = " ".join(flags + [TEST_XLA_FLAGS])


def inherited_xla_flags(n_devices: int | None = None) -> str:
    """This run's XLA_FLAGS for a child: the test-wide ones without any fake-device count, with
    ``n_devices`` fake CPU devices when given (children that pick their own count, such as
    launch/local_multiprocess.sh, add theirs)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
    if n_devices is not None:
        flags.insert(0, f"{DEVICE_COUNT_FLAG}={n_devices}")
    return " ".join(flags)


def cleanup() -> None:
    """Remove the run's cache folder, from the process that made it."""
    if os.environ.get(OWNER_ENV) == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
