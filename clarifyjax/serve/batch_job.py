"""`clarifyjax generate`: a JSONL file of prompts through a `TextGenerator`, resumable.

Each row is {"id", "prompt"} or {"id", "messages"} with optional per-row sampling fields; every
bad row is refused, naming file, line and field, before a model loads (`_row`). The output, one
line per row in input order, is written once at the end; a killed run resumes from its finished
chunks and writes what an uninterrupted run would have (`generate_records`)."""
from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from collections.abc import Sequence

import numpy as np

from clarifyjax.core.buckets import equal_chunks
from clarifyjax.files.chunkstore import ChunkStore, fingerprint
from clarifyjax.core.ranges import number_type
from clarifyjax.files.tables import DataError, jsonl_objects
from clarifyjax.text.generator import (Prompt, Sampling, TextGenerator, TokenCounter, check_messages)

SAMPLING_FIELDS = ("max_new_tokens", "min_new_tokens", "temperature", "top_k", "top_p", "stop")
ROW_FIELDS = ("id", "prompt", "messages") + SAMPLING_FIELDS


@dataclasses.dataclass(frozen=True)
class PromptRow:
    """One input row: its id, prompt (text or chat), overrides and where it was read."""

    id: str | int
    prompt: Prompt
    sampling: Sampling
    where: str


# An input row is {"id", "prompt"} (a raw prompt) or {"id", "messages": [{"role", "content"}, ...]}
# (a chat, rendered with the model's template), with optional per-row max_new_tokens,
# min_new_tokens, temperature (0 = greedy), top_k, top_p and stop (a string or a list). Any other
# field, a missing or repeated id, or a bad value is one error naming the file, line and field,
# before any model is loaded.
def _row(path: Path, line: int, obj: dict) -> PromptRow:
    where = f"{path}:{line}"
    unknown = [k for k in obj if k not in ROW_FIELDS]
    if unknown:
        raise DataError(f"{where}: unknown field {unknown[0]!r}; a row takes {list(ROW_FIELDS)}")
    row_id = obj.get("id")
    if isinstance(row_id, bool) or not isinstance(row_id, (str, int)) or row_id == "":
        raise DataError(f"{where}: field 'id' must be a non-empty string or an integer, got "
                        f"{row_id!r}")
    if ("prompt" in obj) == ("messages" in obj):
        raise DataError(f"{where}: a row needs exactly one of 'prompt' (text) and 'messages' "
                        "(a chat)")
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise DataError(f"{where}: field 'prompt' must be non-empty text")
    else:
        try:
            prompt = check_messages(obj["messages"])
        except ValueError as e:
            raise DataError(f"{where}: field {e}") from None
    overrides = {k: obj[k] for k in SAMPLING_FIELDS if obj.get(k) is not None}
    if isinstance(overrides.get("stop"), str):
        overrides["stop"] = [overrides["stop"]]
    if not isinstance(overrides.get("stop", []), list):
        raise DataError(f"{where}: field 'stop' must be a string or a list of strings")
    try:
        sampling = Sampling(**overrides)
    except (ValueError, TypeError) as e:
        raise DataError(f"{where}: field {str(e).removeprefix('sampling: ')}") from None
    return PromptRow(row_id, prompt, sampling, where)


def read_prompts(path: str | os.PathLike) -> list[PromptRow]:
    """Every row of a prompts file; DataError naming the file, line and field of a bad one."""
    path = Path(path)
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        raise DataError(f"{path}: expected a .jsonl file (one JSON object per line)")
    rows, seen = [], {}
    for line, obj in jsonl_objects(path):
        row = _row(path, line, obj)
        if row.id in seen:
            raise DataError(f"{row.where}: id {row.id!r} is already used at line {seen[row.id]}")
        seen[row.id] = line
        rows.append(row)
    return rows


def check_fit(generator: TextGenerator, rows: Sequence[PromptRow], sampling: Sampling) -> None:
    """Each prompt rendered and counted against the context with its max_new_tokens (for a
    generator that counts tokens); DataError naming the row otherwise."""
    if not isinstance(generator, TokenCounter):
        return
    defaults = getattr(generator, "defaults", Sampling())
    for row in rows:
        s = row.sampling.with_defaults(sampling).with_defaults(defaults)
        try:
            length = generator.count_tokens(row.prompt)
        except ValueError as e:
            raise DataError(f"{row.where}: {e}") from None
        if length + (s.max_new_tokens or 0) > generator.context_length:
            raise DataError(f"{row.where}: {length} prompt tokens + max_new_tokens "
                            f"{s.max_new_tokens} is more than the model's context length of "
                            f"{generator.context_length}")


@dataclasses.dataclass
class ChunkRecords:
    """A finished chunk's output rows (as written to the output file)."""

    records: list


def _record(row: PromptRow, completions, logprobs: bool) -> dict:
    out = []
    for c in completions:
        item = {"text": c.text, "finish_reason": c.finish_reason, "num_tokens": len(c.token_ids)}
        if logprobs:
            item.update(token_ids=list(c.token_ids), logprobs=[float(x) for x in c.logprobs])
        out.append(item)
    return {"id": row.id, "completions": out}


