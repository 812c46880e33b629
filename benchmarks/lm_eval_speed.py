"""lm-evaluation-harness 0.4.13 with the model "clarifyjax" against its `hf` model, on the same CPU,
the same random 116M Llama folder and the same local tasks: wall time of `simple_evaluate` on a
loglikelihood task (HellaSwag's YAML over generated documents) and on a generate_until task, each
run twice on one loaded model (the first run includes our compiles), with the machine's float32
matmul rate as the bound. Writes benchmarks/results/lm_eval_speed.json.

    nice python benchmarks/lm_eval_speed.py [--docs 24] [--questions 16] [--max-gen-toks 32]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from _common import write_results
from t5 import matmul_flops_per_s

import lm_eval
import torch
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
from transformers import LlamaConfig, LlamaForCausalLM

from clarifyjax.harness.lm_eval_model import ClarifyJaxLM
from clarifyjax.harness.local_tasks import write_generation_task, write_tasks
from clarifyjax.models.tiny import tiny_causal_tokenizer



def hellaswag_rows(n: int, offset: int = 0) -> list[dict]:
    """HellaSwag documents in its official fields, ~60 tokens of context and 4 endings each."""
    return [{"ind": offset + i, "activity_label": "Making tea", "split": "val", "source_id": f"b{i}",
             "ctx_a": f"A man fills kettle number {offset + i} with water and sets it on the stove.",
             "ctx_b": "he takes a cup from the shelf and", "label": str(i % 4),
             "endings": [f"pours the water over {i} tea leaves.", "puts it back on the shelf.",
                         "sings a song about the winter.", "walks out of the kitchen."]}
            for i in range(n)]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=24, help="HellaSwag documents (4 choices each)")
    p.add_argument("--questions", type=int, default=16, help="generate_until documents")
    p.add_argument("--max-gen-toks", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16, help="both models")
    p.add_argument("--layers", type=int, default=12)
    return p.parse_args()


def build_folder(folder: Path, layers: int) -> int:
    """A random Llama (hidden 768, MLP 3072, 12 heads) with a byte-level BPE of 2000 tokens ->
    its parameter count."""
    tok = tiny_causal_tokenizer(folder, vocab_size=2000)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=768, intermediate_size=3072,
                         num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=12,
                         max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def write_task_folder(root: Path, docs: int, questions: int, max_gen_toks: int) -> Path:
    for name, rows in (("hs.jsonl", hellaswag_rows(docs)), ("hs_train.jsonl", hellaswag_rows(2, 100))):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    tqa = root / "tqa.jsonl"  # write_tasks wants one; the benchmark does not run it
    tqa.write_text(json.dumps({"question": "Q?", "mc1_targets": {"choices": ["a"], "labels": [1]},
                               "mc2_targets": {"choices": ["a"], "labels": [1]}}) + "\n")
    tasks = write_tasks(root / "tasks", hellaswag=root / "hs.jsonl", hellaswag_train=root / "hs_train.jsonl",
                        truthfulqa=tqa)
    words = ["What do people in the village eat for breakfast on a cold day",
             "Where do the birds of the northern lakes go in the winter",
             "Is it wrong to lie to a friend who asks about a gift"]
    rows = [{"question": f"{words[i % 3]} number {i}?", "answer": "yes"} for i in range(questions)]
    return write_generation_task(tasks, rows, max_gen_toks=max_gen_toks)


def timed(lm, task: str, tasks: Path) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=[task], log_samples=True,
                                  task_manager=TaskManager(include_path=str(tasks), include_defaults=False))
    return time.perf_counter() - t0, out


def main() -> None:
    args = parse_args()
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        folder = root / "llama"
        folder.mkdir()
        params = build_folder(folder, args.layers)
        tasks = write_task_folder(root, args.docs, args.questions, args.max_gen_toks)
        models = {
            "hf": HFLM(pretrained=str(folder), dtype="float32", device="cpu", batch_size=args.batch_size,
                       max_length=2048),
            "clarifyjax": ClarifyJaxLM(str(folder), dtype="float32", batch_size=args.batch_size,
                                       max_length=2048)}
        runs, outputs = {}, {}
        for task in ("local_hellaswag", "local_gen"):
            for name, lm in models.items():
                first, out = timed(lm, task, tasks)
                second, _ = timed(lm, task, tasks)
                runs[f"{task}/{name}"] = {"first_s": first, "second_s": second}
                outputs[f"{task}/{name}"] = out
                print(task, name, runs[f"{task}/{name}"], flush=True)
        matmul = matmul_flops_per_s()
    results = {"config": {"parameters": int(params), "hidden": 768, "layers": args.layers, "mlp": 3072,
                          "vocab": 2000, "dtype": "float32", "batch_size": args.batch_size,
                          "hellaswag_docs": args.docs, "gen_questions": args.questions,
                          "max_gen_toks": args.max_gen_toks, "threads": threads},
               "runs": runs, "matmul_f32_flops_per_s": matmul,
               "load_average": {"start": load_start, "end": os.getloadavg()}}
    for task in ("local_hellaswag", "local_gen"):
        hf, ours = runs[f"{task}/hf"], runs[f"{task}/clarifyjax"]
        tokens = sum(len(r["arguments"][0][0]) + len(r["arguments"][0][1]) if task == "local_hellaswag"
                     else 0 for r in outputs[f"{task}/hf"]["samples"][task])
        results[task] = {"speedup_first": hf["first_s"] / ours["first_s"],
                         "speedup_second": hf["second_s"] / ours["second_s"],
                         "same_metrics": _same(outputs[f"{task}/hf"]["results"][task],
                                               outputs[f"{task}/clarifyjax"]["results"][task])}
        if tokens:  # characters, ~1.3 a token: the bound's share is a rough one
            flops = 2 * params * tokens / 1.3
            results[task]["ours_fraction_of_matmul_rate"] = flops / ours["second_s"] / matmul
    results["targets"] = {"speedup": 1.5}
    write_results("lm_eval_speed", results)


def _same(a: dict, b: dict) -> bool:
    return all(abs(a[k] - b[k]) < 1e-4 for k in a if isinstance(a[k], float) and "stderr" not in k)


if __name__ == "__main__":
    main()
