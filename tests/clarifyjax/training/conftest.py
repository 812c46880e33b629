"""Fixtures of the training tests."""
import pytest

from helpers import resume_runs


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny SFT run to resume (`resume_runs.base_run`)."""
    return resume_runs.base_run(tmp_path_factory)
