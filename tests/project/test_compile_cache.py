"""The test run's compilation-cache setup (tests/helpers/compile_cache.py) reaches its child
processes: the cache folder, the XLA flags, one torch thread, and JAX's per-write eviction scan
turned off (`startup/sitecustomize.py`) while its lock stays."""
from __future__ import annotations

import os

import pytest

from helpers.children import run_child
from helpers.compile_cache import TEST_XLA_FLAGS

pytestmark = pytest.mark.child

CHILD = """
import os

import pytest
import jax, jax.numpy as jnp
from jax._src import compilation_cache, lru_cache
from clarifyjax.files.child_result import write_result
jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()
cache = compilation_cache._cache
write_result({"scan": lru_cache.LRUCache._evict_if_needed.__name__,
              "locks": bool(cache.eviction_enabled), "folder": str(cache.path),
              "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "omp": os.environ.get("OMP_NUM_THREADS")})
"""


def test_children_share_the_cache_without_the_eviction_scan():
    got = run_child(CHILD, timeout=300)
    assert got["scan"] == "_no_eviction_scan", got
    assert got["locks"], got  # the size limit keeps JAX's lock around reads and writes
    assert got["folder"] == os.environ["JAX_COMPILATION_CACHE_DIR"], got
    assert all(flag in got["xla_flags"].split() for flag in TEST_XLA_FLAGS), got
    assert got["omp"] == "1", got
