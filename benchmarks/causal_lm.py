"""Decoder-only LM throughput: ours (Flax NNX, jitted, KV cache in one while_loop) vs PyTorch
transformers on the same weights, with this machine's bounds measured in the same run.

A random Llama-shaped model of ~125M parameters (hidden 768, 12 layers, 12 heads, 4 KV heads,
MLP 2048, vocab 32,000, untied), float32, batch 16, prompts of 64 tokens, 32 new tokens.
PyTorch runs with the same thread count as XLA's CPU client (all cores).

* prefill: the jitted `CausalLM.prefill` (prompt -> cache + last logits), its FLOP/s (XLA's
  cost analysis) as a fraction of the jitted float32 matmul rate;
* decode: seconds per step = (generate 32 tokens - generate 1 token) / 31, for ours and for
  `transformers` `generate` (sampling, top_k 0), and against the weight-streaming bound:
  (bytes of weights + bytes of cache read per step) / the read bandwidth of a jitted reduction
  over a 1 GiB array;
* compile times apart.

    python benchmarks/causal_lm.py [--batch 16] [--prompt-len 64] [--new-tokens 32]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from _common import timeit, write_results
from t5 import matmul_flops_per_s

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from transformers import LlamaConfig, LlamaForCausalLM

from clarifyjax.core import buckets
from clarifyjax.decoding import generate
from clarifyjax.models.hf import load_causal_lm


def read_bytes_per_s(n_bytes: int = 2 ** 30, repeats: int = 10) -> float:
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    f = jax.jit(jnp.sum)
    f(x).block_until_ready()
    return n_bytes / timeit(lambda: f(x).block_until_ready(), repeats=repeats)["best_s"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
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
    """Seconds per decode step, ours and `transformers` `generate` (sampling, top_k 0):
    (generate n tokens - generate 1 token) / (n - 1)."""
    jids, jmask = jnp.asarray(ids), jnp.asarray(mask)
    tids, tmask = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))
    key = jax.random.key(0)

    def ours(new):
        return lambda: generate(model, jids, jmask, rng=key, max_new_tokens=new,
                                min_new_tokens=new).tokens.block_until_ready()

    t0 = time.perf_counter()
    ours(n)()
    compile_generate_s = time.perf_counter() - t0
    ours(1)()
    ours_n = timeit(ours(n), repeats=repeats, warmup=0)
    ours_1 = timeit(ours(1), repeats=repeats, warmup=0)

    def theirs(new):
        def run():
            with torch.inference_mode():
                return torch_model.generate(input_ids=tids, attention_mask=tmask, do_sample=True,
                                            top_k=0, max_new_tokens=new, min_new_tokens=new)
        return run

    torch_n = timeit(theirs(n), repeats=repeats)
    torch_1 = timeit(theirs(1), repeats=repeats)
    return {"ours_step": (ours_n["best_s"] - ours_1["best_s"]) / (n - 1),
            "torch_step": (torch_n["best_s"] - torch_1["best_s"]) / (n - 1),
            "ours_generate_s": ours_n["best_s"], "torch_generate_s": torch_n["best_s"],
            "compile_s": compile_generate_s}


def main() -> None:
    args = parse_args()
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    torch_model, config, model, params = build_models()
    b, s, n = args.batch, args.prompt_len, args.new_tokens
    ids = np.random.default_rng(0).integers(3, 32000, size=(b, s)).astype(np.int32)
    mask = np.ones((b, s), np.int32)
    cache_len = buckets.bucket_length(buckets.bucket_length(s) + n)
    pre = bench_prefill(model, torch_model, ids, mask, cache_len, args.repeats)
    dec = bench_decode(model, torch_model, ids, mask, n, args.repeats)
    ours_pre_s, ours_step, torch_step = pre["ours"]["best_s"], dec["ours_step"], dec["torch_step"]

    c = config
    weight_bytes = params * 4
    # each step reads every layer's keys and values over the whole (bucketed) cache
    cache_bytes = 2 * c.num_layers * b * cache_len * c.num_kv_heads * c.head_dim * 4
    bandwidth = read_bytes_per_s()
    bound_step = (weight_bytes + cache_bytes) / bandwidth
    matmul = matmul_flops_per_s()
    results = {
        "config": {"hidden": 768, "layers": 12, "heads": 12, "kv_heads": 4, "mlp": 2048,
                   "vocab": 32000, "parameters": int(params), "dtype": "float32", "batch": b,
                   "prompt_len": s, "new_tokens": n, "cache_len": cache_len,
                   "threads": threads},
        "prefill": {
            "ours_s": ours_pre_s, "torch_s": pre["torch"]["best_s"],
            "ours_tokens_per_s": b * s / ours_pre_s,
            "speedup_vs_torch": pre["torch"]["best_s"] / ours_pre_s,
            "flops": pre["flops"],
            "ours_flops_per_s": pre["flops"] / ours_pre_s,
            "fraction_of_matmul_rate": pre["flops"] / ours_pre_s / matmul,
            "compile_s": pre["compile_s"], "max_abs_logit_diff_vs_torch": pre["max_diff"],
        },
        "decode": {
            "ours_ms_per_step": 1e3 * ours_step, "torch_ms_per_step": 1e3 * torch_step,
            "speedup_vs_torch": torch_step / ours_step,
            "streaming_bound_ms_per_step": 1e3 * bound_step,
            "fraction_of_streaming_bound": bound_step / ours_step,
            "weight_bytes": weight_bytes, "cache_bytes_per_step": cache_bytes,
            "ours_generate_s": dec["ours_generate_s"], "torch_generate_s": dec["torch_generate_s"],
            "compile_s_first_call": dec["compile_s"],
        },
        "matmul_f32_flops_per_s": matmul,
        "read_bytes_per_s": bandwidth,
        "load_average": os.getloadavg(),
        "targets": {"prefill_fraction_of_matmul": 0.85, "decode_speedup": 1.5,
                    "decode_fraction_of_streaming_bound": 0.60},
    }
    write_results("causal_lm", results)

if __name__ == "__main__":
    main()
