"""The CPU sampling kernels (`clarifyjax.core.native`): built from their C++ source on first
use and registered with XLA. The top-p threshold equals a float64 transcription of the rule it
implements (a token stays when the mass of the tokens with a larger logit is < top_p; equal logits
together; the most likely always), on rows that exercise every branch: flat and peaked rows, rows
whose logits tie (bf16-rounded), -inf entries, vocabularies that are not a multiple of the
kernel's 8 lanes, per-row top_p, top_p at 1 and near 0, extra batch axes, vmap, grad, and a batch
sharded over 8 devices. The top-k values equal numpy's sort. The build's failure modes: `auto`
warns once and falls back, `require` raises, and an unknown mode is named in the error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clarifyjax.core import native
from clarifyjax.decoding import filter_logits

MASS_SLACK = 1e-6  # rows whose deciding mass lies this close to top_p may go either way


def reference_threshold(logits: np.ndarray, top_p: float) -> tuple[float, bool]:
    """(the smallest logit kept, whether the row is decided beyond float32 rounding) in float64:
    distinct logits descending, a value kept while the mass of larger logits is < top_p."""
    x = np.asarray(logits, np.float64)
    finite = x[np.isfinite(x)]
    if finite.size == 0:
        return -np.inf, True
    weights = np.exp(finite - finite.max())
    values, inverse = np.unique(-finite, return_inverse=True)  # ascending -x = descending x
    mass = np.bincount(inverse, weights=weights) / weights.sum()
    before = np.cumsum(mass) - mass  # the mass of larger logits, per distinct value
    kept = before < top_p
    kept[0] = True
    last = int(np.flatnonzero(kept)[-1])
    # ambiguous where the last kept value's predecessor-mass or the next one's sits near top_p
    near = abs(before[last] - top_p) < MASS_SLACK or (
        last + 1 < len(before) and abs(before[last + 1] - top_p) < MASS_SLACK)
    return -values[last], not near


@pytest.fixture(scope="module")
def kernel():
    """The kernel, built (or taken from the cache) and registered: required on this machine."""
    with native.use("require"):
        assert native.available()
    return jax.jit(native.nucleus_threshold)


def rows(seed: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """Eight [8, v] rows of different shapes, and a top_p for each."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(8, v)).astype(np.float32)
    x[0] *= 0.3                                                   # flat: nucleus of most tokens
    x[1] *= 6.0                                                   # peaked
    x[2] = np.asarray(jnp.asarray(x[2] * 3, jnp.bfloat16).astype(jnp.float32))  # many ties
    x[3, : v // 3] = -np.inf                                      # excluded tokens
    x[4] = np.log(1.0 / np.arange(1, v + 1)) + 0.2 * x[4]         # Zipf-like tail
    x[5] = np.round(x[5])                                         # a few distinct values
    x[6] *= 40.0                                                  # tiny weights underflow
    top_p = np.asarray([0.9, 0.5, 0.95, 0.7, 0.9, 0.6, 0.99, 0.3], np.float32)
    return x, top_p


@pytest.mark.parametrize("v", [1, 7, 13, 300, 3001])
def test_kernel_equals_the_float64_rule(kernel, v):
    decided = 0
    for seed in range(3):
        x, top_p = rows(seed, v)
        got = np.asarray(kernel(jnp.asarray(x), jnp.asarray(top_p)[:, None]))[:, 0]
        for i in range(len(x)):
            want, clear = reference_threshold(x[i], float(top_p[i]))
            if clear:
                decided += 1
                assert got[i] == np.float32(want), (v, seed, i, got[i], want)
            else:  # within rounding of top_p: either neighbour is a right answer
                kept = np.sort(np.unique(x[i][np.isfinite(x[i])]))[::-1]
                at = int(np.flatnonzero(kept == np.float32(want))[0])
                assert got[i] in kept[max(at - 1, 0): at + 2], (v, seed, i)
    assert decided >= 20  # the check is not vacuous


def test_edge_rows_and_shapes(kernel):
    x = np.asarray([[0.0, -1.0, -2.0, -3.0],
                    [-np.inf] * 4,
                    [2.0, 2.0, 2.0, 2.0],
                    [1.0, -np.inf, 0.5, 0.25]], np.float32)
    p = jnp.asarray([[1.0], [0.9], [0.3], [1e-9]], jnp.float32)
    got = np.asarray(kernel(jnp.asarray(x), p))[:, 0]
    assert got[0] == -3.0           # top_p 1: every token
    assert got[1] == -np.inf        # a row of -inf stays as it is
    assert got[2] == 2.0            # equal logits stand together
    assert got[3] == 1.0            # a tiny top_p keeps the most likely
    # extra batch axes, a scalar top_p, and vmap over a leading axis
    y = np.random.default_rng(0).normal(size=(2, 3, 50)).astype(np.float32)
    full = np.asarray(kernel(jnp.asarray(y), 0.8))
    assert full.shape == (2, 3, 1)
    mapped = np.asarray(jax.vmap(lambda r: native.nucleus_threshold(r, 0.8))(jnp.asarray(y)))
    np.testing.assert_array_equal(mapped, full)
    for i in range(2):
        for j in range(3):
            assert full[i, j, 0] == np.float32(reference_threshold(y[i, j], 0.8)[0])


def test_filter_logits_differentiates_through_the_kernel():
    """The threshold is piecewise constant: no gradient flows through it (the kernel's inputs
    are stop_gradient), and the kept logits' gradient is log_softmax's."""
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 40)).astype(np.float32))
    with native.use("require"):
        g = jax.grad(lambda z: jnp.sum(jax.nn.log_softmax(filter_logits(z, top_p=0.8))[:, 0]))(x)
    with native.use("off"):
        ref = jax.grad(lambda z: jnp.sum(jax.nn.log_softmax(filter_logits(z, top_p=0.8))[:, 0]))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref), atol=1e-6)


