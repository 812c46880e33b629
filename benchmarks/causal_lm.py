"""Decoder-only LM throughput: ours (Flax NNX, jitted, KV cache in one while_loop) vs PyTorch
transformers on the same weights, with this machine's bounds measured in the same run.

A random ~125M Llama (`build_models`), float32, all cores on both sides: prefill, decode steps at
each batch against their streaming and matmul bounds (`decode_at`), the sampling filters at batch
128 (`bench_filters`). Writes benchmarks/results/causal_lm.json.

    python benchmarks/causal_lm.py [--batches 1 16 128] [--prompt-len 64] [--new-tokens 32]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from _common import RESULTS_DIR, timeit, write_results
from t5 import matmul_flops_per_s

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from transformers import LlamaConfig, LlamaForCausalLM

from clarifyjax.core import buckets
from clarifyjax.decoding import filter_logits, generate
from clarifyjax.decoding.api import _loop_settings
from clarifyjax.decoding.step import choose_token
from clarifyjax.models.hf import load_causal_lm


def read_bytes_per_s(n_bytes: int = 2 ** 30, repeats: int = 10) -> float:
    """The read bandwidth of a jitted reduction over a 1 GiB array: the streaming bound's rate."""
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    f = jax.jit(jnp.sum)
    f(x).block_until_ready()
    return n_bytes / timeit(lambda: f(x).block_until_ready(), repeats=repeats)["best_s"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 128])
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    # the machine is shared: each figure is the best of --repeats runs (compiles timed apart),
    # and the load average is recorded
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--filters-only", action="store_true",
                   help="rerun only the sampling filters at batch 128 and update their entry")
    return p.parse_args()


def build_models():
    """The random ~125M Llama in PyTorch, and ours loaded from its saved folder: (torch model,
    our config, our model, our parameter count)."""
    hf_config = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                            num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                            max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                            pad_token_id=0, tie_word_embeddings=False)
    torch_model = LlamaForCausalLM(hf_config).eval()
    with tempfile.TemporaryDirectory() as d:
        torch_model.save_pretrained(d, safe_serialization=True)
        config, model = load_causal_lm(d)
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model)))
    return torch_model, config, model, params


def bench_prefill(model, torch_model, ids, mask, cache_len: int, repeats: int) -> dict:
    """The jitted `CausalLM.prefill` (compile apart, XLA's FLOPs) against PyTorch's forward with
    the last position's logits, and the largest logit difference."""
    jids, jmask = jnp.asarray(ids), jnp.asarray(mask)
    graphdef, state = nnx.split(model)

    @jax.jit
    def prefill(state, ids, mask):
        m = nnx.merge(graphdef, state)
        return m.prefill(ids, mask, m.init_cache(ids.shape[0], cache_len))

    t0 = time.perf_counter()
    compiled = prefill.lower(state, jids, jmask).compile()
    compile_prefill_s = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    prefill_flops = float(cost.get("flops", 0.0))
    ours_prefill = timeit(lambda: jax.block_until_ready(compiled(state, jids, jmask)),
                          repeats=repeats)
    tids, tmask = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))

    def torch_prefill():
        with torch.inference_mode():
            return torch_model(input_ids=tids, attention_mask=tmask, logits_to_keep=1).logits

    torch_pre = timeit(torch_prefill, repeats=repeats)
    with torch.inference_mode():
        max_diff = float(np.max(np.abs(torch_prefill().numpy()[:, -1]
                                       - np.asarray(compiled(state, jids, jmask)[0]))))
    return {"ours": ours_prefill, "torch": torch_pre, "flops": prefill_flops,
            "compile_s": compile_prefill_s, "max_diff": max_diff}


def bench_decode(model, torch_model, ids, mask, n: int, repeats: int) -> dict:
    """Seconds per decode step, ours (top_k 0 sampling, greedy, top-k 10) and `transformers`
    `generate` (sampling, top_k 0): (generate n tokens - generate 1 token) / (n - 1)."""
    jids, jmask = jnp.asarray(ids), jnp.asarray(mask)
    tids, tmask = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))
    key = jax.random.key(0)

    def ours(new, **kw):
        return lambda: generate(model, jids, jmask, rng=key, max_new_tokens=new,
                                min_new_tokens=new, **kw).tokens.block_until_ready()

    t0 = time.perf_counter()
    ours(n)()
    compile_generate_s = time.perf_counter() - t0
    steps = {}
    for name, kw in (("sampling", {}), ("greedy", {"greedy": True}), ("top_k_10", {"top_k": 10})):
        ours(n, **kw)()
        ours(1, **kw)()
        ours_n = timeit(ours(n, **kw), repeats=repeats, warmup=0)
        ours_1 = timeit(ours(1, **kw), repeats=repeats, warmup=0)
        steps[name] = (ours_n["best_s"] - ours_1["best_s"]) / (n - 1)
        steps.setdefault("generate_s", ours_n["best_s"])

    def theirs(new):
        def run():
            with torch.inference_mode():
                return torch_model.generate(input_ids=tids, attention_mask=tmask, do_sample=True,
                                            top_k=0, max_new_tokens=new, min_new_tokens=new)
        return run

    torch_n = timeit(theirs(n), repeats=repeats)
    torch_1 = timeit(theirs(1), repeats=repeats)
    return {"ours_step": steps["sampling"], "greedy_step": steps["greedy"],
            "top_k_10_step": steps["top_k_10"],
            "torch_step": (torch_n["best_s"] - torch_1["best_s"]) / (n - 1),
            "ours_generate_s": steps["generate_s"], "torch_generate_s": torch_n["best_s"],
            "compile_s": compile_generate_s}


