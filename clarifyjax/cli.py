"""The `clarifyjax` command (also `python -m clarifyjax`): `clarifyjax SUBCOMMAND [options]`.

    clarifyjax score-questions --situations FILE --questions FILE --answerer DIR --fusion DIR
                               --judge DIR [--nli DIR] --out FILE.jsonl [--overwrite]
                               [--config REWARDS.yaml] [KEY=VALUE ...]
    clarifyjax train CONFIG [--dry-run] [--no-progress] [KEY=VALUE ...]
    clarifyjax generate MODEL_DIR --input PROMPTS.jsonl --out OUT.jsonl [--n N] [sampling]
    clarifyjax serve MODEL_DIR [--host 127.0.0.1] [--port N]
    clarifyjax evaluate CONFIG [KEY=VALUE ...]
    clarifyjax discriminator-data --input FILE.tsv --out FILE.tsv [--embedder DIR]
                                  [--neighbours N] [--overwrite]

Each subcommand lives with its domain and registers in `clarifyjax.core.commands` (see there);
this module imports them all, builds the parser and runs one.

Run functions import jax and the models themselves, so `clarifyjax --help` stays fast.

What the command line promises (issue 11):
* Options and positionals may be mixed in any order (`train CONFIG --no-progress k=v`).
* Every numeric option has a range, checked while parsing, before any file is read or any model
  loaded; the message names the option (`--gain`), never an internal field. NaN and infinity are
  never accepted.
* `score-questions --out` is checked before any work (a directory, a device, an earlier run's
  results without --overwrite, an input file, a folder that cannot be written) and written once,
  at the end, by a rename; finished chunks wait beside it (clarifyjax.files.chunkstore), so the same
  command resumes a killed run.
* Bad input - a usage error, `CLIError`, the project's CheckpointError / ConfigError / DataError /
  TextFormatError (which name the file, line and field), an OSError (named by its path) - is
  printed as one line, `clarifyjax SUBCOMMAND: error: ...`, and `main` returns 2; no traceback.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from clarifyjax.core.commands import SUBCOMMANDS, CLIError, CommandParser, UsageError, one_line
from clarifyjax.files.textfiles import describe_os_error

# Each import registers its subcommands, in the order `clarifyjax --help` lists them.
import clarifyjax.reward.command  # noqa: F401,I001
import clarifyjax.training.command  # noqa: F401
import clarifyjax.serve.command  # noqa: F401
import clarifyjax.evaluation.command  # noqa: F401
from clarifyjax.app import ask, interact, web  # noqa: F401
from clarifyjax.config.loader import ConfigError
from clarifyjax.files.tables import DataError
from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.text.formats import TextFormatError



def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; `parser.subcommand_parsers[name]` is each subcommand's own."""
    parser = CommandParser(
        prog="clarifyjax", description="ClarifyDelphi in JAX: clarification questions for moral "
        "situations, trained with a defeasibility reward")
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
    if argv and argv[0] in parser.subcommand_parsers:
        args = parser.subcommand_parsers[argv[0]].parse_intermixed_args(argv[1:])
        args.command = argv[0]
        return args
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
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
        return int(args.run(args) or 0)
    except (CLIError, CheckpointError, ConfigError, DataError, TextFormatError) as e:
        message = str(e)
    except OSError as e:  # unwritable output, full disk, unreadable folder: name the path
        message = describe_os_error(e)
    print(f"clarifyjax {args.command}: error: {one_line(message)}", file=sys.stderr)
    return 2
