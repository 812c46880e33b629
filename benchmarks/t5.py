"""T5 throughput: ours (Flax NNX, jitted) vs PyTorch transformers on the same weights.

t5-small-sized random model (d_model 512, 6+6 layers, 8 heads, d_ff 2048, vocab 32128), float32,
batch 16, inputs of 64 tokens, targets of 64 tokens for the teacher-forced pass, 32 sampled tokens.
PyTorch runs with the same thread count as XLA's CPU client (all cores). Also measures this
machine's jitted float32 matmul throughput, to put our forward FLOP/s in proportion.

    python benchmarks/t5.py [--batch 16] [--source-len 64] [--target-len 64] [--new-tokens 32]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from _common import timeit, write_results

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from transformers import T5Config as HFT5Config
from transformers import T5ForConditionalGeneration

from clarifyjax.decoding import generate
from clarifyjax.models.hf import load_t5


def matmul_flops_per_s(n: int = 2048, repeats: int = 10) -> float:
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(lambda a, b: a @ b)
    f(a, b).block_until_ready()
    t = timeit(lambda: f(a, b).block_until_ready(), repeats=repeats)
    return 2 * n ** 3 / t["best_s"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--source-len", type=int, default=64)
    p.add_argument("--target-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    return p.parse_args()


def build_models():
    """The random t5-small-sized PyTorch model and ours loaded from its saved folder."""
    hf_config = HFT5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                           num_decoder_layers=6, num_heads=8, feed_forward_proj="relu",
                           dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
                           eos_token_id=1)
    torch_model = T5ForConditionalGeneration(hf_config).eval()
    with tempfile.TemporaryDirectory() as d:
        torch_model.save_pretrained(d, safe_serialization=True)
        _, model = load_t5(d)
    return torch_model, model


def random_inputs(b: int, s: int, t: int) -> tuple[np.ndarray, ...]:
    """(ids, mask, decoder ids, decoder mask): random tokens, no padding, decoder start id 0."""
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 32128, size=(b, s)).astype(np.int32)
    mask = np.ones((b, s), np.int32)
    dec = rng.integers(2, 32128, size=(b, t)).astype(np.int32)
    dec[:, 0] = 0
    dec_mask = np.ones((b, t), np.int32)
    return ids, mask, dec, dec_mask


def bench_forward(model, torch_model, inputs, repeats: int) -> dict:
    """The teacher-forced forward: ours jitted (compile apart, XLA's FLOPs) and PyTorch's."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, ids, mask, dec, dec_mask):
        return nnx.merge(graphdef, state)(ids, mask, dec, dec_mask)

    jargs = [jnp.asarray(x) for x in inputs]
    t0 = time.perf_counter()
    compiled = forward.lower(state, *jargs).compile()
    compile_forward_s = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    forward_flops = float(cost.get("flops", 0.0))
    ours_fwd = timeit(lambda: compiled(state, *jargs).block_until_ready(), repeats=repeats)
    tids, tmask, tdec, tdec_mask = (torch.from_numpy(x.astype(np.int64)) for x in inputs)

    def torch_forward():
        with torch.inference_mode():
            return torch_model(input_ids=tids, attention_mask=tmask, decoder_input_ids=tdec,
                               decoder_attention_mask=tdec_mask).logits

    with torch.inference_mode():
        max_diff = float(np.max(np.abs(torch_forward().numpy()
                                       - np.asarray(compiled(state, *jargs)))))
    torch_fwd = timeit(torch_forward, repeats=repeats)
    b, s = inputs[0].shape
    fwd_tokens = b * (s + inputs[2].shape[1])
    return {
        "ours_s": ours_fwd["best_s"], "torch_s": torch_fwd["best_s"],
        "ours_tokens_per_s": fwd_tokens / ours_fwd["best_s"],
        "torch_tokens_per_s": fwd_tokens / torch_fwd["best_s"],
        "speedup_vs_torch": torch_fwd["best_s"] / ours_fwd["best_s"],
        "compile_s": compile_forward_s, "max_abs_logit_diff_vs_torch": max_diff,
        "flops": forward_flops, "ours_flops_per_s": forward_flops / ours_fwd["best_s"],
    }


def bench_sampling(model, torch_model, ids: np.ndarray, mask: np.ndarray, n: int,
                   repeats: int) -> dict:
    """`n` sampled tokens per row (top_k 0): ours (first call with its compile apart) and
    PyTorch's `generate`."""
    key = jax.random.key(0)
    jids, jmask = jnp.asarray(ids), jnp.asarray(mask)

    def ours_sample():
        out = generate(model, jids, jmask, rng=key, max_new_tokens=n, min_new_tokens=n)
        return out.tokens.block_until_ready()

    t0 = time.perf_counter()
    ours_sample()
    compile_sample_s = time.perf_counter() - t0
    ours_smp = timeit(ours_sample, repeats=repeats, warmup=0)
    tids, tmask = (torch.from_numpy(x.astype(np.int64)) for x in (ids, mask))

    def torch_sample():
        with torch.inference_mode():
            return torch_model.generate(input_ids=tids, attention_mask=tmask, do_sample=True,
                                        top_k=0, max_new_tokens=n, min_new_tokens=n)

    torch_smp = timeit(torch_sample, repeats=max(2, repeats // 2))
    b = ids.shape[0]
    return {
        "ours_s": ours_smp["best_s"], "torch_s": torch_smp["best_s"],
        "ours_tokens_per_s": b * n / ours_smp["best_s"],
        "torch_tokens_per_s": b * n / torch_smp["best_s"],
        "ours_ms_per_step": 1e3 * ours_smp["best_s"] / n,
        "torch_ms_per_step": 1e3 * torch_smp["best_s"] / n,
        "speedup_vs_torch": torch_smp["best_s"] / ours_smp["best_s"],
        "compile_s_first_call": compile_sample_s,
    }


def main() -> None:
    args = parse_args()
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    torch_model, model = build_models()
    b, s, t, n = args.batch, args.source_len, args.target_len, args.new_tokens
    inputs = random_inputs(b, s, t)
    forward = bench_forward(model, torch_model, inputs, args.repeats)
    sampling = bench_sampling(model, torch_model, inputs[0], inputs[1], n, args.repeats)
    matmul = matmul_flops_per_s()
    results = {
        "config": {"d_model": 512, "layers": "6+6", "heads": 8, "d_ff": 2048, "vocab": 32128,
                   "dtype": "float32", "batch": b, "source_len": s, "target_len": t,
                   "new_tokens": n, "threads": threads},
        "forward": forward,
        "sampling": sampling,
        "matmul_f32_flops_per_s": matmul,
        "forward_fraction_of_matmul_throughput": forward["ours_flops_per_s"] / matmul,
        "targets": {"forward_speedup": 2.0, "matmul_fraction": 0.70, "sampling_speedup": 4.0},
    }
    write_results("t5", results)

if __name__ == "__main__":
    main()
