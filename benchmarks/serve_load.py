"""`clarifyjax serve` under load: continuous batching against today's window batcher, in the same
run, on the same model and the same arrivals.

Both servers (one `LocalLM` on a random Llama, uvicorn on 127.0.0.1) get Poisson arrivals of SaGE
answer prompts and chat turns (`workload`) at each rate; `summarize` says what is reported and
`compare` where the two are compared. Writes benchmarks/results/serve_load.json and .png.

    python benchmarks/serve_load.py [--rates 2 4 8 16 32] [--requests 160] [--seconds 30]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np
from _common import RESULTS_DIR, write_results
from _sage_answer_stage import _answer_prompts, english_texts

from clarifyjax.core import traces
from clarifyjax.decoding.local_lm import LocalLM
from clarifyjax.models.tiny import tiny_corpus, tiny_llama_folder
from clarifyjax.serve.continuous import ContinuousBatcher, SlotSettings
from clarifyjax.serve.http_server import BackgroundServer
from clarifyjax.serve.openai_api import OpenAIServer, ServerLimits

MODEL = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4}
CHAT_TOKENS = (8, 16, 32, 64)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", type=float, nargs="+", default=[2, 4, 8, 16, 32],
                   help="arrival rates, requests per second")
    p.add_argument("--requests", type=int, default=160, help="most requests per rate")
    p.add_argument("--seconds", type=float, default=30.0, help="arrivals within this per rate")
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def workload(count: int, seed: int) -> list[tuple[str, dict]]:
    """(path, body) of `count` requests, half SaGE answer prompts, half chat turns, shuffled;
    each unique (a request number in its text) so that the server's timings find it. Answer
    prompts: the reference's answer prompt over the q100 file's paraphrases, `/v1/completions`,
    top-k 10, 32 new tokens; chat turns: δ-CLARIFY situations as a user message,
    `/v1/chat/completions`, greedy, 8 to 64 new tokens."""
    rng = np.random.default_rng(seed)
    answers = _answer_prompts(count)
    situations = [s for s in tiny_corpus(4 * count) if len(s.split()) > 6][::2]
    out = []
    for i in range(count):
        if i % 2 == 0:  # the number last: the template stays a prefix every prompt shares
            out.append(("/v1/completions", {"prompt": answers[i // 2 % len(answers)] + f" ({i})",
                                            "max_tokens": 32, "temperature": 1.0,
                                            "top_k": 10}))
        else:
            text = f"{situations[i // 2 % len(situations)]} What should I do? ({i})"
            out.append(("/v1/chat/completions", {
                "messages": [{"role": "user", "content": text}], "temperature": 0,
                "max_tokens": int(rng.choice(CHAT_TOKENS))}))
    order = rng.permutation(count)
    return [out[i] for i in order]


def key_of(body: dict) -> tuple:
    """How the servers' timings name a request: its prompts as text."""
    return (str(body["messages"]),) if "messages" in body else (body["prompt"],)


