"""CPU kernels that XLA:CPU compiles poorly, built from C++ on first use and called through XLA's
FFI (`native_src/sampling.cc`), for the sampling filters of `clarifyjax.decoding.filters`: each
row's top-p threshold by radix selection, and each row's n largest values (top-k) in one pass.

Why: a top-p threshold needs the mass of the tokens above a candidate, over and over. In XLA
every such pass is a masked row sum that XLA:CPU writes out and reads back (5.5 us per 32k row);
the bisection of `decoding/filters.py` takes 30 of them, about 32 ms at [128, 32000], more than
10% of a batch-128 decoding step. The kernel bins the row once by value, in double precision, and
resolves the bin where the mass reaches top_p by the bits of its few hundred keys: about 6 ms for
the same batch, sharing the rows with XLA's CPU thread pool. `lax.top_k` (XLA:CPU's TopK call)
took 8-14 ms for the 10 largest of the same batch; one pass against the least of a small heap
takes about 1 ms. Accelerators never call either.

The library is compiled by the host's C++ compiler (``$CXX``, else ``c++``/``g++``/``clang++``)
with ``-march=native`` into a cache folder (``$CLARIFYJAX_KERNEL_CACHE``, else
``~/.cache/clarifyjax/kernels``), under a name that hashes the source, the flags, the compiler's
version, jaxlib's version and this CPU's feature flags, so a folder shared between machines never
hands one a library built for another. ``CLARIFYJAX_CPU_KERNELS`` chooses: ``auto`` (the default:
build it, or warn once and use the XLA path where that fails), ``off`` (the XLA path), or
``require`` (fail where it cannot be built: the test suite's setting under ``CI=true``).
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp

SOURCE = Path(__file__).parent / "native_src" / "sampling.cc"
TARGETS = {"clarifyjax_top_p_threshold": "ClarifyjaxTopPThreshold",
           "clarifyjax_top_k_values": "ClarifyjaxTopKValues"}  # XLA's name: the library's symbol
MODE_ENV = "CLARIFYJAX_CPU_KERNELS"
CACHE_ENV = "CLARIFYJAX_KERNEL_CACHE"
MODES = ("auto", "off", "require")
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-march=native", "-fno-math-errno",
         "-fno-trapping-math")
COMPILE_TIMEOUT_S = 300

_lock = threading.Lock()
_state: dict = {}  # "ready": bool once decided; "error": why not


_override: list[str] = []  # innermost `use` last


def mode() -> str:
    """`auto`, `off` or `require`: the innermost `use`, else ``$CLARIFYJAX_CPU_KERNELS``."""
    if _override:
        return _override[-1]
    value = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


@contextlib.contextmanager
def use(chosen: str):
    """Within the block, programs traced choose the kernels as `chosen` says (``off``: the XLA
    path, as an accelerator runs it); programs already compiled keep what they chose."""
    if chosen not in MODES:
        raise ValueError(f"native.use({chosen!r}): expected one of {', '.join(MODES)}")
    _override.append(chosen)
    try:
        yield
    finally:
        _override.pop()


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "clarifyjax" / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _jaxlib_version() -> str:  # the FFI headers and ABI come with jaxlib
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return jax.__version__


def library_path(compiler: str) -> Path:
    """Where the library for this source, compiler, jaxlib and CPU lives (built or not)."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), version.encode(),
                 _jaxlib_version().encode(), platform.machine().encode(), _cpu_flags().encode()):
        digest.update(part)
        digest.update(b"\0")
    return cache_dir() / f"sampling-{digest.hexdigest()[:20]}.so"


def build() -> Path:
    """Compile the kernels' library unless the cache holds it; returns its path. Raises
    RuntimeError with the compiler's message where that fails."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found ($CXX, c++, g++ or clang++)")
    path = library_path(compiler)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(path.with_suffix(".lock")):
        if path.exists():  # another process built it while this one waited
            return path
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            cmd = [compiler, *FLAGS, "-isystem", jax.ffi.include_dir(), str(SOURCE), "-o", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
            if done.returncode != 0:
                lines = [ln for ln in done.stderr.splitlines() if "error" in ln] or \
                    done.stderr.splitlines()[-1:] or [f"exit status {done.returncode}"]
                raise RuntimeError(f"{Path(compiler).name} failed on {SOURCE.name}: {lines[0]}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)  # atomic: a reader never sees half a library
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path


@contextlib.contextmanager
def _file_lock(path: Path):
    try:
        import fcntl
    except ImportError:  # no flock: concurrent builds each write their own file, then rename
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def available() -> bool:
    """Whether the CPU kernels are registered with XLA (building them the first time), as
    `CLARIFYJAX_CPU_KERNELS` allows. ``require`` raises where they cannot be built."""
    chosen = mode()
    if chosen == "off":
        return False
    with _lock:
        if "ready" not in _state:
            try:
                library = ctypes.CDLL(str(build()))
                for target, symbol in TARGETS.items():
                    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                                platform="cpu")
                _state["ready"] = True
            except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                _state.update(ready=False, error=str(error))
                if chosen == "auto":
                    warnings.warn(f"clarifyjax: CPU sampling kernels unavailable ({error}); "
                                  f"top-k and top-p use the slower XLA path (set {MODE_ENV}=off "
                                  "to silence this)", RuntimeWarning, stacklevel=2)
        if not _state["ready"] and chosen == "require":
            raise RuntimeError(f"{MODE_ENV}=require: the CPU sampling kernels could not be "
                               f"built: {_state['error']}")
        return _state["ready"]


def _registered() -> None:
    if not available():
        raise RuntimeError(f"the CPU sampling kernels are not available ({MODE_ENV}="
                           f"{mode()}{'; ' + _state['error'] if _state.get('error') else ''})")


def nucleus_threshold(logits: jax.Array, top_p) -> jax.Array:
    """The smallest logit top-p keeps in each row: logits [..., V] (float32 after temperature and
    top-k; -inf = excluded), top_p a number or [..., 1] -> [..., 1]. A row keeps the tokens whose
    larger-logit mass is < top_p (equal logits together; the most likely always): the rule of
    `decoding.filters.top_p_threshold`, with the masses summed in double precision (top_p 1 keeps every
    token of positive weight; a row of -inf gives -inf). CPU only."""
    _registered()
    logits = jax.lax.stop_gradient(logits.astype(jnp.float32))
    shape = logits.shape[:-1] + (1,)
    top_p = jnp.broadcast_to(jnp.asarray(top_p, jnp.float32), shape)
    call = jax.ffi.ffi_call("clarifyjax_top_p_threshold", jax.ShapeDtypeStruct(shape, jnp.float32),
                            vmap_method="broadcast_all")
    return call(logits, jax.lax.stop_gradient(top_p))


def largest_values(logits: jax.Array, n: int) -> jax.Array:
    """The n largest logits of each row, descending: [..., V] -> [..., n] float32, ties counted
    (`lax.top_k(logits, n)[0]`; NaN never counts, and -inf fills a row short of n others).
    No gradient flows through it. CPU only."""
    _registered()
    logits = jax.lax.stop_gradient(logits.astype(jnp.float32))
    if not 1 <= n <= logits.shape[-1]:
        raise ValueError(f"largest_values: n={n} outside 1..{logits.shape[-1]} (the vocabulary)")
    call = jax.ffi.ffi_call("clarifyjax_top_k_values",
                            jax.ShapeDtypeStruct(logits.shape[:-1] + (n,), jnp.float32),
                            vmap_method="broadcast_all")
    return call(logits)
