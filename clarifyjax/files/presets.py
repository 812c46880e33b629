"""Presets: the YAML configs a package ships (clarifyjax/presets/, sage_jax/presets/), each named by
its file's stem. A command's CONFIG argument names a file, else a preset (`config_type`);
`clarifyjax presets` lists them with each file's first comment line (`listing`). `--data-dir`
(`add_data_dir_option`) names the folder their relative data paths are read from
(`clarifyjax.files.tables.data_dir`). No JAX."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from clarifyjax.files.tables import DATA_ENV, use_data_dir

FOLDER = Path(__file__).resolve().parents[1] / "presets"  # clarifyjax's; sage_jax.cli names its own


def preset_files(folder: Path = FOLDER) -> dict[str, Path]:
    """Name (the file's stem) -> file, of every ``*.yaml`` under `folder`, sorted by name.

    Raises:
      ValueError: two files share a stem (a name must find one file).
    """
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.yaml")):
        if path.stem in found:
            raise ValueError(f"presets {found[path.stem]} and {path} share the name {path.stem!r}")
        found[path.stem] = path
    return dict(sorted(found.items()))


def description(path: Path) -> str:
    """A preset's first comment line, without its ``#``."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def listing(folder: Path = FOLDER) -> str:
    """One line per preset: its name, then its description."""
    files = preset_files(folder)
    width = max(len(name) for name in files)
    return "\n".join(f"{name:<{width}}  {description(path)}" for name, path in files.items())


def config_path(text: str | os.PathLike, folder: Path = FOLDER) -> Path | None:
    """A CONFIG argument as a file: the file it names (a path, existing or not, with a suffix or a
    folder in it) or the preset of that name; None when it is a bare name of neither."""
    path = Path(text)
    if path.exists() or path.suffix or len(path.parts) != 1:
        return path  # the loader names a missing file
    return preset_files(folder).get(path.name)


def config_type(folder: Path = FOLDER, command: str = "clarifyjax"):
    """An argparse ``type``: `config_path`, a bare name of no file or preset a usage error."""
    def convert(text: str) -> Path:
        path = config_path(text, folder)
        if path is None:
            raise argparse.ArgumentTypeError(f"{text}: no such config file or preset (`{command} presets` "
                                             "lists the presets)")
        return path
    return convert


def add_data_dir_option(p: argparse.ArgumentParser) -> None:
    """``--data-dir FOLDER``; `apply_data_dir` makes it this run's data folder."""
    p.add_argument("--data-dir", metavar="FOLDER", default=None,
                   help="the data folder: the config's relative data paths (a preset's "
                        "delta-clarify/train.tsv) are read from it when the working folder has no such "
                        f"file (default: ${DATA_ENV})")


def apply_data_dir(args: argparse.Namespace) -> None:
    """Set ``--data-dir`` (when the command has it and it was given) as the data folder."""
    if getattr(args, "data_dir", None) is not None:
        use_data_dir(args.data_dir)


def show(folder: Path, paths: bool) -> str:
    """`listing`, or each preset's name and file."""
    if paths:
        return "\n".join(f"{name}  {path}" for name, path in preset_files(folder).items())
    return listing(folder)
