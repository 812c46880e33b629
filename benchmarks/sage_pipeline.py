"""SaGE pipeline benchmarks (issue 13), each against its reference method in the same run.

(a) the answer stage of `sage-jax run` for 250 prompts (the reference's answer prompt over the
    q100 file's paraphrases), 32 new tokens, top-k 10 sampling, on a random Llama-shaped model of
    about 30M parameters (hidden 512, 7 layers, an 8192-token BPE: `llama_30m`): the whole stage
    (`sage_jax.run.stages.Stage` over `clarifyjax.decoding.local_lm.LocalLM`, parsing and batch files included;
    compiled by a first run on the same prompts) against the reference method, `transformers`
    `pipeline("text-generation")` called once per prompt (vnnm404/SaGE scripts/model_output.py),
    same weights, same threads. `--reference-prompts N` times the reference on the first N
    prompts and scales its time to all of them (the JSON says so). The bound: the FLOPs of every
    prompt and new token at the jitted matmul rate measured at the model's shapes.
(b) BERTScore of N text pairs (δ-CLARIFY sentences) on all-MiniLM-L6-v2: `clarifyjax.evaluation.bertscore`
    against the `bert-score` package's `BERTScorer` (the model loaded once on both sides, so that
    only scoring is timed), same layer, same pairs; equal output is checked (max |diff| of P, R, F).
(c) the ParaScore filter over N candidates: questions with 10 numbered candidates each (other
    questions of the corpus, copies, near-copies), `sage_jax.parascore.filter_paraphrases` per
    question against the reference's method: per candidate, the toolkit's `base_score([question],
    [para], [para])` (two `bert-score` calls and nltk's edit distance), on the same model.
(d) the sentence embedder (all-MiniLM-L6-v2) on the distinct answers and rules of thumb of the
    vicuna pairs file: its matmul FLOP rate (counted at each text's real length, and at the padded
    batch shapes) as a fraction of the jitted float32 matmul rate measured at the model's own shapes
    (one layer's products on the batch shape carrying the median FLOP) in the same run, the square
    1024^3 rate for comparison, the embed call split into its steps (tokenize, pad, dispatch,
    forward, copy back), and the same forward in plain `transformers` (AutoModel + mean pooling) on
    the same padded batches, same threads.
(e) the SaGE metric on 100,000 x 5 x 384 as a fraction of the read-once bound: a jitted sum over
    the same array, timed in the same run (fraction = t_sum / t_sage).

Timing follows benchmarks/sage.py: compile / warm-up apart, ours and the reference interleaved in
rounds, best of each, PyTorch probed at all cores and at 1 thread (the reference's best kept), and
the load average recorded. The machine is shared: read the figures with the load average.

Usage: python benchmarks/sage_pipeline.py [--quick] [--skip-answer-stage] [--skip-bertscore] [--skip-filter]
       [--skip-embedder] [--skip-metric] [--prompts 250] [--reference-prompts 250]
Updates benchmarks/results/sage_pipeline.json (or --out) atomically and prints it: the parts run
replace their entries (each with its own load average and UTC time), the others are kept.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from _common import RESULTS_DIR, machine_info
from sage import best_of, interleaved, load_average, sentences, torch_thread_settings

TARGETS = {"answer_stage_speedup": 20.0, "bertscore_speedup": 2.0, "metric_read_fraction": 0.5}
LAYER = 6  # all-MiniLM-L6-v2 is not in bert-score's table: its last layer, on both sides


def _package_scorer(folder: Path, layer: int):
    from bert_score import BERTScorer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BERTScorer(model_type=str(folder), num_layers=layer, device="cpu")


def bench_bertscore(n_pairs: int, repeats: int, reference_repeats: int) -> dict:
    from clarifyjax.evaluation.bertscore import bertscore, load_model
    from clarifyjax.models.embedder import default_embedder_path

    load_start = load_average()
    texts = sentences(2 * n_pairs)
    cands, refs = texts[:n_pairs], texts[n_pairs:2 * n_pairs]
    folder = default_embedder_path()
    model = load_model(folder)
    ours = lambda: bertscore(cands, refs, model=model, layer=LAYER)  # noqa: E731
    t_first, _, _ = best_of(ours, 1)  # compiles every bucket
    lengths = sorted(len(x) for x in model.encode(texts))
    # The matmul rate at a median batch's shapes (64 texts of the median length), measured before
    # PyTorch runs and again after (its OpenMP threads spin for a while after each call, which
    # slows what runs next): the best of the two.
    rate_args = (model.config, 64, lengths[len(lengths) // 2])
    rates_before = matmul_rates(*rate_args, repeats=10)
    scorer = _package_scorer(folder, LAYER)
    package = lambda: tuple(x.numpy() for x in scorer.score(cands, refs, batch_size=64))  # noqa: E731
    threads, probe = torch_thread_settings(
        lambda: scorer.score(cands[:256], refs[:256], batch_size=64), (os.cpu_count() or 1, 1))
    race = interleaved(ours, package, threads, repeats, reference_repeats)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(race["ours_out"], race["reference_out"]))
    tokens = sum(lengths)
    # The bound: every text's encoder FLOPs (at its own length, no padding) at that rate.
    flops = sum(encoder_flops(model.config, 1, n) for n in lengths)
    time.sleep(2)
    rates = max(rates_before, matmul_rates(*rate_args, repeats=10), key=lambda r: r["model_shapes_flop_per_s"])
    at_rate_s = flops / rates["model_shapes_flop_per_s"]
    at_square_s = flops / rates["square_1024_flop_per_s"]
    bound = {"flops_real_tokens": flops, "how": "encoder_flops at each text's own length (matmuls only)",
             "matmul": rates, "seconds_at_model_shape_rate": at_rate_s, "seconds_at_square_rate": at_square_s,
             "speedup_bound_at_model_shape_rate": race["reference_s"] / at_rate_s,
             "speedup_bound_at_square_rate": race["reference_s"] / at_square_s,
             "ours_fraction_of_model_shape_rate": at_rate_s / race["ours_s"],
             "package_fraction_of_model_shape_rate": at_rate_s / race["reference_s"]}
    return {"pairs": n_pairs, "model": "all-MiniLM-L6-v2", "layer": LAYER, "idf": False, "tokens": tokens,
            "bound": bound,
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
    from clarifyjax.evaluation.bertscore import load_model
    from clarifyjax.models.embedder import default_embedder_path
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


# What the metric's profile showed (jax 0.10.2, XLA:CPU, 2 shared cores; 100,000 x 5 x 384; each
# variant timed against a jitted sum in the same process, load 2-4.5, so read them as ratios).
METRIC_FINDINGS = [
    "the cosines (Gram) are ~90% of sage's time; SaGE from the [b, 5, 5] similarities is ~0.02 s",
    "every Gram form is lowered to a YNNPACK fusion; the batched dot in blocks of 32 questions was the "
    "fastest (0.12 s Gram alone vs 0.16-0.19 s for the former lanes-split multiply-reduce in blocks of "
    "128-512; the sum was 0.03-0.04 s in the same runs)",
    "the batched dot over all 100,000 questions at once (no block loop) takes 0.88 s, the broadcast "
    "multiply-reduce 1.3 s: the block loop stays",
    "upper-triangle pairs only (gather, static slices, rolled copies) leave YNNPACK for XLA's own loop "
    "emitter and run 0.23-1.4 s; so does a variadic reduce that keeps the lanes split (0.19-0.46 s)",
    "splitting cosines (block loop) and SaGE (one pass over all questions) was no faster than one loop",
    "so the Gram runs at ~16 GFLOP/s (25 products of 384 per question) while the read runs at 20-40 GB/s: "
    "the target of 0.5 needs the Gram at >= 2x this rate, which no jnp formulation reached here",
]


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
    # Where the time goes: the cosines alone (Gram, norms, the rescaling check; one entry per
    # question kept so that all of it is computed) and SaGE from those similarities.
    cosines = jax.jit(lambda e, m: metric._in_blocks(  # noqa: E731
        lambda x, mm: metric.pairwise_cosine(x, mm)[0][:, 0, 1], (e, m)))
    t_cosines = best_of(lambda: jax.block_until_ready(cosines(emb, mask)), repeats + 1)[0]
    sim = jax.block_until_ready(metric.pairwise_cosine(emb[:metric.BLOCK * 8], mask[:metric.BLOCK * 8])[0])
    sim = jax.block_until_ready(jnp.tile(sim, (n_questions // sim.shape[0] + 1, 1, 1))[:n_questions])
    t_core = best_of(lambda: jax.block_until_ready(metric.sage_from_similarity(sim, mask)), repeats + 1)[0]
    profile = {"cosines_s": t_cosines, "sage_from_similarity_s": t_core, "block": metric.BLOCK,
               "gram_flops_per_question": 2 * n * n * d, "findings": METRIC_FINDINGS}
    return {"questions": n_questions, "texts_per_question": n, "dim": d, "embeddings_bytes": nbytes,
            "ours_s": t_ours, "ours_times_s": ours_times, "ours_compile_s": max(t_first - t_ours, 0.0),
            "sum_s": t_read, "sum_times_s": read_times, "sum_read_gb_per_s": nbytes / t_read / 1e9,
            "ours_read_gb_per_s": nbytes / t_ours / 1e9, "fraction_of_read": t_read / t_ours,
            "target_fraction_of_read": TARGETS["metric_read_fraction"], "profile": profile,
            "load_average": {"start": load_start, "end": load_average()}}


PAIRS_FILE = "../shared/data/sage-mcc/vicuna-7b-v1.5_pairs_0.csv"


def pairs_file_texts(n_questions: int | None) -> list[str]:
    """The distinct answers and rules of thumb of the vicuna pairs file (what SaGE embeds)."""
    from clarifyjax.files.tables import resolve_data_path
    from sage_jax import data

    questions = data.read_questions(resolve_data_path(PAIRS_FILE), need=("answer", "rot"))[:n_questions]
    return data.shared_texts(data.text_batch(questions, "answer"), data.text_batch(questions, "rot"))[0]


def encoder_flops(config, rows: int, length: int) -> int:
    """Matmul FLOPs (2 per multiply-add) of the encoder's forward on `rows` sequences of `length`
    tokens: per layer and token, the Q, K, V and output projections (4 x 2 d^2) and the MLP
    (2 x 2 d f); per layer and sequence, the attention scores and the context (2 x 2 s^2 d).
    Embedding lookups, LayerNorm, softmax, GELU and pooling are not counted (no matmul)."""
    d, f, s = config.hidden_size, config.intermediate_size, length
    per_layer = 8 * s * d * d + 4 * s * d * f + 4 * s * s * d
    return rows * config.num_layers * per_layer


def matmul_rates(config, rows: int, length: int, repeats: int) -> dict:
    """FLOP/s of jitted float32 matmuls: at the shapes of one encoder layer on a [rows, length]
    batch (each product timed alone, best of `repeats`; the rate is the layer's FLOPs over the sum
    of the times, i.e. weighted as the model weights them), and a square 1024^3 product."""
    import jax
    import jax.numpy as jnp

    d, f, h = config.hidden_size, config.intermediate_size, config.num_heads
    m = rows * length
    key = iter(jax.random.split(jax.random.PRNGKey(0), 16))
    arr = lambda *shape: jax.random.normal(next(key), shape, jnp.float32)  # noqa: E731
    dot = jax.jit(jnp.dot)
    scores = jax.jit(lambda q, k: jnp.einsum("bqhk,bshk->bhqs", q, k))
    context = jax.jit(lambda p, v: jnp.einsum("bhqs,bshk->bqhk", p, v))
    qkv = arr(rows, length, h, d // h)
    cases = {  # name: (function, arguments, FLOPs, times per layer)
        "projection [m, d] x [d, d]": (dot, (arr(m, d), arr(d, d)), 2 * m * d * d, 4),
        "mlp in [m, d] x [d, f]": (dot, (arr(m, d), arr(d, f)), 2 * m * d * f, 1),
        "mlp out [m, f] x [f, d]": (dot, (arr(m, f), arr(f, d)), 2 * m * f * d, 1),
        "attention scores": (scores, (qkv, qkv), 2 * rows * length * length * d, 1),
        "attention context": (context, (arr(rows, h, length, length), qkv), 2 * rows * length * length * d, 1),
    }
    out, total_flops, total_s = {}, 0, 0.0
    for name, (fn, args, flops, count) in cases.items():
        t, _, _ = best_of(lambda: jax.block_until_ready(fn(*args)), repeats + 1)
        out[name] = {"flops": flops, "best_s": t, "gflop_per_s": flops / t / 1e9, "per_layer": count}
        total_flops += count * flops
        total_s += count * t
    a, b = arr(1024, 1024), arr(1024, 1024)
    t_square, _, _ = best_of(lambda: jax.block_until_ready(dot(a, b)), repeats + 1)
    return {"batch_shape": [rows, length], "products": out, "model_shapes_flop_per_s": total_flops / total_s,
            "square_1024_flop_per_s": 2 * 1024 ** 3 / t_square}


def torch_peer(folder, batches, normalize: bool):
    """The sentence-transformers-style forward in plain `transformers`: AutoModel on the same
    padded batches, mean pooling over the mask, L2 normalization."""
    import torch
    import transformers

    model = transformers.AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    batches = [(index, torch.from_numpy(np.asarray(ids)), torch.from_numpy(np.asarray(mask)))
               for index, ids, mask in batches]

    def run():
        out = []
        with torch.inference_mode():
            for index, ids, mask in batches:
                hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
                m = mask[..., None].float()
                vectors = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                if normalize:
                    vectors = torch.nn.functional.normalize(vectors, dim=-1)
                out.append((index, vectors[:len(index)].numpy()))
        return out
    return run


def bench_embedder(n_questions: int | None, repeats: int, reference_repeats: int, batch_size: int = 64) -> dict:
    """(d): our sentence embedder on the pairs file's own texts, its FLOP rate against the jitted
    matmul rate at the model's shapes, and the same forward in `transformers` on the same batches."""
    import jax
    import torch

    from clarifyjax.models.embedder import SentenceEmbedder, default_embedder_path, read_sentence_transformers_folder

    load_start = load_average()
    texts = pairs_file_texts(n_questions)
    embedder = SentenceEmbedder.from_pretrained()
    config = embedder.config
    t_first, _, _ = best_of(lambda: embedder.embed(texts, batch_size=batch_size), 1)  # compiles every bucket

    # The embed call in its steps (the same work as embed(), timed apart).
    def steps():
        t0 = time.perf_counter()
        encodings = embedder._encode(texts)
        t1 = time.perf_counter()
        batches = list(embedder._batches(encodings, batch_size))
        t2 = time.perf_counter()
        outs = [embedder._pooled(embedder._state, ids, mask) for _, ids, mask in batches]
        t3 = time.perf_counter()
        jax.block_until_ready(outs)
        t4 = time.perf_counter()
        vectors = [np.asarray(v) for v in outs]
        t5 = time.perf_counter()
        return {"tokenize_s": t1 - t0, "pad_batches_s": t2 - t1, "dispatch_s": t3 - t2,
                "forward_wait_s": t4 - t3, "copy_to_host_s": t5 - t4}, batches, vectors

    split, batches, _ = steps()
    lengths = [len(e.ids) for e in embedder._encode(texts)]
    padded = sum(encoder_flops(config, *ids.shape) for _, ids, _ in batches)
    real = sum(encoder_flops(config, 1, n) for n in lengths)
    folder, _, normalize = read_sentence_transformers_folder(default_embedder_path())
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    peer = torch_peer(folder, batches, normalize)
    forward = lambda: jax.block_until_ready(  # noqa: E731
        [embedder._pooled(embedder._state, ids, mask) for _, ids, mask in batches])
    # The batch shape that carries the median FLOP: the matmul rate is measured at it.
    by_flops = sorted((encoder_flops(config, *ids.shape), ids.shape) for _, ids, _ in batches)
    cumulative, median_shape = 0, by_flops[-1][1]
    for flops, shape in by_flops:
        cumulative += flops
        if cumulative >= padded / 2:
            median_shape = shape
            break
    ours_times, forward_times, peer_times, round_rates = [], [], [], []
    for r in range(max(repeats, reference_repeats)):  # interleaved: the same load for each, the rate too
        ours_times.append(best_of(lambda: embedder.embed(texts, batch_size=batch_size), 1)[0])
        forward_times.append(best_of(forward, 1)[0])
        round_rates.append(matmul_rates(config, *median_shape, repeats=2))
        if r < reference_repeats:
            peer_times.append(best_of(peer, 1)[0])
    rates = max(round_rates, key=lambda x: x["model_shapes_flop_per_s"])
    rates["model_shapes_flop_per_s_by_round"] = [x["model_shapes_flop_per_s"] for x in round_rates]
    t_ours, t_forward, t_peer = min(ours_times), min(forward_times), min(peer_times)
    rate = rates["model_shapes_flop_per_s"]
    return {
        "part": "d", "texts": len(texts), "questions": n_questions or "all", "file": PAIRS_FILE,
        "model": "all-MiniLM-L6-v2", "batch_size": batch_size, "batches": len(batches),
        "tokens": sum(lengths), "padded_tokens": int(sum(ids.size for _, ids, _ in batches)),
        "flops_counted": "matmuls only, 2 per multiply-add: per layer 8 s d^2 (Q, K, V, output) + "
                         "4 s d f (MLP) + 4 s^2 d (scores, context) per sequence of s tokens; "
                         "padded = at the batches' padded shapes, real = at each text's own length",
        "flops_padded": padded, "flops_real": real,
        "ours_embed_s": t_ours, "ours_embed_times_s": ours_times, "ours_compile_s": max(t_first - t_ours, 0.0),
        "ours_forward_s": t_forward, "ours_forward_times_s": forward_times, "ours_split_s": split,
        "matmul": rates,
        "fraction_of_matmul_rate": real / t_ours / rate,
        "fraction_padded_forward": padded / t_forward / rate,
        "fraction_of_square_matmul_rate": real / t_ours / rates["square_1024_flop_per_s"],
        "peer": "transformers AutoModel forward + mean pooling + normalize, same padded batches, "
                f"torch threads {threads}",
        "peer_forward_s": t_peer, "peer_forward_times_s": peer_times,
        "speedup_forward_vs_peer": t_peer / t_forward,
        "load_average": {"start": load_start, "end": load_average()},
    }


