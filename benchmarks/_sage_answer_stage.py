"""Part (a) of benchmarks/sage_pipeline.py: the answer stage of `sage-jax run` on a random
Llama-shaped model of about 30M parameters against the reference method (`transformers`
`pipeline("text-generation")`, one call per prompt), and the bound that the jitted matmul rate
puts on any method that computes every token (`bench_answer_stage` says how)."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from sage import load_average

def _answer_prompts(count: int) -> list[str]:
    import csv

    from clarifyjax.files.tables import resolve_data_path
    from sage_jax.run.prompts import answer_prompt

    path = resolve_data_path("../shared/data/sage-mcc/q100_gpt-3.5-turbo_rot.csv")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [answer_prompt(r["paraphrased"].strip(), False) for r in rows[:count]]


TOKENIZER_TEXTS = "../shared/data/sage-mcc/moral100-high-ambiguity_gpt-3.5-turbo_rot.csv"


def english_texts() -> list[str]:
    """δ-CLARIFY and the moral100 file's questions, paraphrases, answers and RoTs -- not q100,
    whose paraphrases are the prompts: what the benchmark's BPE learns from, so that a prompt
    takes about as many tokens as under a real model's vocabulary (the tests' 300-token BPE needs
    ~1.3 characters a token, which would make prefill, not decoding, the stage's cost)."""
    import csv

    from clarifyjax.models.tiny import tiny_corpus
    from clarifyjax.files.tables import resolve_data_path

    with open(resolve_data_path(TOKENIZER_TEXTS), newline="", encoding="utf-8") as f:
        extra = [r[k] for r in csv.DictReader(f) for k in ("question", "paraphrased", "model_output", "rot")]
    return tiny_corpus(None) + [t for t in extra if t]


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



def time_our_stage(lm, root: Path, prompts: list[str], sampling, args) -> dict:
    """Our answer stage (`Stage` over `lm`, parsing and batch files included) on `prompts`: a
    first run with another seed (it compiles), `--answer-repeats` timed runs, one more for the
    rows' statuses, and a run that requeues failed rows (3 attempts)."""
    from sage_jax.run.prompts import parse_answer
    from sage_jax.run.stages import Stage, Task

    def judge(tasks, texts, previous):
        return [{"ok": r is None, "reason": r, "answer": a} for a, r in map(parse_answer, texts)]

    def stage(name: str, rows: list[str], max_attempts: int, seed: int = 0) -> tuple[float, list[dict]]:
        tasks = [Task((str(i), 0, "bench", 0), p, {}) for i, p in enumerate(rows)]
        s = Stage("answer", root / name, tasks, fingerprint={"name": name}, max_attempts=max_attempts,
                  batch_size=args.batch_size, seed=seed)
        started = time.perf_counter()
        out = s.run(lambda: lm, judge, sampling=sampling, quiet=True)
        return time.perf_counter() - started, out

    warm_s, _ = stage("warmup", prompts, 1, seed=1)  # the same shapes, another seed: compiles
    times = [stage(f"timed{r}", prompts, 1)[0] for r in range(args.answer_repeats)]
    _, rows = stage("timed_rows", prompts, 1)
    ours_capped_s, capped = stage("timed_requeue", prompts, 3)
    return {"ours_answer_stage_s": min(times), "ours_times_s": times,
            "ours_first_run_with_compile_s": warm_s,
            "ours_rows_ok": sum(r["status"] == "ok" for r in rows),
            "ours_with_requeue_s": ours_capped_s,
            "ours_with_requeue_rows_ok": sum(r["status"] == "ok" for r in capped)}


def time_reference(folder: Path, prompts: list[str], new_tokens: int) -> float:
    """Seconds of the reference's method on `prompts`: transformers' text-generation pipeline
    on the same weights, one call per prompt (after one untimed warm-up call)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    pipe(prompts[0], do_sample=True, top_k=10, max_new_tokens=new_tokens,
         pad_token_id=tokenizer.eos_token_id)  # warm-up
    started = time.perf_counter()
    for p in prompts:  # the reference's one call per prompt
        pipe(p, do_sample=True, top_k=10, num_return_sequences=1, max_new_tokens=new_tokens,
             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    return time.perf_counter() - started


def answer_stage_bound(args, vocab: int, prompt_tokens: list[int], ref_all_s: float,
                       ours_s: float) -> dict:
    """Every prompt and new token's FLOPs (`llama_flops`) at the jitted float32 matmul rate
    measured at the model's shapes, against the reference's and our seconds."""
    from reward import matmul_flops_per_s

    flops = llama_flops(LLAMA_30M, vocab, prompt_tokens, args.new_tokens)
    mean_prompt = sum(prompt_tokens) / len(prompt_tokens)
    rate = matmul_flops_per_s((args.batch_size * int(mean_prompt), LLAMA_30M["hidden_size"],
                               LLAMA_30M["intermediate_size"]))
    at_rate_s = flops / rate
    return {
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
    }


def bench_answer_stage(args, target_speedup: float) -> dict:
    """(a): our answer stage against transformers' pipeline, one prompt per call, and the bound
    that the jitted matmul rate puts on any method that computes every token.

    The prompts: the reference's answer prompt over the q100 file's paraphrases; top-k 10
    sampling on `llama_30m` (hidden 512, 7 layers, an 8192-token BPE). Ours: the whole stage
    (`sage_jax.run.stages.Stage` over `LocalLM`, parsing and batch files included; compiled by a
    first run on the same prompts). The reference: `transformers` `pipeline("text-generation")`
    called once per prompt (vnnm404/SaGE scripts/model_output.py), same weights, same threads;
    `--reference-prompts N` times it on the first N prompts and scales its time to all of them
    (the JSON says so). The bound: the FLOPs of every prompt and new token at the jitted matmul
    rate measured at the model's shapes."""
    import jax
    import torch
    from flax import nnx

    from clarifyjax.decoding.local_lm import LocalLM
    from clarifyjax.text.generator import Sampling

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
    ours = time_our_stage(lm, root, prompts, sampling, args)
    ours_s = ours["ours_answer_stage_s"]
    ref_prompts = prompts[:args.reference_prompts]
    ref_s = time_reference(folder, ref_prompts, args.new_tokens)
    ref_all_s = ref_s * len(prompts) / len(ref_prompts)
    vocab = int(lm.model.config.vocab_size)
    mean_prompt = sum(prompt_tokens) / len(prompt_tokens)
    bound = answer_stage_bound(args, vocab, prompt_tokens, ref_all_s, ours_s)
    return {
        "part": "a", "prompts": len(prompts), "new_tokens": args.new_tokens, "threads": threads,
        "batch_size": args.batch_size,
        "model": {"family": "llama", "parameters": n_params, "vocab": vocab,
                  **{k: v for k, v in LLAMA_30M.items()}},
        "prompt_tokens": {"mean": mean_prompt, "min": min(prompt_tokens), "max": max(prompt_tokens),
                          "characters_per_token": sum(map(len, prompts)) / sum(prompt_tokens)},
        **ours,
        "reference_prompts_timed": len(ref_prompts), "reference_s": ref_s,
        "reference_s_for_all_prompts": ref_all_s,
        "reference_scaled": len(ref_prompts) != len(prompts),
        "speedup": ref_all_s / ours_s, "target_speedup": target_speedup,
        "bound": bound,
        "load_average": {"start": load_start, "end": load_average()},
    }
