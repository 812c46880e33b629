"""Fixtures of the app tests (`clarifyjax ask`, `interact`, `web`)."""
import pytest

from helpers.clarify_models import tiny_folders, write_models_yaml


@pytest.fixture(scope="module")
def models_yaml(tmp_path_factory):
    """MODELS.yaml of tiny random models (`helpers.clarify_models`)."""
    folders = tiny_folders(tmp_path_factory)
    return write_models_yaml(tmp_path_factory.mktemp("models") / "models.yaml", folders)
