"""`clarifyjax score-questions`: the reward of each (situation, question) pair, resumable by chunks."""
from __future__ import annotations

import argparse
from pathlib import Path

import jax

from clarifyjax.core.commands import CLIError, json_line, subcommand
from clarifyjax.core.ranges import number_type
from clarifyjax.files.presets import config_type
from clarifyjax.config.score import MAX_TOKENS, add_reward_options  # imports no JAX
from clarifyjax.files.textfiles import atomic_write_bytes, check_output
from clarifyjax.config import score
from clarifyjax.data.situations import read_texts
from clarifyjax.reward import pipeline
from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.reward.jsd import RewardNormalizer
from clarifyjax.core.buckets import equal_chunks
from clarifyjax.files.chunkstore import ChunkStore, fingerprint
from clarifyjax.config.loader import config_to_dict


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
    config.add_argument("--config", type=config_type(), default=None, metavar="FILE.yaml",
                        help="the RewardConfig mapping (what sits under rewards:), or a whole "
                             "PPO run config (kind: ppo, a file or a preset's name), whose rewards: "
                             "section is read")
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
    if (args.gain is None) != (args.bias is None):
        raise CLIError("--gain and --bias go together")
    for option in ("--situation-column", "--question-column"):
        if not getattr(args, option[2:].replace("-", "_")).strip():
            raise CLIError(f"{option}: empty")
    rewards = score.reward_config(args)
    for key, folder in score.reward_model_folders(rewards).items():
        if folder is not None and not Path(folder).is_dir():
            raise CLIError(f"{score.flag_of(key)} {folder}: " + (
                "not a folder" if Path(folder).exists() else "no such folder"))
    return rewards


def _read_inputs(args) -> tuple[list[str], list[str], list[str], list[str]]:
    situations, s_where = read_texts(args.situations, args.situation_column, limit=args.limit)
    questions, q_where = read_texts(args.questions, args.question_column, limit=args.limit)
    if len(situations) != len(questions):
        raise CLIError(f"{args.situations} has {len(situations)} situations but {args.questions} "
                       f"has {len(questions)} questions; they pair up line by line")
    return situations, s_where, questions, q_where


def _load_pipeline(args, rewards):
    judge_options = {"class_step": args.class_step}
    try:
        return pipeline.load_pipeline(
            rewards, normalizer=None if args.gain is None else RewardNormalizer(args.gain,
                                                                                args.bias),
            nli_batch_size=2 * args.batch_size, judge_options=judge_options,
            **({} if args.backend is None else {"backend": args.backend}))
    except CheckpointError:
        raise
    except ValueError as e:  # e.g. --max-input-length beyond the NLI model's positions
        raise CLIError(f"the models do not fit these options: {e}") from e


# Options that do not change the scores, left out of the resume fingerprint.
_NOT_IN_FINGERPRINT = ("out", "overwrite", "run", "command")


def _score_chunks(args, rewards, situations: list[str], questions: list[str]):
    """Every chunk's `RewardOutput`, resuming an interrupted run of the same command (see
    clarifyjax.files.chunkstore); models are loaded only when a chunk is left to score."""
    options = {k: v for k, v in vars(args).items() if k not in _NOT_IN_FINGERPRINT}
    options["rewards"] = config_to_dict(rewards)  # what --config and KEY=VALUE gave, too
    store = ChunkStore(args.out, fingerprint(options, (situations, questions),
                                             tuple(score.reward_model_folders(rewards).values())),
                       pipeline.RewardOutput, error=CLIError)
    found = store.start()
    key, scorer, outputs, reused = jax.random.key(args.seed), None, [], 0
    chunks = equal_chunks(len(situations), args.batch_size)
    for i, chunk in enumerate(chunks):
        output = store.load(i) if found else None
        if output is None or len(output.reward) != chunk.stop - chunk.start:
            scorer = scorer or _load_pipeline(args, rewards)
            # fold_in(key, i) whether resumed or not: a resumed run scores as an uninterrupted one
            output = scorer(situations[chunk], questions[chunk], rng=jax.random.fold_in(key, i))
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
    rewards = _check_score_options(args)
    check_output(args.out, overwrite=args.overwrite, error=CLIError,
                 inputs=(("--situations", args.situations), ("--questions", args.questions)))
    situations, s_where, questions, q_where = _read_inputs(args)
    store, outputs = _score_chunks(args, rewards, situations, questions)
    out = pipeline.concat_outputs(outputs)
    lines = []
    for i, row in enumerate(out.rows()):
        record = {"situation_at": s_where[i], "question_at": q_where[i],
                  "situation": situations[i], "question_as_given": questions[i], **row}
        record["question_truncated"] = row["question"] != " ".join(questions[i].split())
        lines.append(json_line(record, q_where[i]))
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
