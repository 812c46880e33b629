"""pytest's hook file for tests/. The helpers live in the `helpers` package; the names below stay
importable as ``from conftest import ...``."""
from helpers.env import REPO_ROOT, in_ci, require, shared_data, shared_data_dir

__all__ = ["REPO_ROOT", "in_ci", "require", "shared_data", "shared_data_dir"]
