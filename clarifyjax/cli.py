"""The `clarifyjax` command (also `python -m clarifyjax`): `clarifyjax SUBCOMMAND [options]`.

    clarifyjax score-questions --situations FILE --questions FILE --answerer DIR --fusion DIR
                               --judge DIR [--nli DIR] --out FILE.jsonl

A subcommand is a function that adds its options to a parser and a function that runs it:

    def _train_options(parser: argparse.ArgumentParser) -> None: ...

    @subcommand("train", "fine-tune or PPO-train a model from a YAML config", _train_options)
    def run_train(args: argparse.Namespace) -> int: ...

Run functions import jax and the models themselves, so `clarifyjax --help` stays fast. Bad input
(`CLIError`, and the project's CheckpointError / DataError / TextFormatError, which name the file,
line and field) is printed as one line, `clarifyjax SUBCOMMAND: error: ...`, with exit status 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

from clarifyjax.config import NLI_THRESHOLD  # one default with the YAML's; imports no JAX


class CLIError(ValueError):
    """Bad input or options; the message names the file, line and field."""


@dataclasses.dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    add_options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, help: str, add_options: Callable[[argparse.ArgumentParser], None]):
    """Register the decorated `run(args) -> exit status` as `clarifyjax NAME`."""

    def register(run: Callable[[argparse.Namespace], int]):
        if name in SUBCOMMANDS:
            raise ValueError(f"clarifyjax subcommand {name!r} is registered twice")
        SUBCOMMANDS[name] = Subcommand(name, help, add_options, run)
        return run

    return register


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clarifyjax", description="ClarifyDelphi in JAX: clarification questions for moral "
        "situations, trained with a defeasibility reward")
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for command in SUBCOMMANDS.values():
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_options(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `clarifyjax` (pyproject [project.scripts]); returns the exit status."""
    args = build_parser().parse_args(argv)
    from clarifyjax.data import DataError
    from clarifyjax.models.checkpoint_io import CheckpointError
    from clarifyjax.text import TextFormatError

    try:
        return int(args.run(args) or 0)
    except (CLIError, CheckpointError, DataError, TextFormatError, FileNotFoundError) as e:
        print(f"clarifyjax {args.command}: error: {e}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- score-questions


def read_texts(path: Path, column: str, *, limit: int | None = None
               ) -> tuple[list[str], list[str]]:
    """(texts, where) from a .tsv / .csv / .jsonl file (column `column`, header row) or any
    other file (one text per line). `where[i]` is "FILE:LINE". An empty text raises naming it."""
    from clarifyjax.data import read_table

    path = Path(path)
    if not path.is_file():
        raise CLIError(f"{path}: no such file")
    if path.suffix in (".tsv", ".csv", ".jsonl"):
        table = read_table(path, (column,), resolve=False)  # DataError names file:line:column
        texts = [row[column] for row in table.rows]
        where = [table.where(i) for i in range(len(table))]
    else:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise CLIError(f"{path}: not UTF-8 text ({e})") from e
        texts, where = lines, [f"{path}:{i}" for i in range(1, len(lines) + 1)]
        for text, loc in zip(texts, where):
            if not text.strip():
                raise CLIError(f"{loc}: field {column!r} is empty")
    if limit is not None:
        texts, where = texts[:limit], where[:limit]
    if not texts:
        raise CLIError(f"{path}: no {column}s")
    return texts, where


def equal_chunks(n: int, size: int) -> list[slice]:
    """ceil(n / size) slices of n rows whose sizes differ by at most one, so that each batch pads
    to the same shapes (a short last chunk would compile every stage again)."""
    k = max(1, -(-n // size))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _score_options(p: argparse.ArgumentParser) -> None:
    io = p.add_argument_group("input and output")
    io.add_argument("--situations", type=Path, required=True,
                    help="one situation per line (.txt), or a .tsv/.csv/.jsonl with a header")
    io.add_argument("--questions", type=Path, required=True,
                    help="one question per line, or a table (may be the same file)")
    io.add_argument("--situation-column", default="situation")
    io.add_argument("--question-column", default="question")
    io.add_argument("--limit", type=int, default=None, help="score only the first N rows")
    io.add_argument("--out", type=Path, required=True, help="JSONL: one line per question")
    models = p.add_argument_group("models (Hugging Face folders, safetensors)")
    models.add_argument("--answerer", type=Path, required=True, help="answer generator T5")
    models.add_argument("--fusion", type=Path, required=True, help="sentence fusion T5")
    models.add_argument("--judge", type=Path, required=True,
                        help="Delphi-like T5 read through class tokens, or a 3-label classifier")
    models.add_argument("--nli", type=Path, default=None,
                        help="NLI ...ForSequenceClassification folder (omit: no filter)")
    models.add_argument("--backend", choices=("hf", "tf_text"), default="hf",
                        help="T5 tokenizer backend")
    models.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    models.add_argument("--max-input-length", type=int, default=128)
    judge = p.add_argument_group("judge")
    judge.add_argument("--judge-kind", choices=("auto", "t5", "encoder"), default="auto")
    judge.add_argument("--class-prefix", default="<class>",
                       help="target prefix teacher-forced before the class token")
    judge.add_argument("--class-tokens", default="-1,0,1",
                       help="class tokens for bad,ok,good (T5 judge)")
    judge.add_argument("--class-step", type=int, default=None,
                       help="check that the prefix is this many tokens (Delphi: 4)")
    judge.add_argument("--encoder-labels", default="bad,ok,good",
                       help="classifier judge: its label names for bad,ok,good")
    judge.add_argument("--judgment-max-length", type=int, default=32)
    reward = p.add_argument_group("reward")
    reward.add_argument("--dropped-answer", choices=("zero_reward", "resample", "blank"),
                        default="zero_reward")
    reward.add_argument("--resample-k", type=int, default=2)
    reward.add_argument("--nli-threshold", type=float, default=NLI_THRESHOLD,
                        help="drop when P(entailment) + P(contradiction) >= this (default: argmax)")
    reward.add_argument("--answer-max-length", type=int, default=32)
    reward.add_argument("--answer-temperature", type=float, default=0.0, help="0: greedy")
    reward.add_argument("--fusion-max-length", type=int, default=64)
    reward.add_argument("--max-question-words", type=int, default=64,
                        help="longer questions are cut (and counted)")
    reward.add_argument("--no-judgment-text", action="store_true",
                        help="leave the judge's judgment out of the answer generator's input")
    reward.add_argument("--gain", type=float, default=None, help="reward = gain * JSD + bias")
    reward.add_argument("--bias", type=float, default=None)
    run = p.add_argument_group("run")
    run.add_argument("--batch-size", type=int, default=64, help="questions per pipeline call")
    run.add_argument("--seed", type=int, default=0)


def pipeline_config(args: argparse.Namespace):
    """The score-questions options as a `PipelineConfig`, through the mapping that a PPO run's
    `rewards:` section goes through (`PipelineConfig.from_options`)."""
    from clarifyjax.reward import RewardNormalizer
    from clarifyjax.reward_pipeline import PipelineConfig

    return PipelineConfig.from_options(
        dropped_answer=args.dropped_answer, resample_k=args.resample_k,
        answer_max_length=args.answer_max_length, answer_temperature=args.answer_temperature,
        fusion_max_length=args.fusion_max_length, max_question_words=args.max_question_words,
        use_judgment_text=not args.no_judgment_text, nli_threshold=args.nli_threshold,
        normalizer=None if args.gain is None else RewardNormalizer(args.gain, args.bias))


def _split(value: str, option: str) -> tuple[str, ...]:
    parts = tuple(v.strip() for v in value.split(","))
    if len(parts) != 3 or not all(parts):
        raise CLIError(f"{option}: expected 3 comma-separated values (bad,ok,good), got {value!r}")
    return parts


@subcommand("score-questions", "reward of each (situation, question): answers, fused situations, "
            "judge distributions, JSD; prints the paper's Table 4", _score_options)
def run_score_questions(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be >= 1, got {args.batch_size}")
    if (args.gain is None) != (args.bias is None):
        raise CLIError("--gain and --bias go together")
    situations, s_where = read_texts(args.situations, args.situation_column, limit=args.limit)
    questions, q_where = read_texts(args.questions, args.question_column, limit=args.limit)
    if len(situations) != len(questions):
        raise CLIError(f"{args.situations} has {len(situations)} situations but {args.questions} "
                       f"has {len(questions)} questions; they pair up line by line")

    import jax

    from clarifyjax.delphi import Sampling
    from clarifyjax.models.checkpoint_io import atomic_write_bytes
    from clarifyjax.reward_pipeline import RewardPipeline, concat_outputs

    config = pipeline_config(args)
    judge_options = dict(
        kind=None if args.judge_kind == "auto" else args.judge_kind,
        class_prefix=args.class_prefix, class_tokens=_split(args.class_tokens, "--class-tokens"),
        class_step=args.class_step, judgment=Sampling(max_new_tokens=args.judgment_max_length),
        encoder_labels=_split(args.encoder_labels, "--encoder-labels"))
    pipeline = RewardPipeline.from_folders(
        answerer=args.answerer, fusion=args.fusion, judge=args.judge, nli=args.nli,
        config=config, backend=args.backend, dtype=args.dtype,
        max_input_length=args.max_input_length, nli_batch_size=2 * args.batch_size,
        judge_options=judge_options)

    key = jax.random.key(args.seed)
    outputs = []
    for i, chunk in enumerate(equal_chunks(len(situations), args.batch_size)):
        outputs.append(pipeline(situations[chunk], questions[chunk],
                                rng=jax.random.fold_in(key, i)))
    out = concat_outputs(outputs)
    lines = []
    for i, row in enumerate(out.rows()):
        record = {"situation_at": s_where[i], "question_at": q_where[i],
                  "situation": situations[i], "question_as_given": questions[i], **row}
        record["question_truncated"] = row["question"] != " ".join(questions[i].split())
        lines.append(json.dumps(record, ensure_ascii=False))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out, ("\n".join(lines) + "\n").encode("utf-8"))

    summary = out.table4()
    print(f"scored {len(lines)} questions -> {args.out}")
    print(f"Table 4: avg. JSD {summary['avg_jsd']:.4f} over {summary['pairs']} pairs; "
          f"judgment flips {100 * summary['judgment_flips']:.1f}% of {summary['answers']} answers")
    if out.valid.any() and config.normalizer is not None:
        print(f"mean reward {float(out.reward[out.valid].mean()):.4f} (normalized)")
    print("counts: " + ", ".join(f"{k} {v}" for k, v in out.counts.items()))
    if args.nli is None:
        print("note: no --nli given, answers were not filtered")
    return 0


# --------------------------------------------------------------------------- train


def _train_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path,
                   help="YAML run config: kind sft (configs/sft_*.yaml) or ppo (configs/ppo_*.yaml)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="config overrides, e.g. run.steps=20 ppo.batch_size=8 (an unknown key is an "
                        "error)")
    p.add_argument("--dry-run", action="store_true",
                   help="build the abstract state (jax.eval_shape: nothing allocated), print every "
                        "parameter's sharding and the bytes per device, compile one step without "
                        "running it; options dryrun.compile=ppo|sft|none, dryrun.num_layers=N, "
                        "dryrun.rows=N")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-tensorboard", action="store_true", help="metrics.jsonl only")


@subcommand("train", "fine-tune (kind: sft) or PPO-train (kind: ppo) a model from a YAML config; "
            "resumes from the run's newest checkpoint", _train_options)
def run_train(args: argparse.Namespace) -> int:
    from clarifyjax.config import ConfigError, load_config, parse_overrides

    if args.dry_run:
        from clarifyjax import distributed  # before any other JAX call

        distributed.initialize()
        from clarifyjax import dryrun

        try:
            dryrun.main(str(args.config), list(args.overrides),
                        say=print if distributed.is_primary() else (lambda _: None))
        except (ConfigError, ValueError) as e:
            raise CLIError(str(e)) from e
        return 0

    try:
        cfg = load_config(args.config, parse_overrides(args.overrides))  # fails fast, no JAX
        from clarifyjax import distributed  # before any other JAX call

        distributed.initialize()
        from clarifyjax import train

        result = train.run(cfg, tensorboard=not args.no_tensorboard,
                           progress=not args.no_progress)
    except ConfigError as e:
        raise CLIError(str(e)) from e
    if result["stopped"]:
        print(f"stopped at step {result['step']} on request; the checkpoint is in "
              f"{result['output_dir']}/checkpoints (run the same command to resume)")
    else:
        print(f"done: {result['step']} steps; model exported to {result['final']}")
    return 0
