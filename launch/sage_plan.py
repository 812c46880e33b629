#!/usr/bin/env python
"""Time and cost of SaGE on the whole Moral Consistency Corpus: 50,000 questions, 5 paraphrases
each, 11 models answering every paraphrase, a rule of thumb for every answer, and the scores; on
one CPU host, one H100 and a TPU v4-32 slice.

    python launch/sage_plan.py                       # the table
    python launch/sage_plan.py --markdown plan.md    # as docs/usage.md's table
    python launch/sage_plan.py --docs                # rewrite docs/usage.md's table (after `make bench`)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from clarifyjax.files.textfiles import atomic_write_bytes  # noqa: E402

CORPUS = {"questions": 50_000, "paraphrases": 5, "models": 11}
# The reference's models (priyanshul-govil/SaGE models.txt plus gpt-3.5-turbo, an API: no compute
# here); billions of parameters of the ten open ones.
OPEN_MODELS_B = (7, 13, 7, 7, 7, 7, 30, 33, 7, 40)
WRITER_B = 13  # lmsys/vicuna-13b-v1.3 writes the paraphrases and the rules of thumb
# Tokens per call: the paraphrase prompt holds 20 examples (~500 tokens) and asks for 20 lines
# (512 new), 1.5 calls per question on average (ParaScore rejects some); the answer prompt ~87
# tokens (benchmarks/results/sage_pipeline.json, answer_stage.prompt_tokens.mean) and one
# paragraph (~120 new); the RoT prompt (~450 tokens of template + the answer) and one sentence.
TOKENS = {"paraphrase": (500, 512, 1.5), "answer": (87, 120, 1.0), "rot": (570, 30, 1.0)}
SCORE_TOKENS_PER_ANSWER = 3 * 150  # the answer and its RoT embedded, plus BERTScore's pairs
# Accelerators: peak dense bf16 FLOP/s and memory bandwidth (vendor data sheets), parameter bytes,
# rows decoded together, the share of the peak a run reaches, and the price per hour (on-demand
# list prices; edit to yours).
HARDWARE = {
    "CPU host": {"flops": None, "bandwidth": None, "bytes_per_param": 4, "batch": 8, "utilisation": None,
                 "price": 0.70},
    "1 x H100": {"flops": 989e12, "bandwidth": 3.35e12, "bytes_per_param": 2, "batch": 64, "utilisation": 0.4,
                 "price": 3.00},
    "TPU v4-32": {"flops": 16 * 275e12, "bandwidth": 16 * 1.2e12, "bytes_per_param": 2, "batch": 256,
                  "utilisation": 0.4, "price": 16 * 3.22},
}


def measured() -> dict:
    """The CPU rates of benchmarks/results (what `make bench` wrote last): causal_lm.json's
    float32 matmul rate, the prefill FLOP/s the causal LM reached and the bytes/s it read;
    sage.json's sentence embedder tokens/s end to end. The accelerators' rates are their stated
    peaks times an assumed utilisation (`HARDWARE`); `--markdown` prints every assumption."""
    results = REPO_ROOT / "benchmarks" / "results"
    causal = json.loads((results / "causal_lm.json").read_text())
    sage = json.loads((results / "sage.json").read_text())
    return {"flops": causal["matmul_f32_flops_per_s"], "prefill_flops": causal["prefill"]["ours_flops_per_s"],
            "bandwidth": causal["read_bytes_per_s"],
            "score_tokens_per_s": sage["pairs_end_to_end"]["ours_tokens_per_s"]}


def _rates(name: str, cpu: dict) -> dict:
    h = dict(HARDWARE[name])
    if h["flops"] is None:  # the CPU host: measured
        h.update(flops=cpu["flops"], bandwidth=cpu["bandwidth"], utilisation=cpu["prefill_flops"] / cpu["flops"])
        h["score_tokens_per_s"] = cpu["score_tokens_per_s"]
    else:  # scoring is compute-bound: the CPU's rate scaled by FLOP/s
        h["score_tokens_per_s"] = cpu["score_tokens_per_s"] * h["flops"] * h["utilisation"] / cpu["prefill_flops"]
    return h


def stage_seconds(h: dict, params_b: float, calls: float, prompt: int, new: int) -> float:
    """A token costs 2 x parameters FLOPs; prefill runs at the utilisation; a decode step of a
    batch is bound by reading the weights once (bytes / bandwidth) or by its FLOPs, whichever is
    slower, shared by the batch's rows."""
    n = params_b * 1e9
    flops_rate = h["flops"] * h["utilisation"]
    prefill = calls * prompt * 2 * n / flops_rate
    step = max(h["bytes_per_param"] * n / h["bandwidth"], h["batch"] * 2 * n / flops_rate)  # one batch step
    decode = calls * new * step / h["batch"]
    return prefill + decode


