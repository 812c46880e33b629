"""What dynamic batching buys `clarifyjax serve`: the same 32 greedy requests sent one after the
other, then by 32 concurrent `openai` clients, to the OpenAI-compatible server running in this
process (`OpenAIServer` over `LocalLM`, uvicorn on 127.0.0.1), on a small random Llama (hidden
256, 4 layers, 8 heads, 4 KV heads) with the tiny BPE tokenizer. Also the same prompts through
`LocalLM.complete` directly (one call), the bound the server's batching approaches, and how many
jitted programs the whole run compiled.

    python benchmarks/llm_serve.py [--requests 32] [--max-tokens 32] [--batch-size 32]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
import time

from _common import write_results

from clarifyjax.core import traces
from clarifyjax.decoding.local_lm import LocalLM
from clarifyjax.models.tiny import tiny_corpus, tiny_llama_folder
from clarifyjax.serve.openai_api import OpenAIServer, ServerLimits
from clarifyjax.serve.http_server import BackgroundServer
from clarifyjax.text.generator import Sampling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    import openai

    root = tempfile.mkdtemp(prefix="llm_serve_bench_")
    folder = tiny_llama_folder(root, seed=0, hidden_size=256, intermediate_size=688,
                               num_hidden_layers=4, num_attention_heads=8,
                               num_key_value_heads=4, max_position_embeddings=512)
    lm = LocalLM(folder, batch_size=args.batch_size).load()
    prompts = [" ".join(t.split()[:6]) for t in tiny_corpus(args.requests)][: args.requests]
    server = OpenAIServer(lm, name="bench", limits=ServerLimits(max_batch_rows=args.batch_size,
                                                                 window_s=0.01))
    with BackgroundServer(server.app) as background:
        client = openai.OpenAI(base_url=background.url + "/v1", api_key="unused", timeout=600)

        def ask(prompt):
            out = client.completions.create(model="bench", prompt=prompt, temperature=0,
                                            max_tokens=args.max_tokens)
            return out.choices[0].text, out.usage.completion_tokens

        def concurrent_run():
            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                return list(pool.map(ask, prompts))

        compile_started = time.perf_counter()
        ask(prompts[0])
        concurrent_run()  # every batch shape the runs below use
        warmup_s = time.perf_counter() - compile_started
        traced = dict(traces.counts())

        t0 = time.perf_counter()
        sequential = [ask(p) for p in prompts]
        sequential_s = time.perf_counter() - t0
        batches_before = len(server.batcher.batches)
        t0 = time.perf_counter()
        together = concurrent_run()
        concurrent_s = time.perf_counter() - t0
        batches = server.batcher.batches[batches_before:]

    t0 = time.perf_counter()
    direct = lm.complete(prompts, Sampling(max_new_tokens=args.max_tokens, temperature=0))
    direct_s = time.perf_counter() - t0
    tokens = sum(n for _, n in sequential)
    results = {
        "model": "random Llama, hidden 256, 4 layers, 8 heads, 4 KV heads, vocab "
                 f"{lm.tokenizer.vocab_size}, float32",
        "requests": len(prompts), "max_tokens": args.max_tokens, "batch_size": args.batch_size,
        "completion_tokens": tokens,
        "sequential_s": round(sequential_s, 3), "concurrent_s": round(concurrent_s, 3),
        "direct_complete_s": round(direct_s, 3),
        "speedup_concurrent_over_sequential": round(sequential_s / concurrent_s, 2),
        "concurrent_over_direct": round(concurrent_s / direct_s, 2),
        "concurrent_tokens_per_s": round(tokens / concurrent_s, 1),
        "batches_of_concurrent_run": batches, "warmup_and_compile_s": round(warmup_s, 2),
        "same_answers": [t for t, _ in sequential] == [t for t, _ in together]
        == [c[0].text for c in direct],
    }
    results["jit_traces_after_warmup"] = {str(k): v for k, v in traced.items()}
    results["jit_traces_at_end"] = {str(k): v for k, v in traces.counts().items()}
    write_results("llm_serve", results)


if __name__ == "__main__":
    main()
