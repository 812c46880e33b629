"""The `clarifyjax` command (also `python -m clarifyjax`): `clarifyjax SUBCOMMAND [options]`.

Each subcommand lives with its domain and registers in `clarifyjax.core.commands`; this module
imports them all, builds the parser and runs one. Run functions import JAX and the models
themselves, so `clarifyjax --help` stays fast. Bad input is one line, `clarifyjax SUBCOMMAND:
error: ...`, and exit status 2 (docs/reliability.md lists what each command promises)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from clarifyjax.core.commands import (SUBCOMMANDS, CLIError, CommandParser, UsageError, one_line, subcommand,
                                     version_option)
from clarifyjax.files.textfiles import describe_os_error

# Each import registers its subcommands, in the order `clarifyjax --help` lists them.
import clarifyjax.reward.command  # noqa: F401,I001
import clarifyjax.training.command  # noqa: F401
import clarifyjax.serve.command  # noqa: F401
import clarifyjax.evaluation.command  # noqa: F401
from clarifyjax.app import ask, interact, web  # noqa: F401
import clarifyjax.harness.command  # noqa: F401
from clarifyjax.files import presets
from clarifyjax.config.loader import ConfigError
from clarifyjax.files.tables import DataError
from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.text.formats import TextFormatError



def _presets_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--paths", action="store_true", help="print each preset's file instead of its description")


@subcommand("presets", "list the configs this package ships, by the name that train, evaluate, "
            "score-questions, ask, interact and web take in place of a file", _presets_options)
def run_presets(args: argparse.Namespace) -> int:
    print(presets.show(presets.FOLDER, args.paths))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; `parser.subcommand_parsers[name]` is each subcommand's own."""
    parser = CommandParser(
        prog="clarifyjax", description="ClarifyDelphi in JAX: clarification questions for moral "
        "situations, trained with a defeasibility reward")
    version_option(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    parser.subcommand_parsers = {}
    for command in SUBCOMMANDS.values():
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_options(p)
        p.set_defaults(run=command.run)
        parser.subcommand_parsers[command.name] = p
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse with options and positionals intermixed (`train CONFIG --no-progress k=v`).

    argparse's `parse_intermixed_args` does not support subparsers, so the subcommand (the first
    word) picks its parser here; `-h`, a missing or an unknown subcommand go to the top parser.
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS and SUBCOMMANDS[argv[0]].passthrough:
        return argparse.Namespace(command=argv[0], run=SUBCOMMANDS[argv[0]].run, argv=argv[1:])
    if argv and argv[0] in parser.subcommand_parsers:
        args = parser.subcommand_parsers[argv[0]].parse_intermixed_args(argv[1:])
        args.command = argv[0]
        return args
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        parser.error(f"unknown option {argv[0]!r}; options go after the SUBCOMMAND")
    return parser.parse_args(argv)



def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `clarifyjax` (pyproject [project.scripts]); returns the exit status."""
    try:
        args = parse_args(argv)
    except UsageError as e:
        print(one_line(str(e)), file=sys.stderr)
        return 2
    try:
        presets.apply_data_dir(args)  # --data-dir: before the config's data paths are read
        return int(args.run(args) or 0)
    except (CLIError, CheckpointError, ConfigError, DataError, TextFormatError) as e:
        message = str(e)
    except OSError as e:  # unwritable output, full disk, unreadable folder: name the path
        message = describe_os_error(e)
    print(f"clarifyjax {args.command}: error: {one_line(message)}", file=sys.stderr)
    return 2
