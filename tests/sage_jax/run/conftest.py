"""Fixtures of the `sage-jax run` tests."""
import pytest

from helpers.tiny_models import tiny_classifier_folder


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    """A tiny random BERT folder as the sentence embedder (mean pooling): the scores' plumbing is
    tested here, the real embedder in tests/clarifyjax/models/test_embedder.py."""
    return str(tiny_classifier_folder(tmp_path_factory.mktemp("tiny"), model_type="bert"))
