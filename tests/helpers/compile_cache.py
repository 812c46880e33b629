"""One persistent JAX compilation cache for a whole test run, shared by its xdist workers and every
child they start, and the fast-compiling XLA flags of the run (`TEST_XLA_FLAGS`): most of the
suite's time is compiling the same tiny programs again. The first process makes the folder, names
it in ``JAX_COMPILATION_CACHE_DIR`` before any worker starts and removes it at the end; a run
started with that variable set uses its folder and keeps it (the second run compiles almost
nothing)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

OWNER_ENV = "CLARIFYJAX_TEST_COMPILE_CACHE_OWNER"
# A size limit is what makes JAX take a file lock around every cache read and write
# (`jax._src.lru_cache.LRUCache`), so two processes compiling the same program at once (two workers,
# or the processes of a multi-host test) never read a half-written entry. With it JAX scans the whole
# folder before every write to see what to evict: startup/sitecustomize.py removes that scan (the
# folder stays far below the limit).
MAX_BYTES = 8 << 30
# XLA's backend optimization level 0: the tests' models are tiny, so compiling is most of their time
# and running them very little; it changes no result beyond float rounding (no LLVM fast-math either
# way), which the tolerances allow for. The older loop emitter for fusions compiles faster again at
# level 0. CLARIFYJAX_TEST_XLA_OPTIMIZE=1 keeps XLA's defaults.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


STARTUP = Path(__file__).parent / "startup"  # its sitecustomize.py: every process of the run


def configure() -> None:
    """Call before jax is imported in this process (the conftest's import time)."""
    # every process of the run skips JAX's eviction scan on each cache write (see MAX_BYTES)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(STARTUP) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(STARTUP), *filter(None, paths)])
    spec = importlib.util.spec_from_file_location("clarifyjax_test_sitecustomize",
                                                  STARTUP / "sitecustomize.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # and this process
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="clarifyjax-xla-cache-")
        os.environ[OWNER_ENV] = str(os.getpid())
    # Cache every program, however quick its compile: the tiny models' programs take 0.05-2 s
    # each, and there are thousands of them in a run.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(MAX_BYTES))
    if os.environ.get("CLARIFYJAX_TEST_XLA_OPTIMIZE") != "1":
        flags = os.environ.get("XLA_FLAGS", "").split()
        names = {f.split("=", 1)[0] for f in flags}
        flags += [f for f in TEST_XLA_FLAGS if f.split("=", 1)[0] not in names]
        os.environ["XLA_FLAGS"] = " ".join(flags)
    # PyTorch (the reference side of many tests) on one thread, in this process and its children:
    # on a busy 2-core machine its second thread spin-waits, and 40 tiny forwards took 1.6-3.6 s
    # of CPU on two threads against 0.11 s on one, for the same numbers. A benchmark that measures
    # torch sets its own thread count.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


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
