"""SaGE pipeline benchmarks (issue 13), each against its reference method in the same run.

(a) the answer stage of `sage-jax run` for 250 prompts (the reference's answer prompt over the
    q100 file's paraphrases), 32 new tokens, top-k 10 sampling, on a random Llama-shaped model of
    about 30M parameters: the whole stage (`sage_jax.stages.Stage` over `clarifyjax.llm.LocalLM`,
    parsing and batch files included; compiled on other prompts first) against the reference
    method, `transformers` `pipeline("text-generation")` called once per prompt (vnnm404/SaGE
    scripts/model_output.py), same weights, same threads. `--reference-prompts N` times the
    reference on the first N prompts and scales its time to all of them (the JSON says so).
(b) BERTScore of N text pairs (δ-CLARIFY sentences) on all-MiniLM-L6-v2: `clarifyjax.bertscore`
    against the `bert-score` package's `BERTScorer` (the model loaded once on both sides, so that
    only scoring is timed), same layer, same pairs; equal output is checked (max |diff| of P, R, F).
(c) the ParaScore filter over N candidates: questions with 10 numbered candidates each (other
    questions of the corpus, copies, near-copies), `sage_jax.parascore.filter_paraphrases` per
    question against the reference's method: per candidate, the toolkit's `base_score([question],
    [para], [para])` (two `bert-score` calls and nltk's edit distance), on the same model.
(d) the sentence embedder as a fraction of the matmul rate: NOT DONE here (left for later).
(e) the SaGE metric on 100,000 x 5 x 384 as a fraction of the read-once bound: a jitted sum over
    the same array, timed in the same run (fraction = t_sum / t_sage).

Timing follows benchmarks/sage.py: compile / warm-up apart, ours and the reference interleaved in
rounds, best of each, PyTorch probed at all cores and at 1 thread (the reference's best kept), and
the load average recorded. The machine is shared: read the figures with the load average.

Usage: python benchmarks/sage_pipeline.py [--quick] [--skip-answer-stage] [--skip-bertscore] [--skip-filter]
       [--skip-metric] [--prompts 250] [--reference-prompts 250]
Writes benchmarks/results/sage_pipeline.json (or --out) atomically and prints it.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from _common import machine_info, write_results
from sage import best_of, interleaved, load_average, sentences, torch_thread_settings

TARGETS = {"answer_stage_speedup": 20.0, "bertscore_speedup": 2.0, "metric_read_fraction": 0.5}
LAYER = 6  # all-MiniLM-L6-v2 is not in bert-score's table: its last layer, on both sides


def _package_scorer(folder: Path, layer: int):
    from bert_score import BERTScorer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BERTScorer(model_type=str(folder), num_layers=layer, device="cpu")


def bench_bertscore(n_pairs: int, repeats: int, reference_repeats: int) -> dict:
    from clarifyjax.bertscore import bertscore, load_model
    from sage_jax.embed import default_embedder_path

    load_start = load_average()
    texts = sentences(2 * n_pairs)
    cands, refs = texts[:n_pairs], texts[n_pairs:2 * n_pairs]
    folder = default_embedder_path()
    model = load_model(folder)
    ours = lambda: bertscore(cands, refs, model=model, layer=LAYER)  # noqa: E731
    t_first, _, _ = best_of(ours, 1)  # compiles every bucket
    scorer = _package_scorer(folder, LAYER)
    package = lambda: tuple(x.numpy() for x in scorer.score(cands, refs, batch_size=64))  # noqa: E731
    threads, probe = torch_thread_settings(
        lambda: scorer.score(cands[:256], refs[:256], batch_size=64), (os.cpu_count() or 1, 1))
    race = interleaved(ours, package, threads, repeats, reference_repeats)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(race["ours_out"], race["reference_out"]))
    tokens = sum(len(x) for x in model.encode(texts))
    return {"pairs": n_pairs, "model": "all-MiniLM-L6-v2", "layer": LAYER, "idf": False, "tokens": tokens,
            "ours_s": race["ours_s"], "ours_times_s": race["ours_times_s"],
            "ours_compile_s": max(t_first - race["ours_s"], 0.0), "ours_pairs_per_s": n_pairs / race["ours_s"],
            "package_s": race["reference_s"], "package_times_s": race["reference_times_s"],
            "speedup": race["reference_s"] / race["ours_s"], "target_speedup": TARGETS["bertscore_speedup"],
            "max_abs_diff_vs_package": diff, "torch_threads": race["torch_threads"],
            "torch_thread_probe_s": probe, "load_average": {"start": load_start, "end": load_average()}}


def filter_inputs(n_questions: int, per_question: int = 10) -> list[tuple[str, str]]:
    """(question, generation) pairs: numbered lists mixing other questions, near-copies (a word
    dropped), an exact copy and a repeat, so that every rule of the filter is exercised."""
    pool = sentences(n_questions * per_question + n_questions)
    questions, others = pool[:n_questions], pool[n_questions:]
    out = []
    for q, question in enumerate(questions):
        words = question.split()
        items = [" ".join(words[:k] + words[k + 1:]) for k in range(min(3, len(words)))]
        items += [question, others[q * per_question]]  # a copy of the question, then a repeat below
        items += others[q * per_question:q * per_question + per_question - len(items)]
        out.append((question, "\n".join(f"{i}. {t}" for i, t in enumerate(items[:per_question], 1))))
    return out


def reference_filter(inputs, scorer, threshold: float) -> list[list[str]]:
    """The reference's loop: per candidate, ParaScorer.base_score([question], [para], [para]) =
    max(F(q, p), F(q, p)) + 0.05 * DS(q, p), two bert-score calls and nltk's edit distance."""
    import re

    from nltk import edit_distance

    kept_all = []
    for question, generation in inputs:
        kept = []
        for para in re.findall(r"\d+\.\s(.+)", generation):
            f1 = float(scorer.score([question], [para])[2][0])
            f2 = float(scorer.score([question], [para])[2][0])
            ned = edit_distance(question, para) / max(len(question), len(para))
            ds = 0.35 if ned >= 0.35 else -1 + (1.35 / 0.35) * ned
            if max(f1, f2) + 0.05 * ds >= threshold and para not in kept:
                kept.append(para)
        kept_all.append(kept)
    return kept_all