def _answer_prompts(count: int) -> list[str]:
    import csv

    from clarifyjax.files.tables import resolve_data_path
    from sage_jax.run import prompts as P

    path = resolve_data_path("../shared/data/sage-mcc/q100_gpt-3.5-turbo_rot.csv")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [P.answer_prompt(r["paraphrased"].strip(), False) for r in rows[:count]]


TOKENIZER_TEXTS = "../shared/data/sage-mcc/moral100-high-ambiguity_gpt-3.5-turbo_rot.csv"


def english_texts() -> list[str]:
    """δ-CLARIFY and the moral100 file's questions, paraphrases, answers and RoTs -- not q100,
    whose paraphrases are the prompts: what the benchmark's BPE learns from, so that a prompt
    takes about as many tokens as under a real model's vocabulary (the tests' 300-token BPE needs
    ~1.3 characters a token, which would make prefill, not decoding, the stage's cost)."""
    import csv

    from clarifyjax.models.tiny import corpus
    from clarifyjax.files.tables import resolve_data_path

    with open(resolve_data_path(TOKENIZER_TEXTS), newline="", encoding="utf-8") as f:
        extra = [r[k] for r in csv.DictReader(f) for k in ("question", "paraphrased", "model_output", "rot")]
    return corpus(None) + [t for t in extra if t]


