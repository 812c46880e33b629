"""`clarifyjax generate` (a JSONL file of prompts, resumable) and `clarifyjax serve` (the
OpenAI-compatible server), both on a local causal LM folder."""
from __future__ import annotations

import argparse

from clarifyjax.core.commands import CLIError, json_line, subcommand
from clarifyjax.files.textfiles import atomic_write_bytes, check_output
from clarifyjax.serve.batch_job import add_generate_options, add_model_options
from clarifyjax.serve import batch_job
from clarifyjax.serve.openai_api import OpenAIServer, ServerLimits, add_server_options
from clarifyjax.serve.http_server import serve_forever



def _generate_options(p: argparse.ArgumentParser) -> None:
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
    sampling = batch_job.sampling_of(args, error=CLIError)
    check_output(args.out, overwrite=args.overwrite, option="--out", error=CLIError,
                 inputs=(("--input", args.input),))
    rows = batch_job.read_prompts(args.input)
    lm = _local_lm(args)  # the tokenizer now, the weights when the first chunk runs
    batch_job.check_fit(lm, rows, sampling)
    options = {k: str(v) for k, v in vars(args).items()
               if k not in ("input", "out", "overwrite", "no_progress", "run", "command")}
    records, reused, store = batch_job.generate_records(
        lm, rows, out=args.out, sampling=sampling, n=args.n, seed=args.seed,
        chunk_rows=args.chunk_rows, options=options, folders=(args.model,),
        logprobs=args.logprobs, overwrite=args.overwrite, progress=not args.no_progress,
        error=CLIError)
    lines = [json_line(r, f"{args.input} id {r['id']!r}") for r in records]
    atomic_write_bytes(args.out, ("\n".join(lines) + "\n").encode("utf-8"))
    store.finish()
    if reused:
        print(f"resumed: {reused} chunk(s) were finished by an interrupted run")
    print(f"generated {len(rows)} x {args.n} completions -> {args.out}")
    return 0


def _serve_options(p: argparse.ArgumentParser) -> None:
    from clarifyjax.serve.continuous import add_batching_options

    add_model_options(p)
    add_server_options(p)
    add_batching_options(p)


@subcommand("serve", "an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, "
            "/v1/models) for a local causal LM, batching concurrent requests", _serve_options)
def run_serve(args: argparse.Namespace) -> int:
    lm = _local_lm(args)
    if args.slot_length is not None and args.slot_length > lm.context_length:
        raise CLIError(f"--slot-length {args.slot_length} is more than the model's context "
                       f"length of {lm.context_length} positions (a slot holds a prompt and "
                       "its new tokens)")
    lm.load()
    limits = ServerLimits(max_n=args.max_n, max_tokens=args.max_tokens,
                          max_batch_rows=args.batch_size, max_queued_rows=args.max_queued_rows,
                          window_s=args.window_ms / 1000)
    server = OpenAIServer(lm, name=args.name, limits=limits, batcher=_batcher(lm, args))
    serve_forever(server.app, args.host, args.port,
                  announce=lambda url: print(f"serving {server.name} at {url}/v1", flush=True),
                  allowed_hosts=args.allowed_host, allowed_origins=args.allow_origin)
    return 0


def _batcher(lm, args):
    """`--batching continuous`: the slots engine (None, `--batching window`: the server's own
    window batcher)."""
    from clarifyjax.serve.continuous import ContinuousBatcher, SlotSettings

    if args.batching == "window":
        return None
    settings = SlotSettings(slots=args.slots or args.batch_size, length=args.slot_length,
                            chunk=args.prefill_chunk)
    try:
        return ContinuousBatcher(lm, settings, max_queued_rows=args.max_queued_rows)
    except ValueError as e:
        raise CLIError(str(e)) from None
