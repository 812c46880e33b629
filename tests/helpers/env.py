"""REPO_ROOT, optional packages and the shared data folder.

Optional packages (torch, tensorflow-text, sentence-transformers, the MiniLM wheel) and the
shared data folder are *required* under CI=true: a missing one fails the test instead of
skipping it, so that a green CI always means the reference comparison really ran.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from clarifyjax.models.tiny import shared_data_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
__all__ = ["REPO_ROOT", "in_ci", "require", "shared_data", "shared_data_dir"]


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


def shared_data(relative: str) -> Path:
    path = shared_data_dir() / relative
    if not path.exists():
        msg = f"shared data file not found: {path}"
        if in_ci():
            pytest.fail(msg + " (CI=true: the shared data must be present)")
        pytest.skip(msg)
    return path