LLAMA_30M = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 7, "num_attention_heads": 8,
             "num_key_value_heads": 8}


def llama_30m(root: Path) -> Path:
    """A random Llama folder of about 30M parameters (hidden 512, 7 layers, MLP 1376, 8 heads, an
    8192-token BPE trained on `english_texts`), weights redrawn with std 0.2 as the tests' tiny
    models are (`clarifyjax.models.tiny.tiny_llama_folder`)."""
    from clarifyjax.models.tiny import tiny_llama_folder

    return tiny_llama_folder(root, tokenizer={"vocab_size": 8192, "texts": english_texts()},
                             max_position_embeddings=1024,
                             generation={"do_sample": True, "temperature": 1.0, "top_k": 10}, **LLAMA_30M)


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

    from clarifyjax.decoding.local_lm import LocalLM
    from clarifyjax.text.generator import Sampling
    from reward import matmul_flops_per_s
    from sage_jax.run import prompts as P
    from sage_jax.run.stages import Stage, Task

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
    parser.add_argument("--skip-embedder", action="store_true")
    parser.add_argument("--skip-metric", action="store_true")
    parser.add_argument("--embedder-questions", type=int, default=None,
                        help="(d) questions of the pairs file whose texts are embedded (default all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quick = args.quick
    pick = lambda value, full, small: value if value is not None else (small if quick else full)  # noqa: E731
    repeats, reference_repeats = pick(args.repeats, 3, 1), pick(args.reference_repeats, 2, 1)
    parts = {}
    if not args.skip_answer_stage:
        args.prompts = pick(args.prompts, 250, 50)
        args.reference_prompts = min(args.reference_prompts or args.prompts, args.prompts)
        args.answer_repeats = pick(args.answer_repeats, 2, 1)
        parts["answer_stage"] = lambda: bench_answer_stage(args)
    if not args.skip_bertscore:
        parts["bertscore"] = lambda: bench_bertscore(pick(args.pairs, 5000, 300), repeats, reference_repeats)
    if not args.skip_filter:
        parts["parascore_filter"] = lambda: bench_filter(pick(args.candidates, 1000, 100), repeats,
                                                         reference_repeats)
    if not args.skip_embedder:
        parts["embedder"] = lambda: bench_embedder(pick(args.embedder_questions, None, 3), repeats,
                                                   reference_repeats)
    if not args.skip_metric:
        parts["metric"] = lambda: bench_metric(pick(args.questions, 100_000, 20_000), max(repeats, 5))
    results = {}
    for name, run in parts.items():
        results[name] = {"mode": "quick" if quick else "full", **run(), "measured_utc": utc_now()}
    return merge_results(args.out or RESULTS_DIR / "sage_pipeline.json", results)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# Top-level keys of the one-run layout, before each part carried its own load average and time.
_STALE_KEYS = ("mode", "load_average_start", "load_average", "embedder_matmul_fraction")


def merge_results(path: Path, parts: dict) -> dict:
    """Update `parts` in the JSON at `path`, keeping the other parts' entries as they were; the
    file is replaced atomically (a temporary file, then a rename) and printed."""
    from clarifyjax.files.textfiles import atomic_write_bytes

    old = json.loads(path.read_text()) if path.exists() else {}
    kept = {k: v for k, v in old.items() if k not in _STALE_KEYS}
    merged = {**kept, "benchmark": "sage_pipeline", "machine": machine_info(), "targets": TARGETS,
              "updated_utc": utc_now(), **parts}
    atomic_write_bytes(path, (json.dumps(merged, indent=2) + "\n").encode())
    print(json.dumps(merged, indent=2))
    print(f"wrote {path} (updated: {', '.join(parts) or 'nothing'})")
    return merged


if __name__ == "__main__":
    main()
