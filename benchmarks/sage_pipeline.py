"""SaGE pipeline benchmarks (issue 13), each against its reference method in the same run.

(a) the answer stage of `sage-jax run` for 250 prompts (the reference's answer prompt over the
    q100 file's paraphrases), 32 new tokens, top-k 10 sampling, on a random Llama-shaped model of
    about 30M parameters (hidden 512, 7 layers, an 8192-token BPE: `llama_30m`): the whole stage
    (`sage_jax.stages.Stage` over `clarifyjax.llm.LocalLM`, parsing and batch files included;
    compiled by a first run on the same prompts) against the reference method, `transformers`
    `pipeline("text-generation")` called once per prompt (vnnm404/SaGE scripts/model_output.py),
    same weights, same threads. `--reference-prompts N` times the reference on the first N
    prompts and scales its time to all of them (the JSON says so). The bound: the FLOPs of every
    prompt and new token at the jitted matmul rate measured at the model's shapes.
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


TOKENIZER_TEXTS = "../shared/data/sage-mcc/moral100-high-ambiguity_gpt-3.5-turbo_rot.csv"


def english_bpe(folder: Path, vocab_size: int = 8192):
    """A byte-level BPE (Llama's specials, BOS added) trained on δ-CLARIFY and the moral100 file's
    questions, paraphrases, answers and RoTs -- not on q100, whose paraphrases are the prompts --
    so that a prompt takes about as many tokens as under a real model's vocabulary (the tests'
    300-token BPE needs ~1.3 characters a token, which would make prefill, not decoding, the
    stage's cost)."""
    import csv

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from clarifyjax.models.tiny import corpus
    from clarifyjax.tables import resolve_data_path

    with open(resolve_data_path(TOKENIZER_TEXTS), newline="", encoding="utf-8") as f:
        extra = [r[k] for r in csv.DictReader(f) for k in ("question", "paraphrased", "model_output", "rot")]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus(None) + [t for t in extra if t], trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(folder))
    return fast


LLAMA_30M = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 7, "num_attention_heads": 8,
             "num_key_value_heads": 8}


def llama_30m(root: Path) -> Path:
    """A random Llama folder of about 30M parameters (hidden 512, 7 layers, MLP 1376, 8 heads, the
    vocabulary of `english_bpe`), weights redrawn with std 0.2 as the tests' tiny models are."""
    import torch
    import transformers

    folder = root / "llama_30m"
    folder.mkdir(parents=True, exist_ok=True)
    tok = english_bpe(folder)
    config = transformers.LlamaConfig(vocab_size=len(tok), max_position_embeddings=1024, bos_token_id=1,
                                      eos_token_id=2, tie_word_embeddings=False, **LLAMA_30M)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape) * 0.2)
    model.generation_config = transformers.GenerationConfig(bos_token_id=1, eos_token_id=2, do_sample=True,
                                                            temperature=1.0, top_k=10)
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def llama_flops(cfg: dict, vocab: int, prompt_tokens: list[int], new_tokens: int) -> float:
    """Forward FLOPs (2 per multiply-add) of each prompt's tokens and `new_tokens` generated
    ones, every token computed (no shared prefix, no padding): the projections and MLP of every
    layer, attention over the tokens before it, and the vocabulary head for the last prompt
    token and each new one."""
    H, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    n, k = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = H // n
    per_token = 2 * L * (H * (n + 2 * k) * d + n * d * H + 3 * H * F)
    total = 0.0
    for p in prompt_tokens:
        length = p + new_tokens
        total += length * per_token
        total += 2 * L * 2 * n * d * length * (length + 1) / 2  # scores and context, causal
        total += (1 + new_tokens) * 2 * H * vocab
    return total


