"""Presets (clarifyjax/presets/, sage_jax/presets/) by name, their listing, `--version`, and the data
folder their relative data paths are read from (`--data-dir`, CLARIFYJAX_DATA; never the
installed package)."""
from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path

import pytest

from clarifyjax.files import presets, tables
from helpers.env import REPO_ROOT

SAGE_PRESETS = REPO_ROOT / "sage_jax" / "presets"


@pytest.fixture(scope="module")
def clarifyjax_main():
    from clarifyjax.cli import main
    return main


@pytest.fixture(scope="module")
def sage_main():
    from sage_jax.cli import main
    return main


@pytest.mark.parametrize("folder", [presets.FOLDER, SAGE_PRESETS], ids=["clarifyjax", "sage_jax"])
def test_every_preset_has_a_name_and_a_one_line_description(folder):
    files = presets.preset_files(folder)
    assert sorted(files.values()) == sorted(folder.rglob("*.yaml"))  # every file, one name each
    for name, path in files.items():
        text = presets.description(path)
        assert 20 <= len(text) <= 110 and text[-1] in ".)", (name, text)  # a sentence that ends


def test_the_commands_list_the_presets_and_print_the_version(clarifyjax_main, sage_main, capsys):
    version = importlib.metadata.version("clarifyjax")
    assert clarifyjax_main(["presets"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == list(presets.preset_files())
    assert any(line.startswith("ppo_t5_large_original ") and "original" in line for line in listed)
    assert sage_main(["presets", "--paths"]) == 0
    assert f"temperature_recorded  {SAGE_PRESETS / 'experiments' / 'temperature_recorded.yaml'}" in \
        capsys.readouterr().out
    for main, program in ((clarifyjax_main, "clarifyjax"), (sage_main, "sage-jax")):
        with pytest.raises(SystemExit) as exit_:
            main(["--version"])
        assert exit_.value.code == 0 and capsys.readouterr().out == f"{program} {version}\n"


def test_a_config_argument_is_a_file_else_a_preset(tmp_path, monkeypatch, clarifyjax_main, capsys):
    monkeypatch.chdir(tmp_path)
    convert = presets.config_type()
    assert convert("ppo_tiny") == presets.FOLDER / "ppo_tiny.yaml"
    assert convert("paper") == presets.FOLDER / "evaluate" / "paper.yaml"
    assert presets.config_type(SAGE_PRESETS, "sage-jax")("run_local") == SAGE_PRESETS / "run_local.yaml"
    Path("ppo_tiny").write_text("kind: ppo\n")  # a file of that name wins
    assert convert("ppo_tiny") == Path("ppo_tiny")
    assert convert("mine.yaml") == Path("mine.yaml")  # a path: the loader names it if missing
    with pytest.raises(argparse.ArgumentTypeError, match=r"^ppo_tyni: no such config file or preset "
                       r"\(`clarifyjax presets` lists the presets\)$"):
        convert("ppo_tyni")
    assert clarifyjax_main(["train", "ppo_tyni", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ppo_tyni: no such config file or preset" in err


def test_data_paths_are_read_from_the_data_folder(tmp_path, monkeypatch, clarifyjax_main, capsys):
    from clarifyjax.config import load_config

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    (data / "delta-clarify").mkdir(parents=True)
    (data / "delta-clarify" / "train.tsv").write_text("id\tsituation\tquestion\n")
    cfg = load_config(presets.config_path("sft_question_tiny"))
    assert cfg.data.train_path == "delta-clarify/train.tsv"  # relative to the data folder
    monkeypatch.setenv(tables.DATA_ENV, str(data))
    assert tables.resolve_data_path(cfg.data.train_path) == data / "delta-clarify" / "train.tsv"
    # a config written for the checkout's layout finds the data folder's file too
    assert tables.resolve_data_path("../shared/data/delta-clarify/train.tsv") == data / "delta-clarify/train.tsv"
    monkeypatch.delenv(tables.DATA_ENV)
    tables.use_data_dir(data)  # what --data-dir does: the variable, for this process and its children
    assert Path(tables.data_dir()) == data.resolve()
    # a data folder that is not there: one line naming the option, or the variable
    assert clarifyjax_main(["train", "ppo_tiny", "--data-dir", str(tmp_path / "nope"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--data-dir {tmp_path / 'nope'}: no such data folder" in err \
        and tables.DATA_ENV in err
    monkeypatch.setenv(tables.DATA_ENV, str(tmp_path / "nope"))
    with pytest.raises(tables.DataError, match=r"^CLARIFYJAX_DATA=.*nope: no such data folder .*--data-dir"):
        tables.resolve_data_path("delta-clarify/train.tsv")


def test_without_a_checkout_no_data_folder_is_guessed(tmp_path, monkeypatch):
    """Installed (no pyproject.toml beside the package), nothing is read from beside the package: a
    preset's data path found nowhere names the option and the variable."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(tables.DATA_ENV, raising=False)
    monkeypatch.setattr(tables, "REPO_ROOT", tmp_path / "site-packages")
    assert tables.data_dir() is None
    with pytest.raises(tables.DataError) as info:
        tables.resolve_data_path("delta-clarify/train.tsv", "data.train_path")
    assert str(info.value) == (
        f"data.train_path: data file not found: delta-clarify/train.tsv (looked at {tmp_path / 'delta-clarify'}"
        "/train.tsv); relative data paths are read from the data folder: name it with --data-dir or "
        "CLARIFYJAX_DATA")