def profile_step(model, batch: int, cache_len: int, repeats: int) -> dict:
    """One step in pieces: the jitted `decode_step` alone (XLA's FLOP count too) and the
    sampling choice alone (`choose_token`, top_k 0), on a cache filled to its middle."""
    graphdef, state = nnx.split(model)
    cache = model.init_cache(batch, cache_len)
    cache = cache._replace(index=jnp.int32(cache_len // 2),
                           positions=jnp.full((batch,), cache_len // 2, jnp.int32))
    tokens = jnp.ones((batch,), jnp.int32)

    def step(state, tokens, cache):
        return nnx.merge(graphdef, state).decode_step(tokens, cache)

    # the cache donated, as the loop updates it in place; each call feeds the next its cache
    compiled = jax.jit(step, donate_argnums=2).lower(state, tokens, cache).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    carried = list(compiled(state, tokens, cache))

    def one_step():
        carried[:] = compiled(state, tokens, carried[1])
        jax.block_until_ready(carried[0])

    logits = carried[0]
    settings = _loop_settings(32, 0, False, 1.0, 0, 1.0)
    choose = jax.jit(lambda x, key: choose_token(x, jnp.int32(1), key, (2,), settings)[:2])
    key = jax.random.key(0)
    return {"decode_step_s": timeit(one_step, repeats=2 * repeats)["best_s"],
            "choose_token_s": timeit(lambda: jax.block_until_ready(choose(logits, key)),
                                     repeats=2 * repeats)["best_s"],
            "flops": float(cost.get("flops", 0.0)), "logits": logits}


FILTER_REPEATS = 20  # a filter takes milliseconds: many runs, so the best is not a noisy one


def bench_filters(logits, step_s: float, repeats: int, bandwidth: float) -> dict:
    """`filter_logits` at [b, V] two ways -- as it runs (`lax.top_k` candidates, then the
    bisection where they fall short) and by the bisections of the whole row -- on `logits` and
    on peaked ones (x 8), each as a fraction of the step `step_s` and of one read of the logits
    at the measured read bandwidth (every filter reads them at least once)."""
    out = {}
    read_s = logits.size * 4 / bandwidth
    ways = (("now", False), ("bisection", True))
    for spread, x in (("model_logits", logits), ("peaked_x8", logits * 8.0)):
        for name, kw in (("top_k_10", {"top_k": 10}), ("top_p_0.9", {"top_p": 0.9}),
                         ("top_k_10_top_p_0.9", {"top_k": 10, "top_p": 0.9})):
            for way, bisect in ways:
                f = jax.jit(lambda x, kw=kw, bisect=bisect: filter_logits(x, bisect=bisect, **kw))
                kept = f(x)
                t = timeit(lambda f=f, x=x: f(x).block_until_ready(),
                           repeats=max(FILTER_REPEATS, 2 * repeats))["best_s"]
                out[f"{spread}/{name}/{way}"] = {
                    "ms": 1e3 * t, "fraction_of_step": t / step_s,
                    "read_bound_ms": 1e3 * read_s, "fraction_of_read_bound": read_s / t,
                    "kept_per_row_mean": float(jnp.mean(jnp.sum(jnp.isfinite(kept), -1)))}
    return out


def decode_at(batch, model, torch_model, config, params, args, bandwidth, matmul) -> dict:
    """Decode at `batch` rows: our step and transformers', the profile and the bounds."""
    s, n, c = args.prompt_len, args.new_tokens, config
    ids = np.random.default_rng(batch).integers(3, 32000, size=(batch, s)).astype(np.int32)
    mask = np.ones((batch, s), np.int32)
    cache_len = buckets.bucket_length(buckets.bucket_length(s) + n)
    dec = bench_decode(model, torch_model, ids, mask, n, args.repeats)
    prof = profile_step(model, batch, cache_len, args.repeats)
    # a step reads every matrix, one row of the input embedding, and every layer's keys and
    # values over the whole (bucketed) cache
    weight_bytes = (params - (c.vocab_size - 1) * c.embed_size) * 4
    cache_bytes = 2 * c.num_layers * batch * cache_len * c.num_kv_heads * c.head_dim * 4
    streaming = (weight_bytes + cache_bytes) / bandwidth
    compute = prof["flops"] / matmul
    bound = max(streaming, compute)  # FLOPs at the matmul rate; the fraction: bound / our step
    row = {"batch": batch, "cache_len": cache_len,
           "ours_ms_per_step": 1e3 * dec["ours_step"],
           "ours_greedy_ms_per_step": 1e3 * dec["greedy_step"],
           "ours_top_k_10_ms_per_step": 1e3 * dec["top_k_10_step"],
           "torch_ms_per_step": 1e3 * dec["torch_step"],
           "speedup_vs_torch": dec["torch_step"] / dec["ours_step"],
           "streaming_bound_ms_per_step": 1e3 * streaming,
           "matmul_bound_ms_per_step": 1e3 * compute,
           "fraction_of_streaming_bound": streaming / dec["ours_step"],
           "fraction_of_bound": bound / dec["ours_step"],
           "weight_bytes_per_step": weight_bytes, "cache_bytes_per_step": cache_bytes,
           "step_flops": prof["flops"],
           "profile_ms": {"decode_step_alone": 1e3 * prof["decode_step_s"],
                          "choose_token_alone": 1e3 * prof["choose_token_s"],
                          "loop_rest": 1e3 * (dec["ours_step"] - prof["decode_step_s"]
                                              - prof["choose_token_s"])},
           "ours_generate_s": dec["ours_generate_s"], "torch_generate_s": dec["torch_generate_s"],
           "compile_s_first_call": dec["compile_s"]}
    return row, prof["logits"]


def filters_only(args) -> None:
    """Only the filters at batch 128, on the logits of one decoding step, written into the
    existing results (their fraction of a step uses the step recorded there)."""
    results = json.loads((RESULTS_DIR / "causal_lm.json").read_text())
    step_ms = results["sampling_filters"]["step_ms"]
    _, config, model, _ = build_models()
    cache_len = buckets.bucket_length(buckets.bucket_length(args.prompt_len) + args.new_tokens)
    logits = profile_step(model, 128, cache_len, 1)["logits"]
    load = os.getloadavg()
    results["sampling_filters"] = {
        "batch": 128, "vocab": config.vocab_size, "step_ms": step_ms,
        "step": "the shorter of our greedy and sampled steps at this batch (the last full run)",
        "load_average": load,
        "filters": bench_filters(logits, step_ms / 1e3, args.repeats, results["read_bytes_per_s"])}
    results["targets"].pop("filters_fraction_of_step_batch_128", None)
    write_results("causal_lm", {k: v for k, v in results.items() if k != "benchmark"})


def main() -> None:
    args = parse_args()
    if args.filters_only:
        return filters_only(args)
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    load_start = os.getloadavg()
    torch_model, config, model, params = build_models()
    s, n = args.prompt_len, args.new_tokens
    b = 16
    ids = np.random.default_rng(0).integers(3, 32000, size=(b, s)).astype(np.int32)
    cache_len = buckets.bucket_length(buckets.bucket_length(s) + n)
    pre = bench_prefill(model, torch_model, ids, np.ones((b, s), np.int32), cache_len,
                        args.repeats)
    bandwidth, matmul = read_bytes_per_s(), matmul_flops_per_s()
    by_batch, filters = {}, None
    for batch in args.batches:
        row, logits = decode_at(batch, model, torch_model, config, params, args, bandwidth,
                                matmul)
        by_batch[str(batch)] = row
        print(row, flush=True)
        if batch == max(args.batches):
            # the shorter of our greedy and sampled (top_k 0) steps: on this shared machine
            # either can come out inflated, which would flatter the filters' share
            step_ms = min(row["ours_greedy_ms_per_step"], row["ours_ms_per_step"])
            filters = {"batch": batch, "vocab": config.vocab_size, "step_ms": step_ms,
                       "step": "the shorter of our greedy and sampled steps at this batch",
                       "filters": bench_filters(logits, step_ms / 1e3, args.repeats, bandwidth)}
    ours_pre_s = pre["ours"]["best_s"]
    results = {
        "config": {"hidden": 768, "layers": 12, "heads": 12, "kv_heads": 4, "mlp": 2048,
                   "vocab": 32000, "parameters": int(params), "dtype": "float32",
                   "prefill_batch": b, "prompt_len": s, "new_tokens": n, "threads": threads,
                   "repeats": args.repeats},
        "prefill": {
            "ours_s": ours_pre_s, "torch_s": pre["torch"]["best_s"],
            "ours_tokens_per_s": b * s / ours_pre_s,
            "speedup_vs_torch": pre["torch"]["best_s"] / ours_pre_s,
            "flops": pre["flops"],
            "ours_flops_per_s": pre["flops"] / ours_pre_s,
            "fraction_of_matmul_rate": pre["flops"] / ours_pre_s / matmul,
            "compile_s": pre["compile_s"], "max_abs_logit_diff_vs_torch": pre["max_diff"],
        },
        "decode_by_batch": by_batch,
        "decode": by_batch.get("16"),
        "sampling_filters": filters,
        "matmul_f32_flops_per_s": matmul,
        "read_bytes_per_s": bandwidth,
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "targets": {"prefill_fraction_of_matmul": 0.85, "decode_speedup": 1.5,
                    "decode_fraction_of_bound_batch_1": 0.60},
    }
    write_results("causal_lm", results)


if __name__ == "__main__":
    main()
