"""Shared test helpers.

Optional packages (torch, tensorflow-text, sentence-transformers, the MiniLM wheel) and the
shared data folder are *required* under CI=true: a missing one fails the test instead of
skipping it, so that a green CI always means the reference comparison really ran.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(module: str):
    """Import `module`, or fail under CI / skip locally when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the environment
        msg = f"optional package {module!r} is needed by this test: {e}"
        if in_ci():
            pytest.fail(msg + " (CI=true: missing optional packages are failures)")
        pytest.skip(msg)


def shared_data_dir() -> Path:
    """../shared/data beside the repository (override with CLARIFYJAX_SHARED_DATA)."""
    env = os.environ.get("CLARIFYJAX_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def shared_data(relative: str) -> Path:
    path = shared_data_dir() / relative
    if not path.exists():
        msg = f"shared data file not found: {path}"
        if in_ci():
            pytest.fail(msg + " (CI=true: the shared data must be present)")
        pytest.skip(msg)
    return path


LAUNCH_VARS = ("CLARIFYJAX_COORDINATOR", "CLARIFYJAX_NUM_PROCESSES", "CLARIFYJAX_PROCESS_ID")


def fake_device_env(n_devices: int, **extra: str) -> dict:
    """The environment of a child interpreter with `n_devices` fake CPU devices, the repository
    importable, and no multi-process launch variables inherited from this one; `extra` on top.

    XLA_FLAGS must be set before jax is imported, hence children.
    """
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n_devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_with_fake_devices(code: str, n_devices: int = 8, timeout: int = 900) -> str:
    """Run `code` in a fresh interpreter with `n_devices` fake CPU devices; return stdout."""
    proc = subprocess.run([sys.executable, "-c", code], env=fake_device_env(n_devices), capture_output=True,
                          text=True, timeout=timeout, cwd=str(REPO_ROOT))
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def parse_result(stdout: str, stderr: str = "") -> dict:
    """The JSON a test subprocess printed after ``RESULT`` (native logs may share its line)."""
    import json
    for line in stdout.splitlines():
        if "RESULT{" in line:
            return json.loads(line.split("RESULT", 1)[1])
    raise AssertionError(f"no RESULT line; stdout={stdout[-2000:]!r} stderr={stderr[-3000:]!r}")