def bench_answer_stage(args) -> dict:
    """(a): our answer stage against transformers' pipeline, one prompt per call, and the bound
    that the jitted matmul rate puts on any method that computes every token."""
    import jax
    import torch
    import transformers
    from flax import nnx

    from clarifyjax.llm import LocalLM
    from clarifyjax.textgen import Sampling
    from reward import matmul_flops_per_s
    from sage_jax import prompts as P
    from sage_jax.stages import Stage, Task

    load_start = load_average()
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    root = Path(tempfile.mkdtemp(prefix="sage_pipeline_bench_"))
    folder = llama_30m(root)
    prompts = _answer_prompts(args.prompts)
    sampling = Sampling(max_new_tokens=args.new_tokens, top_k=10)
    lm = LocalLM(folder, batch_size=args.batch_size).load()
    n_params = sum(int(x.size) for x in jax.tree.leaves(nnx.state(lm.model)))
    prompt_tokens = [len(lm.encode(p)) for p in prompts]

    def judge(tasks, texts, previous):
        return [{"ok": r is None, "reason": r, "answer": a} for a, r in map(P.parse_answer, texts)]

    def stage(name: str, rows: list[str], max_attempts: int, seed: int = 0) -> tuple[float, list[dict]]:
        tasks = [Task((str(i), 0, "bench", 0), p, {}) for i, p in enumerate(rows)]
        s = Stage("answer", root / name, tasks, fingerprint={"name": name}, max_attempts=max_attempts,
                  batch_size=args.batch_size, seed=seed)
        started = time.perf_counter()
        out = s.run(lambda: lm, judge, sampling=sampling, quiet=True)
        return time.perf_counter() - started, out

    warm_s, _ = stage("warmup", prompts, 1, seed=1)  # the same shapes, another seed: compiles
    times = [stage(f"timed{r}", prompts, 1)[0] for r in range(args.answer_repeats)]
    ours_s = min(times)
    _, rows = stage("timed_rows", prompts, 1)
    ours_capped_s, capped = stage("timed_requeue", prompts, 3)

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    ref_prompts = prompts[:args.reference_prompts]
    pipe(ref_prompts[0], do_sample=True, top_k=10, max_new_tokens=args.new_tokens,
         pad_token_id=tokenizer.eos_token_id)  # warm-up
    started = time.perf_counter()
    for p in ref_prompts:  # the reference's one call per prompt
        pipe(p, do_sample=True, top_k=10, num_return_sequences=1, max_new_tokens=args.new_tokens,
             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    ref_s = time.perf_counter() - started
    ref_all_s = ref_s * len(prompts) / len(ref_prompts)

    vocab = int(lm.model.config.vocab_size)
    flops = llama_flops(LLAMA_30M, vocab, prompt_tokens, args.new_tokens)
    mean_prompt = sum(prompt_tokens) / len(prompt_tokens)
    rate = matmul_flops_per_s((args.batch_size * int(mean_prompt), LLAMA_30M["hidden_size"],
                               LLAMA_30M["intermediate_size"]))
    at_rate_s = flops / rate
    return {
        "part": "a", "prompts": len(prompts), "new_tokens": args.new_tokens, "threads": threads,
        "batch_size": args.batch_size,
        "model": {"family": "llama", "parameters": n_params, "vocab": vocab,
                  **{k: v for k, v in LLAMA_30M.items()}},
        "prompt_tokens": {"mean": mean_prompt, "min": min(prompt_tokens), "max": max(prompt_tokens),
                          "characters_per_token": sum(map(len, prompts)) / sum(prompt_tokens)},
        "ours_answer_stage_s": ours_s, "ours_times_s": times, "ours_first_run_with_compile_s": warm_s,
        "ours_rows_ok": sum(r["status"] == "ok" for r in rows),
        "ours_with_requeue_s": ours_capped_s,
        "ours_with_requeue_rows_ok": sum(r["status"] == "ok" for r in capped),
        "reference_prompts_timed": len(ref_prompts), "reference_s": ref_s,
        "reference_s_for_all_prompts": ref_all_s,
        "reference_scaled": len(ref_prompts) != len(prompts),
        "speedup": ref_all_s / ours_s, "target_speedup": TARGETS["answer_stage_speedup"],
        "bound": {
            "flops_every_token": flops,
            "how": "llama_flops: projections, MLP and causal attention of every prompt and new token, the "
                   "vocabulary head for the last prompt token and each new one; no padding, no shared prefix",
            "matmul_rate_flops_per_s": rate,
            "matmul_shape": [args.batch_size * int(mean_prompt), LLAMA_30M["hidden_size"],
                             LLAMA_30M["intermediate_size"]],
            "seconds_at_matmul_rate": at_rate_s,
            "speedup_bound": ref_all_s / at_rate_s,
            "ours_fraction": at_rate_s / ours_s,
            "note": "ours_fraction can pass 1: the stage runs the prompts' shared template once per batch "
                    "(LocalLM shared_prefix), work that the every-token count includes",
        },
        "load_average": {"start": load_start, "end": load_average()},
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
    parser.add_argument("--answer-repeats", type=int, default=None, help="(a) timed runs of our stage")
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
        args.answer_repeats = pick(args.answer_repeats, 2, 1)
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
