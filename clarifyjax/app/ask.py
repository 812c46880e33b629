"""`clarifyjax ask MODELS.yaml --situations FILE --out FILE`: ClarifyDelphi's question for each
situation of a file, with the imagined weakener and strengthener answers, their fused situations
and the judge's P(bad, ok, good) of each (`Clarifier.ask`).

The output (JSONL, or CSV by its suffix) is written once, at the end; a killed run resumes from its
finished chunks. Texts cut to a model's max_input_length are counted in a closing note."""
from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import jax

from clarifyjax.app.options import add_models_options, load_clarifier, load_models
from clarifyjax.core.commands import CLIError, json_line, subcommand
from clarifyjax.core.ranges import number_type
from clarifyjax.app.clarifier import AskOutput, CLASSES
from clarifyjax.files.textfiles import atomic_write_bytes, check_output
from clarifyjax.data.situations import read_texts
from clarifyjax.core.buckets import equal_chunks
from clarifyjax.files.chunkstore import ChunkStore, fingerprint
from clarifyjax.config.loader import config_to_dict
from clarifyjax.core.metrics_log import progress, say_through

FORMATS = {".jsonl": "jsonl", ".csv": "csv"}
# CSV columns: the lists of a JSONL row spread over one column each.
_PROBABILITY_FIELDS = ("p_base", "p_weak", "p_strong")


def _ask_options(p: argparse.ArgumentParser) -> None:
    add_models_options(p, candidates=True)
    io_ = p.add_argument_group("input and output")
    io_.add_argument("--situations", type=Path, required=True,
                     help="one situation per line (.txt), or a .tsv/.csv/.jsonl with a header")
    io_.add_argument("--situation-column", default="situation")
    io_.add_argument("--limit", type=number_type(int, ">= 1"), default=None,
                     help="only the first N situations")
    io_.add_argument("--out", type=Path, required=True,
                     help=".jsonl (one object per situation) or .csv; written at the end in one "
                          "rename, finished chunks wait in .OUT.partial/ beside it so that the "
                          "same command resumes a killed run")
    io_.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    io_.add_argument("--no-answers", action="store_true",
                     help="only the question and the judgment of each situation (no imagined "
                          "answers; with --candidates > 1 they are still made, to rank)")
    run = p.add_argument_group("run")
    run.add_argument("--batch-size", type=number_type(int, ">= 1"), default=32,
                     help="situations per chunk")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")


def csv_row(row: dict) -> dict:
    """A JSONL row as CSV columns: p_base -> p_base_bad, p_base_ok, p_base_good; candidates as
    JSON text."""
    out = {}
    for key, value in row.items():
        if key in _PROBABILITY_FIELDS:
            out.update({f"{key}_{c}": v for c, v in zip(CLASSES, value)})
        elif key == "candidates":
            out[key] = json.dumps(value, ensure_ascii=False)
        else:
            out[key] = value
    return out


def render(rows: list[dict], kind: str, where: list[str]) -> bytes:
    if kind == "jsonl":
        return ("\n".join(json_line(r, w) for r, w in zip(rows, where)) + "\n").encode("utf-8")
    flat = [csv_row(r) for r in rows]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(flat[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    return buffer.getvalue().encode("utf-8")


def cut_note(cuts: dict, rows: int) -> str:
    """The line that says how many inputs were cut to their model's max_input_length."""
    counts = ", ".join(f"{model} {count}" for model, count in sorted(cuts.items()))
    return (f"note: texts longer than a model reads were cut to its max_input_length (MODELS.yaml) "
            f"before it read them, over {rows} situation(s): {counts}")


_NOT_IN_FINGERPRINT = ("out", "overwrite", "run", "command", "no_progress")


@subcommand("ask", "ClarifyDelphi's clarification question for each situation of a file, with the "
            "imagined answers, fused situations and the judge's P(bad, ok, good)", _ask_options)
def run_ask(args: argparse.Namespace) -> int:
    kind = FORMATS.get(args.out.suffix.lower())
    if kind is None:
        raise CLIError(f"--out {args.out}: give a .jsonl or .csv file")
    if not args.situation_column.strip():
        raise CLIError("--situation-column: empty")
    cfg = load_models(args)
    check_output(args.out, overwrite=args.overwrite, option="--out", error=CLIError,
                 inputs=(("--situations", args.situations), ("MODELS.yaml", args.models)))
    situations, where = read_texts(args.situations, args.situation_column, limit=args.limit)

    options = {k: v for k, v in vars(args).items() if k not in _NOT_IN_FINGERPRINT}
    options["models"] = config_to_dict(cfg)
    r = cfg.rewards
    folders = (cfg.policy.init, r.answerer.init, r.fusion.init, r.judge.model.init,
               None if r.nli is None else r.nli.init)
    # Finished chunks wait beside the output, and chunk i is always drawn with fold_in(seed, i): the
    # same command resumes a killed run and writes what an uninterrupted run would have.
    store = ChunkStore(args.out, fingerprint(options, (situations,), folders), AskOutput,
                       error=CLIError)
    found = store.start()
    chunks = equal_chunks(len(situations), args.batch_size)
    key, clarifier, rows, reused, cuts = jax.random.key(args.seed), None, [], 0, {}
    bar = progress(len(situations), 0, not args.no_progress)
    for i, chunk in enumerate(chunks):
        output = store.load(i) if found else None
        if output is None or len(output.rows) != chunk.stop - chunk.start:
            clarifier = clarifier or load_clarifier(args, cfg)
            output = clarifier.ask(situations[chunk], jax.random.fold_in(key, i),
                                   answers=not args.no_answers)
            store.save(i, output)
        else:
            reused += 1
        rows += [{"situation_at": w, **row} for w, row in zip(where[chunk], output.rows)]
        for model, count in output.cuts.items():
            cuts[model] = cuts.get(model, 0) + count
        bar.update(chunk.stop - chunk.start)
    bar.close()
    say = say_through(None)
    if reused:
        say(f"resumed: {reused} of {len(chunks)} chunks were made by an interrupted run "
            f"({store.folder})")
    atomic_write_bytes(args.out, render(rows, kind, where))
    store.finish()
    if cuts:
        say(cut_note(cuts, len(rows)))
    say(f"asked {len(rows)} questions -> {args.out}")
    return 0
