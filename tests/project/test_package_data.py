"""What the wheel ships, checked without building it (`make wheel-check` builds and installs one):
pyproject's package-data globs hold every preset and the example `sage-jax score` is shown on, the
license is an SPDX string with its file, and the version is written once, as CHANGELOG's newest."""
from __future__ import annotations

import re
import tomllib

from helpers.env import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def shipped(package: str) -> set:
    globs = PYPROJECT["tool"]["setuptools"]["package-data"].get(package, [])
    return {p for pattern in globs for p in (REPO_ROOT / package).glob(pattern) if p.is_file()}


def test_package_data_holds_every_preset_and_the_example():
    for package in ("clarifyjax", "sage_jax"):
        presets = set((REPO_ROOT / package / "presets").rglob("*.yaml"))
        assert presets and presets <= shipped(package), sorted(map(str, presets - shipped(package)))
    assert REPO_ROOT / "sage_jax" / "examples" / "sage_demo.jsonl" in shipped("sage_jax")


def test_license_and_version():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (REPO_ROOT / "LICENSE").read_text(encoding="utf-8")[:200]
    assert any(r.startswith("build") for r in project["optional-dependencies"]["test"])
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", changelog, re.M)
    assert sections[0] == "Unreleased", sections[:2]
    assert sections[1] == project["version"], (sections[1], project["version"])