def send(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    sent = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            out = json.loads(response.read())
            status = response.status
    except urllib.error.HTTPError as e:
        out, status = json.loads(e.read()), e.code
    done = time.monotonic()
    tokens = out.get("usage", {}).get("completion_tokens", 0) if status == 200 else 0
    return {"key": key_of(body), "sent": sent, "done": done, "status": status, "tokens": tokens}


def run_rate(url: str, requests: list[tuple[str, dict]], rate: float, seconds: float,
             seed: int) -> list[dict]:
    """Poisson arrivals at `rate` per second, those within `seconds`; every answer awaited."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(requests))
    arrivals = np.cumsum(gaps) - gaps[0]
    chosen = [(t, r) for t, r in zip(arrivals, requests) if t < seconds]
    with concurrent.futures.ThreadPoolExecutor(len(chosen)) as pool:
        start = time.monotonic()
        futures = []
        for t, (path, body) in chosen:
            time.sleep(max(0.0, start + t - time.monotonic()))
            futures.append(pool.submit(send, url, path, body))
        return [f.result() for f in futures]


def summarize(records: list[dict], first_token: dict, rate: float) -> dict:
    """Completion tokens/s and requests/s over the run, p50/p99 end-to-end latency (client send
    to response) and p50/p99 time to first token. Neither server streams, so the first token's
    time is read in the server: the continuous engine's own timestamp of the request's first
    token; for the window batcher, when its batch started (its prefill not included: a lower
    bound)."""
    ok = [r for r in records if r["status"] == 200]
    span = max(r["done"] for r in records) - min(r["sent"] for r in records)
    e2e = np.array([r["done"] - r["sent"] for r in ok])
    ttft = np.array([first_token[r["key"]] - r["sent"] for r in ok if r["key"] in first_token])
    pct = lambda a, q: float(np.percentile(a, q)) if len(a) else None  # noqa: E731
    return {"offered_rate": rate, "requests": len(records), "ok": len(ok),
            "errors": len(records) - len(ok), "seconds": span,
            "requests_per_s": len(ok) / span, "tokens_per_s": sum(r["tokens"] for r in ok) / span,
            "e2e_p50_s": pct(e2e, 50), "e2e_p99_s": pct(e2e, 99),
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99), "ttft_measured": len(ttft)}


def window_timings(server: OpenAIServer) -> dict:
    """Wrap the window server's batch call: {request key: when its batch started}."""
    started, call = {}, server._call

    def timed(group):
        now = time.monotonic()
        for job in group:
            started[tuple(map(str, job.prompts))] = now
        return call(group)
    server._call = timed
    return started


def measure(name: str, server: OpenAIServer, requests, args) -> tuple[list[dict], dict]:
    """Warm-up (every request once, 32 at a time), then each rate; the compiles while
    measuring."""
    started = window_timings(server) if name == "window" else None
    if started is None:
        server.batcher.engine.warmup()
    with BackgroundServer(server.app) as background:
        for attempt in range(6):  # until a pass compiles nothing: waves of 1 to 32 requests
            before = traces.count()
            order = np.random.default_rng(attempt).permutation(len(requests))
            waves = np.split(order, np.cumsum([1, 2, 4, 8, 16, 32] * len(requests)))
            for wave in (w for w in waves if len(w)):
                with concurrent.futures.ThreadPoolExecutor(len(wave)) as pool:
                    list(pool.map(lambda i: send(background.url, *requests[i]), wave))
            if traces.count() == before:
                break
        before = traces.count()
        rows = []
        for i, rate in enumerate(args.rates):
            records = run_rate(background.url, requests, rate, args.seconds, args.seed + i)
            first = ({t.prompts: t.first_token for t in server.batcher.timings}
                     if started is None else started)
            rows.append(summarize(records, first, rate) | {"server": name})
            print(json.dumps(rows[-1]), flush=True)
        return rows, {"compiles_while_measuring": traces.count() - before}


def compare(rows: list[dict]) -> dict:
    """At the rate where the window server reaches its throughput limit (the lowest rate whose
    throughput is within 5% of its best): the p99 end-to-end latencies and throughputs."""
    window = [r for r in rows if r["server"] == "window"]
    best = max(r["tokens_per_s"] for r in window)
    limit = min((r for r in window if r["tokens_per_s"] >= 0.95 * best),
                key=lambda r: r["offered_rate"])
    cont = next(r for r in rows if r["server"] == "continuous"
                and r["offered_rate"] == limit["offered_rate"])
    return {"rate": limit["offered_rate"],
            "how": "the lowest rate at which the window server's tokens/s is within 5% of its "
                   "best over the rates",
            "window_p99_e2e_s": limit["e2e_p99_s"], "continuous_p99_e2e_s": cont["e2e_p99_s"],
            "p99_e2e_ratio_window_over_continuous": limit["e2e_p99_s"] / cont["e2e_p99_s"],
            "window_tokens_per_s": limit["tokens_per_s"],
            "continuous_tokens_per_s": cont["tokens_per_s"],
            "throughput_ratio_continuous_over_window": cont["tokens_per_s"]
            / limit["tokens_per_s"],
            "targets": {"p99_e2e_ratio": 2.0, "throughput_ratio": 1.0}}


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, color in (("window", "tab:red"), ("continuous", "tab:blue")):
        mine = sorted((r for r in rows if r["server"] == name), key=lambda r: r["offered_rate"])
        rates = [r["offered_rate"] for r in mine]
        left.plot(rates, [r["e2e_p99_s"] for r in mine], "o-", color=color, label=f"{name} p99")
        left.plot(rates, [r["e2e_p50_s"] for r in mine], "o--", color=color, label=f"{name} p50")
        right.plot(rates, [r["tokens_per_s"] for r in mine], "o-", color=color, label=name)
    left.set(xscale="log", yscale="log", xlabel="offered load (requests/s)",
             ylabel="end-to-end latency (s)", title="latency against load")
    right.set(xscale="log", xlabel="offered load (requests/s)", ylabel="completion tokens/s",
              title="throughput")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def main() -> None:
    args = parse_args()
    root = tempfile.mkdtemp(prefix="serve_load_")
    folder = tiny_llama_folder(root, seed=0, tokenizer={"vocab_size": 8192,
                                                        "texts": english_texts()},
                               max_position_embeddings=512, **MODEL)
    lm = LocalLM(folder, batch_size=args.slots).load()
    requests = workload(args.requests, args.seed)
    lengths = [lm.count_tokens(b.get("messages") or b["prompt"]) for _, b in requests]
    limits = ServerLimits(max_tokens=64, max_batch_rows=args.slots, window_s=0.01)
    rows, compiles = [], {}
    for name in ("window", "continuous"):
        batcher = None if name == "window" else ContinuousBatcher(
            lm, SlotSettings(slots=args.slots, length=256, chunk=64))
        server = OpenAIServer(lm, name="bench", limits=limits, batcher=batcher)
        measured, compiles[name] = measure(name, server, requests, args)
        rows += measured
    figure = RESULTS_DIR / "serve_load.png"
    plot(rows, figure)
    write_results("serve_load", {
        "model": "random Llama, hidden 256, 4 layers, 8 heads, 4 KV heads, MLP 688, vocab "
                 f"{lm.tokenizer.vocab_size}, float32",
        "servers": {"window": f"MicroBatcher, {args.slots} rows, 10 ms window",
                    "continuous": f"ContinuousBatcher, {args.slots} slots of 256 positions, "
                                  "prefill chunks of 64 tokens x 4 rows"},
        "workload": {"requests_per_rate": args.requests, "seconds_per_rate": args.seconds,
                     "prompt_tokens_mean": float(np.mean(lengths)),
                     "prompt_tokens_min": int(min(lengths)), "prompt_tokens_max": int(max(lengths)),
                     "mix": "half SaGE answer prompts (top-k 10, 32 tokens), half chat turns "
                            f"(greedy, max_tokens from {list(CHAT_TOKENS)})"},
        "ttft_note": "continuous: the engine's first-token time; window: when the request's "
                     "batch started (its prefill not included, a lower bound)",
        "rates": rows, "compiles": compiles, "at_window_throughput_limit": compare(rows),
        "figure": str(figure.relative_to(RESULTS_DIR.parent.parent)),
        "load_average": os.getloadavg()})


if __name__ == "__main__":
    main()
