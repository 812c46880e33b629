"""`clarifyjax lm-eval ARGS...`: lm-evaluation-harness's own command line (`lm_eval ARGS...`) with
the model "clarifyjax" registered, since lm-eval 0.4.13 finds models only in its own table (no
entry points, no plugin path): `clarifyjax lm-eval --model clarifyjax --model_args
pretrained=DIR --tasks hellaswag --include_path TASKS`. Nothing is loaded to register it."""
from __future__ import annotations

import argparse
import sys

from clarifyjax.core.commands import CLIError, one_line, subcommand

INSTALL = "pip install 'lm-eval[hf]==0.4.13'"


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("lm_eval_args", nargs="*", metavar="ARGS",
                   help="lm_eval's own arguments (see `clarifyjax lm-eval --help`), e.g. --model "
                   "clarifyjax --model_args pretrained=DIR,batch_size=16 --tasks TASK")


@subcommand("lm-eval", "lm-evaluation-harness's command line, with the local causal LM model "
            "`--model clarifyjax --model_args pretrained=DIR`", _options, passthrough=True)
def run_lm_eval(args: argparse.Namespace) -> int:
    try:
        from lm_eval.__main__ import cli_evaluate

        from clarifyjax.harness import lm_eval_model  # noqa: F401  (registers "clarifyjax")
    except ImportError as e:
        raise CLIError(f"lm-evaluation-harness is not installed ({e}): {INSTALL}") from e
    saved = sys.argv
    sys.argv = ["lm-eval", *args.argv]
    try:
        cli_evaluate()
    except SystemExit as e:  # argparse's --help and usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except ValueError as e:  # a model argument, a task name, a generation setting
        raise CLIError(one_line(str(e))) from e
    finally:
        sys.argv = saved
    return 0
