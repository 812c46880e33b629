"""Fixtures shared by the clarifyjax tests of several folders."""
import jax
import pytest

from helpers import score_cli


@pytest.fixture
def full_float32_matmuls():
    """On GPUs, jax's default float32 matmul runs in TF32 (errors ~1e-3): compare in full f32.
    Modules that compare with PyTorch use it with `pytest.mark.usefixtures`."""
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The tiny reward models of `clarifyjax score-questions` (`helpers.score_cli`)."""
    return score_cli.model_folders(tmp_path_factory)


@pytest.fixture(scope="module")
def rows():
    """The first situations and questions of δ-CLARIFY dev.tsv (`helpers.score_cli`)."""
    return score_cli.dev_rows()
