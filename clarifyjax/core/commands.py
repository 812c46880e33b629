"""The command registry every `clarifyjax` subcommand registers in, and the errors they raise.

    @subcommand("train", "fine-tune or PPO-train a model from a YAML config", _train_options)
    def run_train(args: argparse.Namespace) -> int: ...

Each domain keeps its own commands; `clarifyjax.cli` imports them all and builds the parser from
`SUBCOMMANDS`. Nothing here imports JAX."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
from collections.abc import Callable


class CLIError(ValueError):
    """Bad input or options; the message names the file, line and field."""


class UsageError(CLIError):
    """A command line that does not parse; the message starts with the (sub)command's name."""


class CommandParser(argparse.ArgumentParser):
    """argparse prints usage (many lines for score-questions) and exits; we want one line and a
    return value, so that `main([...])` returns 2 like every other bad input."""

    def __init__(self, *args, **kwargs):
        # A misspelt option must not run as the option it happens to be a prefix of.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")



@dataclasses.dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    add_options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    passthrough: bool = False  # its arguments go to another program unparsed (`args.argv`)


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, help: str, add_options: Callable[[argparse.ArgumentParser], None], *,
               passthrough: bool = False):
    """Register the decorated `run(args) -> exit status` as `clarifyjax NAME`; a `passthrough`
    command gets its words unparsed as `args.argv` (its options only document them)."""

    def register(run: Callable[[argparse.Namespace], int]):
        if name in SUBCOMMANDS:
            raise ValueError(f"clarifyjax subcommand {name!r} is registered twice")
        SUBCOMMANDS[name] = Subcommand(name, help, add_options, run, passthrough)
        return run

    return register



def package_version() -> str:
    """The installed distribution's version (pyproject's, the one place it is written), or
    "unknown (not installed)" when the packages run from a folder that pip did not install."""
    try:
        return importlib.metadata.version("clarifyjax")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def version_option(parser: argparse.ArgumentParser) -> None:
    """``--version``: the program's name and `package_version`."""
    parser.add_argument("--version", action="version", version=f"{parser.prog} {package_version()}")


def one_line(message: str) -> str:
    """`message` on one line: a multi-line message's lines joined with "; "."""
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())



LINE_BREAKS_ESCAPED = str.maketrans({c: f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"})


def json_line(record: dict, where: str) -> str:
    """One JSONL line; a NaN or infinity (invalid JSON) is an error naming the row and field."""
    try:
        line = json.dumps(record, ensure_ascii=False, allow_nan=False)
        # JSON allows these raw, but str.splitlines (and so many JSONL readers) splits on them.
        return line.translate(LINE_BREAKS_ESCAPED)
    except ValueError:
        bad = [k for k, v in record.items()
               if not all(math.isfinite(x) for x in (v if isinstance(v, list) else [v])
                          if isinstance(x, float))]
        raise CLIError(f"{where}: score(s) {bad} are not finite (NaN or infinity); nothing was "
                       "written (a float16 model overflowing? try --dtype float32)") from None