def bench_filter(n_candidates: int, repeats: int, reference_repeats: int, threshold: float = 0.6) -> dict:
    from clarifyjax.bertscore import load_model
    from sage_jax.embed import default_embedder_path
    from sage_jax.parascore import filter_paraphrases

    load_start = load_average()
    inputs = filter_inputs(max(1, n_candidates // 10))
    folder = default_embedder_path()
    model = load_model(folder)

    def ours():
        return [filter_paraphrases(q, g, model=model, layer=LAYER, threshold=threshold) for q, g in inputs]

    t_first, _, screened = best_of(ours, 1)
    scorer = _package_scorer(folder, LAYER)
    subset = inputs[:max(1, len(inputs) // 10)]  # the reference is timed on a tenth and scaled
    threads, probe = torch_thread_settings(lambda: reference_filter(subset[:1], scorer, threshold),
                                           (os.cpu_count() or 1, 1))
    race = interleaved(ours, lambda: reference_filter(subset, scorer, threshold), threads, repeats,
                       reference_repeats)
    t_ref = race["reference_s"] * len(inputs) / len(subset)
    # The kept sets differ by design: the reference also keeps copies of the question and repeats.
    ours_kept = sum(len(s.kept) for s in race["ours_out"])
    reasons: dict[str, int] = {}
    for s in race["ours_out"]:
        for _, why in s.rejected:
            reasons[why] = reasons.get(why, 0) + 1
    return {"questions": len(inputs), "candidates": 10 * len(inputs), "threshold": threshold,
            "model": "all-MiniLM-L6-v2", "layer": LAYER,
            "ours_s": race["ours_s"], "ours_times_s": race["ours_times_s"],
            "ours_compile_s": max(t_first - race["ours_s"], 0.0),
            "ours_candidates_per_s": 10 * len(inputs) / race["ours_s"], "ours_kept": ours_kept,
            "ours_rejected": reasons, "reference_questions_timed": len(subset),
            "reference_times_s": race["reference_times_s"], "reference_s_scaled": t_ref,
            "reference_kept_in_subset": sum(len(k) for k in race["reference_out"]),
            "speedup": t_ref / race["ours_s"], "torch_threads": race["torch_threads"],
            "torch_thread_probe_s": probe, "load_average": {"start": load_start, "end": load_average()}}


def bench_metric(n_questions: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp

    from sage_jax import metric

    load_start = load_average()
    n, d = 5, 384
    emb = jax.random.normal(jax.random.PRNGKey(0), (n_questions, n, d), jnp.float32)
    emb = jax.block_until_ready(emb + jax.random.normal(jax.random.PRNGKey(1), (n_questions, 1, d)))
    mask = jnp.ones((n_questions, n), bool)
    total = jax.jit(jnp.sum)
    ours = lambda: jax.block_until_ready(metric.sage(emb, mask))  # noqa: E731
    read = lambda: jax.block_until_ready(total(emb))  # noqa: E731
    t_first, _, _ = best_of(ours, 1)
    read()
    ours_times, read_times = [], []
    for _ in range(repeats):  # interleaved: the same load for both
        ours_times.append(best_of(ours, 1)[0])
        read_times.append(best_of(read, 1)[0])
    nbytes = emb.size * emb.dtype.itemsize
    t_ours, t_read = min(ours_times), min(read_times)
    return {"questions": n_questions, "texts_per_question": n, "dim": d, "embeddings_bytes": nbytes,
            "ours_s": t_ours, "ours_times_s": ours_times, "ours_compile_s": max(t_first - t_ours, 0.0),
            "sum_s": t_read, "sum_times_s": read_times, "sum_read_gb_per_s": nbytes / t_read / 1e9,
            "ours_read_gb_per_s": nbytes / t_ours / 1e9, "fraction_of_read": t_read / t_ours,
            "target_fraction_of_read": TARGETS["metric_read_fraction"],
            "load_average": {"start": load_start, "end": load_average()}}


def _answer_prompts(count: int) -> list[str]:
    import csv

    from clarifyjax.tables import resolve_data_path
    from sage_jax import prompts as P

    path = resolve_data_path("../shared/data/sage-mcc/q100_gpt-3.5-turbo_rot.csv")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [P.answer_prompt(r["paraphrased"].strip(), False) for r in rows[:count]]


def llama_30m(root: Path) -> Path:
    """A random Llama folder of about 30M parameters (hidden 512, 9 layers, MLP 1376, 8 heads)."""
    from clarifyjax.models.tiny import tiny_llama_folder

    return tiny_llama_folder(root, seed=0, hidden_size=512, intermediate_size=1376, num_hidden_layers=9,
                             num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024,
                             generation={"do_sample": True, "temperature": 1.0, "top_k": 10})


def bench_answer_stage(args) -> dict:
    """(a): our answer stage against transformers' pipeline, one prompt per call."""
    import jax
    import torch
    import transformers
    from flax import nnx

    from clarifyjax.llm import LocalLM
    from clarifyjax.textgen import Sampling
    from sage_jax import prompts as P
    from sage_jax.stages import Stage, Task

    threads = os.cpu_count()
    torch.set_num_threads(threads)
    root = Path(tempfile.mkdtemp(prefix="sage_pipeline_bench_"))
    folder = llama_30m(root)
    prompts = _answer_prompts(args.prompts)
    sampling = Sampling(max_new_tokens=args.new_tokens, top_k=10)
    lm = LocalLM(folder, batch_size=args.batch_size).load()
    n_params = sum(int(x.size) for x in jax.tree.leaves(nnx.state(lm.model)))

    def judge(tasks, texts, previous):
        return [{"ok": r is None, "reason": r, "answer": a} for a, r in map(P.parse_answer, texts)]

    def stage(name: str, rows: list[str], max_attempts: int) -> tuple[float, list[dict]]:
        tasks = [Task((str(i), 0, "bench", 0), p, {}) for i, p in enumerate(rows)]
        s = Stage("answer", root / name, tasks, fingerprint={"name": name}, max_attempts=max_attempts,
                  batch_size=args.batch_size, seed=0)
        started = time.perf_counter()
        out = s.run(lambda: lm, judge, sampling=sampling, quiet=True)
        return time.perf_counter() - started, out

    stage("warmup", [p.replace("Question", "Query") for p in prompts], 1)  # compile on other prompts
    ours_s, rows = stage("timed", prompts, 1)
    ours_capped_s, capped = stage("timed_requeue", prompts, 3)

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    ref_prompts = prompts[:args.reference_prompts]
    pipe(ref_prompts[0], do_sample=True, top_k=10, max_new_tokens=args.new_tokens,
         pad_token_id=tokenizer.eos_token_id)  # warm-up
    started = time.perf_counter()
    ref_tokens = 0
    for p in ref_prompts:  # the reference's one call per prompt
        out = pipe(p, do_sample=True, top_k=10, num_return_sequences=1, max_new_tokens=args.new_tokens,
                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        ref_tokens += len(tokenizer(out[0]["generated_text"].replace(p, "", 1))["input_ids"])
    ref_s = time.perf_counter() - started
    ref_all_s = ref_s * len(prompts) / len(ref_prompts)
    return {
        "part": "a", "prompts": len(prompts), "new_tokens": args.new_tokens, "threads": threads,
        "model": {"family": "llama", "parameters": n_params, "hidden": 512, "layers": 9, "mlp": 1376,
                  "heads": 8, "vocab": int(lm.config.vocab_size) if hasattr(lm.config, "vocab_size") else None},
        "ours_answer_stage_s": ours_s, "ours_rows_ok": sum(r["status"] == "ok" for r in rows),
        "ours_with_requeue_s": ours_capped_s,
        "ours_with_requeue_rows_ok": sum(r["status"] == "ok" for r in capped),
        "reference_prompts_timed": len(ref_prompts), "reference_s": ref_s,
        "reference_s_for_all_prompts": ref_all_s,
        "reference_scaled": len(ref_prompts) != len(prompts),
        "speedup": ref_all_s / ours_s, "target_speedup": TARGETS["answer_stage_speedup"],
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a shared CPU")
    parser.add_argument("--pairs", type=int, default=None, help="(b) text pairs (default 5000)")
    parser.add_argument("--candidates", type=int, default=None, help="(c) candidates (default 1000)")
    parser.add_argument("--questions", type=int, default=None, help="(e) questions (default 100000)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--reference-repeats", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=None, help="(a) prompts (default 250)")
    parser.add_argument("--reference-prompts", type=int, default=None,
                        help="(a) prompts the reference is timed on (default all)")
    parser.add_argument("--new-tokens", type=int, default=32, help="(a) new tokens per prompt")
    parser.add_argument("--batch-size", type=int, default=128, help="(a) rows per LocalLM batch")
    parser.add_argument("--skip-answer-stage", action="store_true")
    parser.add_argument("--skip-bertscore", action="store_true")
    parser.add_argument("--skip-filter", action="store_true")
    parser.add_argument("--skip-metric", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quick = args.quick
    pick = lambda value, full, small: value if value is not None else (small if quick else full)  # noqa: E731
    repeats, reference_repeats = pick(args.repeats, 3, 1), pick(args.reference_repeats, 2, 1)
    results = {"mode": "quick" if quick else "full", "targets": TARGETS, "load_average_start": load_average(),
               "embedder_matmul_fraction": "not done: left for later (part d)"}
    if not args.skip_answer_stage:
        args.prompts = pick(args.prompts, 250, 50)
        args.reference_prompts = min(args.reference_prompts or args.prompts, args.prompts)
        results["answer_stage"] = bench_answer_stage(args)
    if not args.skip_bertscore:
        results["bertscore"] = bench_bertscore(pick(args.pairs, 5000, 300), repeats, reference_repeats)
    if not args.skip_filter:
        results["parascore_filter"] = bench_filter(pick(args.candidates, 1000, 100), repeats, reference_repeats)
    if not args.skip_metric:
        results["metric"] = bench_metric(pick(args.questions, 100_000, 20_000), max(repeats, 5))
    results["load_average"] = load_average()
    if args.out is None:
        write_results("sage_pipeline", results)
    else:
        from clarifyjax.textfiles import atomic_write_bytes

        results = {"benchmark": "sage_pipeline", "machine": machine_info(), **results}
        atomic_write_bytes(args.out, (json.dumps(results, indent=2) + "\n").encode())
        print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