def chunk_seed(seed: int, chunk: int) -> int:
    return int(np.random.SeedSequence([seed, chunk]).generate_state(1)[0])


# Output: one line per input row, in input order: {"id", "completions": [{"text", "finish_reason",
# "num_tokens"[, "token_ids", "logprobs"]} x n]}, written once at the end by a rename. Finished
# chunks wait in .OUT.partial/ (`chunkstore`); chunk i is always the same rows with the seed
# `chunk_seed(seed, i)`, so a rerun after a kill writes what an uninterrupted run would have. A rerun
# with other settings, inputs or model is refused while chunks wait (--overwrite discards them).
def generate_records(generator: TextGenerator, rows: Sequence[PromptRow], *, out: Path,
                     sampling: Sampling, n: int, seed: int, chunk_rows: int,
                     options: dict, folders: Sequence[Path], logprobs: bool = False,
                     overwrite: bool = False, progress: bool = True, error=DataError,
                     ) -> tuple[list[dict], int, ChunkStore]:
    """The output rows of every input row, in order, how many chunks an interrupted run had
    finished, and the store (`finish` it once the output is written). `options` (the settings
    that change the output) and the files of `folders`
    make the resume fingerprint, with the rows themselves."""
    from clarifyjax.core.metrics_log import progress as progress_bar

    texts = [repr((r.id, r.prompt, r.sampling)) for r in rows]
    store = ChunkStore(out, fingerprint({**options, "n": n, "seed": seed,
                                         "chunk_rows": chunk_rows, "logprobs": logprobs,
                                         "sampling": repr(sampling)}, (texts,), folders),
                       ChunkRecords, error=error)
    found = store.start(refuse_other_runs=not overwrite)
    chunks = equal_chunks(len(rows), chunk_rows)
    done = [store.load(i) if found else None for i in range(len(chunks))]
    done = [d if d is not None and len(d.records) == c.stop - c.start else None
            for d, c in zip(done, chunks)]
    reused = sum(d is not None for d in done)
    bar = progress_bar(len(rows), sum(len(d.records) for d in done if d is not None), progress)
    try:
        for i, chunk in enumerate(chunks):
            if done[i] is not None:
                continue
            part = rows[chunk]
            completions = generator.complete([r.prompt for r in part],
                                             [r.sampling.with_defaults(sampling) for r in part],
                                             n, chunk_seed(seed, i))
            done[i] = ChunkRecords([_record(r, c, logprobs) for r, c in zip(part, completions)])
            store.save(i, done[i])
            bar.update(len(part))
    finally:
        bar.close()
    return [record for d in done for record in d.records], reused, store


# --------------------------------------------------------------------------- options

SEED = number_type(int, f"[0, {2**32 - 1}]")


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, metavar="MODEL_DIR",
                   help="Hugging Face decoder-only folder (config.json, safetensors, tokenizer, "
                        "generation_config.json)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--chat-template", choices=("model", "vicuna_v1.1"), default="model",
                   help="how chats (messages) are rendered: the folder's own template, or "
                        "FastChat's vicuna_v1.1 (lmsys' Vicuna folders ship none); text "
                        "prompts are sent raw")
    p.add_argument("--batch-size", type=number_type(int, "[1, 4096]"), default=32,
                   help="most rows (prompts x n) per jitted batch")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (default: the model's generation_config.json; a row's "
                             "own fields win)")
    g.add_argument("--max-new-tokens", type=number_type(int, ">= 1"), default=None)
    g.add_argument("--min-new-tokens", type=number_type(int, ">= 0"), default=None)
    g.add_argument("--temperature", type=number_type(float, ">= 0"), default=None,
                   help="0 = greedy")
    g.add_argument("--top-k", type=number_type(int, ">= 0"), default=None, help="0 = off")
    g.add_argument("--top-p", type=number_type(float, "(0, 1]"), default=None)
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="a stop string (repeat for more, at most 4)")


def add_generate_options(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument("--input", type=Path, required=True, metavar="PROMPTS.jsonl",
                   help='one object per line: "id" and "prompt" (text) or "messages" (a chat), '
                        "optionally max_new_tokens, min_new_tokens, temperature, top_k, top_p, "
                        "stop")
    p.add_argument("--out", type=Path, required=True, metavar="OUT.jsonl",
                   help="one line per input row, in order, written at the end in one rename; "
                        "finished chunks wait in .OUT.partial/ beside it, so that the same "
                        "command resumes a killed run")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out, and discard the finished chunks of an "
                        "interrupted run with other settings")
    p.add_argument("--n", type=number_type(int, "[1, 1024]"), default=1,
                   help="completions per prompt")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--chunk-rows", type=number_type(int, ">= 1"), default=256,
                   help="prompts per saved chunk (what a resumed run may redo)")
    p.add_argument("--logprobs", action="store_true",
                   help="also write each completion's token ids and their log-probs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_sampling_options(p)


def sampling_of(args, *, error=ValueError) -> Sampling:
    """The command's sampling options as a `Sampling`; `error` names the option."""
    try:
        return Sampling(max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        stop=tuple(args.stop))
    except ValueError as e:
        raise error("--" + str(e).removeprefix("sampling: ").replace("_", "-", 2)) from None