@pytest.mark.parametrize("v,n", [(1, 1), (13, 5), (300, 300), (3001, 10), (32000, 64),
                                 (32000, 256)])
def test_largest_values_equal_a_sort(v, n):
    rng = np.random.default_rng(v + n)
    x = rng.normal(size=(6, v)).astype(np.float32)
    x[1] = np.round(x[1] * 2)                 # ties
    x[2, : v // 2] = -np.inf                  # excluded tokens
    x[3] = np.sort(x[3])                      # ascending: every value enters the heap
    x[4] = -np.sort(-x[4])                    # descending: only the first n do
    with native.use("require"):
        got = np.asarray(jax.jit(native.largest_values, static_argnums=1)(jnp.asarray(x), n))
    np.testing.assert_array_equal(got, -np.sort(-x, axis=-1)[:, :n])
    y = x.copy()
    y[5, ::3] = np.nan                        # NaN never counts; -inf fills a short row
    with native.use("require"):
        got = np.asarray(native.largest_values(jnp.asarray(y[5:]), n))[0]
    finite = -np.sort(-y[5][~np.isnan(y[5])])
    want = np.concatenate([finite, np.full(max(n - finite.size, 0), -np.inf, np.float32)])[:n]
    np.testing.assert_array_equal(got, want)


def test_largest_values_checks_n():
    with native.use("require"), pytest.raises(ValueError, match="n=4 outside 1..3"):
        native.largest_values(jnp.zeros((2, 3)), 4)
    with native.use("off"), pytest.raises(RuntimeError, match="CLARIFYJAX_CPU_KERNELS=off"):
        native.largest_values(jnp.zeros((2, 3)), 2)


CHILD = textwrap.dedent("""
    import json, os, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from clarifyjax.core import native
    from clarifyjax.decoding import filter_logits
    assert len(jax.devices()) == 8
    x = np.random.default_rng(2).normal(size=(16, 3000)).astype(np.float32)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharded = jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("data")))
    f = jax.jit(lambda z: filter_logits(z, top_p=0.9))
    with native.use("require"):
        got = np.isfinite(np.asarray(f(sharded)))
    one = np.isfinite(np.asarray(jax.jit(lambda z: filter_logits(z, top_p=0.9),
                                         device=jax.devices()[0])(jnp.asarray(x))))
    json.dump({"same": bool((got == one).all()), "kept": int(got.sum())}, open(sys.argv[1], "w"))
""")


def test_a_batch_sharded_over_8_devices_keeps_what_one_device_keeps(tmp_path):
    out = tmp_path / "result.json"
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                                      " --xla_force_host_platform_device_count=8").strip())
    done = subprocess.run([sys.executable, "-c", CHILD, str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["same"] and result["kept"] > 16


def test_build_failures_warn_or_raise(monkeypatch, tmp_path):
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    monkeypatch.setattr(native, "_state", {})
    with native.use("require"), pytest.raises(RuntimeError, match="false failed on sampling.cc"):
        native.available()
    monkeypatch.setattr(native, "_state", {})
    with native.use("auto"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.available() is False
    assert any("CPU sampling kernels unavailable" in str(w.message) for w in caught)
    monkeypatch.setenv(native.MODE_ENV, "sometimes")
    with pytest.raises(ValueError, match="CLARIFYJAX_CPU_KERNELS='sometimes'"):
        native.mode()


def test_the_library_is_built_once_and_reused(monkeypatch, tmp_path):
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    first = native.build()
    stamp = first.stat().st_mtime_ns
    assert native.build() == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".so"] == [first.name]