def plan(cpu: dict | None = None) -> dict:
    """hardware -> stage -> hours, and the cost."""
    cpu = cpu or measured()
    q, p, m = CORPUS["questions"], CORPUS["paraphrases"], CORPUS["models"]
    open_share = len(OPEN_MODELS_B) / m  # gpt-3.5-turbo's answers come from its API
    mean_b = sum(OPEN_MODELS_B) / len(OPEN_MODELS_B)
    out = {}
    for name in HARDWARE:
        h = _rates(name, cpu)
        prompt, new, tries = TOKENS["paraphrase"]
        hours = {"paraphrases": stage_seconds(h, WRITER_B, q * tries, prompt, new) / 3600}
        prompt, new, _ = TOKENS["answer"]
        hours["answers"] = stage_seconds(h, mean_b, q * p * m * open_share, prompt, new) / 3600
        prompt, new, _ = TOKENS["rot"]
        hours["rules of thumb"] = stage_seconds(h, WRITER_B, q * p * m, prompt, new) / 3600
        hours["scores"] = q * p * m * SCORE_TOKENS_PER_ANSWER / h["score_tokens_per_s"] / 3600
        total = sum(hours.values())
        out[name] = {"hours": hours, "total_hours": total, "cost": total * h["price"], "price": h["price"]}
    return out


def markdown(result: dict) -> str:
    names = list(result)
    stages = list(result[names[0]]["hours"])
    lines = ["| hours | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {s} | " + " | ".join(f"{result[n]['hours'][s]:,.1f}" for n in names) + " |" for s in stages]
    lines.append("| **total** | " + " | ".join(f"**{result[n]['total_hours']:,.1f}**" for n in names) + " |")
    lines.append("| days | " + " | ".join(f"{result[n]['total_hours'] / 24:,.1f}" for n in names) + " |")
    lines.append("| cost (USD) | " + " | ".join(f"{result[n]['cost']:,.0f} at {result[n]['price']:.2f}/h"
                                             for n in names) + " |")
    return "\n".join(lines)


def assumptions() -> str:
    return (f"Assumptions: {CORPUS['questions']:,} questions x {CORPUS['paraphrases']} paraphrases x "
            f"{CORPUS['models']} models (10 open ones of {', '.join(map(str, OPEN_MODELS_B))} B parameters, "
            f"gpt-3.5-turbo by its API); paraphrases and rules of thumb by a {WRITER_B} B model; tokens per call "
            f"(prompt, new, calls per item) {TOKENS}; the CPU host's rates measured by benchmarks/results, the "
            "accelerators' at 40% of their peak bf16 FLOP/s, decoding bound by reading the weights once a step "
            f"(batch {HARDWARE['1 x H100']['batch']} on an H100, {HARDWARE['TPU v4-32']['batch']} on the v4-32); "
            "a 30-40 B model needs two H100s' memory in bf16, counted here as one H100's time.")


USAGE = REPO_ROOT / "docs" / "usage.md"
OPEN, CLOSE = "<!-- sage_plan -->\n", "<!-- /sage_plan -->"


def _split_doc(doc: str) -> tuple[str, str, str]:
    """docs/usage.md's text -> (before the block, the block, after it); the markers stay outside."""
    head, opened, rest = doc.partition(OPEN)
    block, closed, tail = rest.partition(CLOSE)
    if not (opened and closed):
        raise SystemExit(f"error: {USAGE}: no '{OPEN.strip()}' ... '{CLOSE}' block")
    return head, block, tail


def doc_block(doc: str) -> str:
    """The text between the page's sage_plan markers."""
    return _split_doc(doc)[1]


def doc_with(doc: str, text: str) -> str:
    """The page with `text` between its sage_plan markers."""
    head, _, tail = _split_doc(doc)
    return head + OPEN + text + CLOSE + tail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", type=Path, default=None, help="write the table and its assumptions here")
    parser.add_argument("--docs", action="store_true",
                        help="rewrite the table between docs/usage.md's <!-- sage_plan --> markers")
    args = parser.parse_args(argv)
    text = markdown(plan()) + "\n\n" + assumptions() + "\n"
    print(text, end="")
    if args.markdown:
        atomic_write_bytes(args.markdown, text.encode())
    if args.docs:
        atomic_write_bytes(USAGE, doc_with(USAGE.read_text(), text).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
