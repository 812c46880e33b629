"""Defeasibility reward throughput: our `RewardPipeline` vs the original's method, same weights.

Random t5-small-sized judge, answerer and fusion and a 6-layer RoBERTa NLI filter, on the first
`--situations` rows of δ-CLARIFY dev.tsv; `OriginalReward` says how the original runs and
`stage_bound` how the bound is priced. Writes benchmarks/results/reward.json (--name).

    python benchmarks/reward.py                 # the full run (minutes on a CPU)
    python benchmarks/reward.py --quick         # tiny sizes, seconds: checks that it runs
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import tempfile
import time
from pathlib import Path
from collections.abc import Iterator

from _common import REPO_ROOT, timeit, write_results

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from flax import nnx  # noqa: E402

from clarifyjax.reward import judge  # noqa: E402
from clarifyjax.decoding import seq2seq  # noqa: E402
from clarifyjax.text import formats  # noqa: E402
from clarifyjax.reward.judge import DELPHI_CLASS_STEP, Judge  # noqa: E402
from clarifyjax.decoding.seq2seq import Seq2SeqModel  # noqa: E402
from clarifyjax.text.generator import Sampling  # noqa: E402
from clarifyjax.models.tiny import (WANLI_LABELS, save_classifier_folder,  # noqa: E402
                                    save_t5_folder, tiny_bpe_tokenizer, tiny_spm_folder,
                                    tiny_t5_config)
from clarifyjax.reward.nli import NLIFilter  # noqa: E402
from clarifyjax.reward.pipeline import PipelineConfig, RewardPipeline  # noqa: E402

DEV = REPO_ROOT.parent / "shared" / "data" / "delta-clarify" / "dev.tsv"


def add_model_size_args(p: argparse.ArgumentParser) -> None:
    """The sizes of the random reward models (T5s and the NLI encoder) and their output lengths,
    shared with benchmarks/evaluate.py."""
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32128)
    p.add_argument("--nli-hidden", type=int, default=768)
    p.add_argument("--nli-layers", type=int, default=6)
    p.add_argument("--nli-heads", type=int, default=12)
    p.add_argument("--answer-max-length", type=int, default=32)
    p.add_argument("--fusion-max-length", type=int, default=64)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--situations", type=int, default=64)
    add_model_size_args(p)
    p.add_argument("--judgment-max-length", type=int, default=32,
                   help="ours: tokens of the judgment text (Delphi's are ~15 with the class)")
    p.add_argument("--reference-judgment-tokens", type=int, default=200,
                   help="the original's judgment generation limit (max_length=200)")
    p.add_argument("--reference-judge-tokens", type=int, default=200,
                   help="tokens the original generates per judged situation (read at step 4)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--reference-repeats", type=int, default=1)
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes (d_model 64, 2 layers, vocab 2048, 16 situations, "
                        "reference judge 40 tokens): checks that the script runs")
    p.add_argument("--name", default="reward", help="results/<name>.json")
    args = p.parse_args()
    if args.quick:
        args.situations, args.d_model, args.d_ff, args.layers, args.heads = 16, 64, 256, 2, 4
        args.vocab, args.nli_hidden, args.nli_layers, args.nli_heads = 2048, 64, 2, 4
        args.answer_max_length, args.fusion_max_length, args.judgment_max_length = 12, 16, 12
        args.reference_judgment_tokens = args.reference_judge_tokens = 40
        args.repeats = 2
        args.name = args.name if args.name != "reward" else "reward_quick"
    return args


def dev_rows(n: int) -> tuple[list[str], list[str]]:
    with open(DEV, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:n]
    if len(rows) < n:
        raise SystemExit(f"{DEV} has only {len(rows)} rows")
    return [r["situation"] for r in rows], [r["question"] for r in rows]


def build_folders(root: Path, args) -> dict[str, Path]:
    spm = tiny_spm_folder(root, vocab_size=2000)
    config = tiny_t5_config("v1.0", vocab_size=args.vocab, d_model=args.d_model,
                            d_kv=args.d_model // args.heads, d_ff=args.d_ff,
                            num_layers=args.layers, num_decoder_layers=args.layers,
                            num_heads=args.heads, relative_attention_num_buckets=32,
                            relative_attention_max_distance=128)
    folders = {}
    for seed, name in enumerate(("answerer", "fusion", "judge")):
        folders[name] = root / name
        folders[name].mkdir()
        save_t5_folder(folders[name], config, seed, spm)
    folders["nli"] = root / "nli"
    folders["nli"].mkdir()
    save_classifier_folder(folders["nli"], WANLI_LABELS, model_type="roberta", seed=3,
                           hidden_size=args.nli_hidden, num_layers=args.nli_layers,
                           num_heads=args.nli_heads, intermediate_size=4 * args.nli_hidden,
                           weight_std=None, tokenizer=tiny_bpe_tokenizer("roberta"))
    return folders


class OriginalReward:
    """The original's reward (allenai/clarifydelphi Code/reward.py + Code/model/delphi.py) in
    PyTorch transformers on our weights: the judgment text by HF `generate` of the judge (max 200
    tokens), weakener + strengthener answers by one `generate` of 2b rows, NLI one pair at a time,
    fusion by two `generate` calls of b rows, the judge by `generate` of
    `--reference-judge-tokens` tokens per updated situation, reading the softmax at the class step
    (`score_batch`), then numpy JSD. Answers and fusion decode greedily with our length limits, so
    both sides generate the same tokens (the agreement is reported); random weights rarely write
    EOS, so each generation runs to its limit on both sides (trained models stop earlier).

    The models: t5-small-sized v1.0 T5s over a 2,000-piece SentencePiece vocabulary trained on
    δ-CLARIFY (Delphi-like: "<class>" is `▁ <unk> class >`); the NLI filter has WaNLI's labels."""

    def __init__(self, folders: dict[str, Path], args):
        load = transformers.T5ForConditionalGeneration.from_pretrained
        self.answerer = load(str(folders["answerer"])).eval()
        self.fusion = load(str(folders["fusion"])).eval()
        self.judge = load(str(folders["judge"])).eval()
        self.tok = transformers.T5TokenizerFast.from_pretrained(str(folders["judge"]), extra_ids=0)
        self.nli = transformers.RobertaForSequenceClassification.from_pretrained(
            str(folders["nli"])).eval()
        from tokenizers import Tokenizer

        self.nli_tok = Tokenizer.from_file(str(folders["nli"] / "tokenizer.json"))
        self.nli_tok.enable_truncation(128)
        self.class_ids = self.tok.convert_tokens_to_ids(["-1", "0", "1"])  # bad, ok, good
        self.args = args
        self.timings: dict[str, float] = {}

    def _generate(self, model, texts, **kwargs):
        enc = self.tok(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            return model.generate(**enc, do_sample=False, **kwargs)

    def _timed(self, name, fn, *a, **k):
        t0 = time.perf_counter()
        out = fn(*a, **k)
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
        return out

    def score_batch(self, texts: list[str]) -> np.ndarray:
        """DelphiScorer.score_batch: generate, softmax at the class step, columns -> [n, 3]."""
        n = self.args.reference_judge_tokens
        out = self._generate(self.judge, ["[moral_single]: " + t for t in texts],
                             max_new_tokens=n, min_new_tokens=n, output_scores=True,
                             return_dict_in_generate=True)
        probs = out["scores"][DELPHI_CLASS_STEP].softmax(-1)[:, self.class_ids].numpy()
        return probs / probs.sum(-1, keepdims=True)

    def judgments(self, situations: list[str]) -> list[str]:
        """DelphiScorer.generate_batch (its text split replaced by our tolerant parser)."""
        seq = self._generate(self.judge, ["[moral_single]: " + s for s in situations],
                             max_new_tokens=self.args.reference_judgment_tokens)
        return [formats.parse_delphi_output(t, keep_unparsed=True)[1]
                for t in self.tok.batch_decode(seq, skip_special_tokens=True)]

    def __call__(self, situations: list[str], questions: list[str]):
        self.timings = {}
        judgments = self._timed("judgment", self.judgments, situations)
        inputs, premises = [], []
        for jud, sit, q in zip(judgments, situations, questions):  # as the original interleaves
            for kind in formats.UPDATE_TYPES:
                inputs.append(formats.answer_input(sit, q, kind, jud))
                premises.append(sit)
        seq = self._timed("answers", self._generate, self.answerer, inputs,
                          max_new_tokens=self.args.answer_max_length)
        answers = self.tok.batch_decode(seq, skip_special_tokens=True)
        kept = []
        t0 = time.perf_counter()
        for sit, answer in zip(premises, answers):  # one pair at a time, as the original
            enc = self.nli_tok.encode(sit, answer)
            with torch.no_grad():
                logits = self.nli(input_ids=torch.tensor([enc.ids]),
                                  attention_mask=torch.tensor([enc.attention_mask])).logits
            label = self.nli.config.id2label[int(logits.softmax(-1).argmax())]
            kept.append(answer if label not in ("contradiction", "entailment") else " ")
        self.timings["nli"] = time.perf_counter() - t0
        weak, strong = kept[0::2], kept[1::2]
        fused = []
        for part in (weak, strong):  # predict_merge, once per update type
            merge = [formats.fusion_input(s, q, a.strip()) for s, q, a in
                     zip(situations, questions, part)]
            seq = self._timed("fusion", self._generate, self.fusion, merge,
                              max_new_tokens=self.args.fusion_max_length)
            fused.append(self.tok.batch_decode(seq, skip_special_tokens=True))
        p_weak = self._timed("judge", self.score_batch, [f or "." for f in fused[0]])
        p_strong = self._timed("judge", self.score_batch, [f or "." for f in fused[1]])
        m = (p_weak + p_strong) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = lambda p: np.where(p > 0, p * np.log(p / m), 0.0).sum(-1)  # noqa: E731
        jsd = (kl(p_weak) + kl(p_strong)) / 2 / np.log(2)
        return jsd, [a for a in answers[0::2]], fused


# --------------------------------------------------------------------------- throughput bound

STAGES = ("judgment", "answers", "fusion", "judge")


@contextlib.contextmanager
def recording_shapes(pipeline: RewardPipeline) -> Iterator[list[dict]]:
    """Inside the block, every T5 call of `pipeline` appends what ran to the yielded list: stage,
    config, rows (padded), source_length (bucketed), decoder_positions per row, the rows of each
    decoder matmul (`decoding.generate`: the decode steps actually run, one row each; the judge's
    teacher-forced pass: its t positions at once, rows * t) and lm_head_positions per row."""
    calls: list[dict] = []
    stage = [None]
    real_stage, real_generate = pipeline._stage, seq2seq.generate  # every T5's decoding
    real_class_probabilities = judge._class_probabilities

    def staged(name, fn, *args, **kwargs):
        stage[0] = name
        return real_stage(name, fn, *args, **kwargs)

    def generate(model, input_ids, attention_mask, **kwargs):
        out = real_generate(model, input_ids, attention_mask, **kwargs)
        rows, source_length = np.shape(input_ids)
        steps = int(np.asarray(out.mask).sum(axis=1).max())  # the loop stops when all are done
        calls.append(dict(stage=stage[0], config=model.config, rows=rows,
                          source_length=source_length, decoder_positions=steps,
                          max_new_tokens=int(kwargs["max_new_tokens"]), decoder_rows=rows,
                          lm_head_positions=steps))
        return out

    def class_probabilities(graphdef, state, input_ids, attention_mask, decoder_ids, class_ids):
        rows, source_length = np.shape(input_ids)
        t = int(np.shape(decoder_ids)[0])
        calls.append(dict(stage=stage[0], config=nnx.merge(graphdef, state).config, rows=rows,
                          source_length=source_length, decoder_positions=t,
                          decoder_rows=rows * t, lm_head_positions=1))  # logits at the last
        return real_class_probabilities(graphdef, state, input_ids, attention_mask, decoder_ids,
                                        class_ids)

    pipeline._stage = staged
    seq2seq.generate, judge._class_probabilities = generate, class_probabilities
    try:
        yield calls
    finally:
        del pipeline._stage
        seq2seq.generate, judge._class_probabilities = real_generate, real_class_probabilities


def t5_call_flops(call: dict) -> dict[str, tuple[float, tuple[int, int, int]]]:
    """{kind: (matmul FLOPs, the [rows, k] @ [k, n] shape whose rate prices them)} of one
    recorded T5 call (2 FLOPs per multiply-add)."""
    c = call["config"]
    m, h, d, f, vocab = c.d_model, c.num_heads, c.d_kv, c.d_ff, c.vocab_size
    inner, enc_layers, dec_layers = h * d, c.num_layers, c.num_decoder_layers
    ffn_in = (2 if c.is_gated_act else 1) * m * f  # gated: wi_0 and wi_1
    rows, s, n = call["rows"], call["source_length"], call["decoder_positions"]
    tokens = rows * s
    encoder = enc_layers * (tokens * (4 * m * inner + ffn_in + f * m)  # q, k, v, o; wi, wo
                            + rows * 2 * h * d * s * s)                 # QK^T, PV
    encoder += dec_layers * tokens * 2 * m * inner                     # cross-attention K, V
    positions = rows * n  # decoded (row, position) pairs
    attention = dec_layers * (positions * 6 * m * inner  # self q, k, v, o; cross q, o
                              + rows * 2 * h * d * (n * (n + 1) // 2 + n * s))  # products
    r = call["decoder_rows"]
    return {"encoder": (2.0 * encoder, (tokens, m, f)),
            "decoder_attention": (2.0 * attention, (r, m, inner)),
            "decoder_ffn_in": (2.0 * dec_layers * positions * ffn_in, (r, m, f)),
            "decoder_ffn_out": (2.0 * dec_layers * positions * f * m, (r, f, m)),
            "lm_head": (2.0 * rows * call["lm_head_positions"] * m * vocab, (rows, m, vocab))}


def matmul_flops_per_s(shape: tuple[int, int, int], repeats: int = 5) -> float:
    """Best-of-`repeats` float32 rate of a jitted [rows, k] @ [k, n] on this backend."""
    rows, k, n = shape
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((rows, k), np.float32))
    b = jnp.asarray(rng.standard_normal((k, n), np.float32))
    matmul = jax.jit(jnp.matmul)
    t = timeit(lambda: matmul(a, b).block_until_ready(), repeats=repeats, warmup=2)
    return 2.0 * rows * k * n / t["best_s"]


def stage_bound(calls: list[dict], stage_s: dict[str, float], original_best_s: float, *,
                peak_size: int = 2048) -> dict:
    """The throughput bound, from `recording_shapes` calls, our measured seconds per stage and
    the original's best pipeline seconds.

    Random weights never write EOS, so answers and fusion decode every row to its limit on both
    sides: the same work however it is done. The shapes each of our stages ran (padded rows R,
    bucketed source length S, decoder positions) give its matmul FLOPs, 2 per multiply-add
    (`t5_call_flops`; norms, softmaxes and embeddings not counted). Jitted float32 matmuls timed
    in the same run give this CPU's rate at each shape, and the peak: the best of those and a
    `peak_size`^3 matmul. A stage's minimum time is its FLOPs at its shapes' rates, or at the
    peak. The original's time over the sum of the four minimums is the largest ratio this work
    allows here; over answers + fusion alone at the peak, the largest any implementation allows,
    even one whose judgment and judge are free. `bound_over_measured`: the share of the bound a
    stage of ours reaches."""
    rates: dict[tuple[int, int, int], float] = {}

    def rate(shape):
        if shape not in rates:
            rates[shape] = matmul_flops_per_s(shape)
        return rates[shape]

    square = matmul_flops_per_s((peak_size,) * 3)
    stages = {}
    for name in STAGES:
        mine = [c for c in calls if c["stage"] == name]
        flops: dict[str, float] = {}
        seconds = 0.0
        for call in mine:
            for kind, (kind_flops, shape) in t5_call_flops(call).items():
                flops[kind] = flops.get(kind, 0.0) + kind_flops
                seconds += kind_flops / rate(shape)
        stages[name] = {
            "calls": [{k: v for k, v in c.items() if k not in ("stage", "config")} for c in mine],
            "gflop": sum(flops.values()) / 1e9,
            "gflop_by_kind": {k: v / 1e9 for k, v in flops.items()},
            "min_s_at_shape_rates": seconds,
            "measured_s": stage_s.get(name, 0.0),
            "bound_over_measured": seconds / stage_s[name] if stage_s.get(name) else None}
    peak = max([square, *rates.values()])  # a bound only if no shape ran faster
    for s in stages.values():
        s["min_s_at_peak"] = s["gflop"] * 1e9 / peak
    min_shapes = sum(s["min_s_at_shape_rates"] for s in stages.values())
    min_peak = sum(s["min_s_at_peak"] for s in stages.values())
    decode_peak = stages["answers"]["min_s_at_peak"] + stages["fusion"]["min_s_at_peak"]
    measured = sum(s["measured_s"] for s in stages.values())
    return {
        "peak_gflop_per_s": peak / 1e9, "square_gflop_per_s": square / 1e9,
        "square_shape": [peak_size] * 3,
        "gflop_per_s_by_shape": {f"[{r},{k}]@[{k},{n}]": v / 1e9
                                 for (r, k, n), v in rates.items()},
        "stages": stages,
        "gflop": sum(s["gflop"] for s in stages.values()),
        "ours_min_s_at_shape_rates": min_shapes, "ours_min_s_at_peak": min_peak,
        "ours_stages_measured_s": measured,
        "bound_over_measured": min_shapes / measured if measured else None,
        "answers_fusion_min_s_at_peak": decode_peak,
        "max_ratio_answers_fusion_at_peak": original_best_s / decode_peak,
        "max_ratio_all_stages_at_shape_rates": original_best_s / min_shapes,
    }


def build_ours(folders: dict[str, Path], args) -> RewardPipeline:
    """Our `RewardPipeline` over the saved folders (answer and fusion batches padded to a
    multiple of 8): jitted stages, one batch per stage, a teacher-forced judge that also judges
    the b base situations (for Table 4)."""
    config = PipelineConfig(answer_max_length=args.answer_max_length,
                            fusion_max_length=args.fusion_max_length,
                            judgment_max_length=args.judgment_max_length)
    multiple = 8
    return RewardPipeline(
        Seq2SeqModel.from_pretrained(folders["answerer"], batch_multiple=multiple),
        Seq2SeqModel.from_pretrained(folders["fusion"], batch_multiple=multiple),
        Judge.from_pretrained(folders["judge"], class_step=DELPHI_CLASS_STEP,
                              judgment=Sampling(max_new_tokens=args.judgment_max_length)),
        NLIFilter.from_pretrained(folders["nli"], batch_size=2 * args.situations), config)


def print_summary(results: dict, b: int) -> None:
    pipeline, alone = results["pipeline"], results["judge_alone"]
    ours_t, ref_t, bound = pipeline["ours"], pipeline["original"], pipeline["bound"]
    ratio, judge_ratio = pipeline["ratio"], alone["ratio"]
    print(f"pipeline: ours {b / ours_t['best_s']:.2f} situations/s, original "
          f"{b / ref_t['best_s']:.2f}/s -> {ratio:.1f}x (target >= 10x)")
    print(f"bound: {bound['gflop']:.0f} GFLOP, at least {bound['ours_min_s_at_shape_rates']:.2f} s "
          f"at this CPU's rates for the shapes (peak {bound['peak_gflop_per_s']:.0f} GFLOP/s: "
          f"{bound['ours_min_s_at_peak']:.2f} s); our stages reach "
          f"{bound['bound_over_measured']:.2f} of it; this work at these shapes allows <= "
          f"{bound['max_ratio_all_stages_at_shape_rates']:.1f}x the original, any implementation "
          f"<= {bound['max_ratio_answers_fusion_at_peak']:.1f}x (answers + fusion at the peak)")
    print(f"judge alone: ours {2 * b / alone['ours']['best_s']:.1f} texts/s, original "
          f"{2 * b / alone['original']['best_s']:.1f}/s -> {judge_ratio:.1f}x (target >= 20x)")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(os.cpu_count())
    situations, questions = dev_rows(args.situations)
    b = args.situations
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folders = build_folders(Path(tmp), args)
        build_s = time.perf_counter() - t0

        ours = build_ours(folders, args)
        reference = OriginalReward(folders, args)

        t0 = time.perf_counter()
        with recording_shapes(ours) as calls:  # the shapes of the bound, at no extra call
            out = ours(situations, questions, rng=0)  # compiles every stage
        compile_s = time.perf_counter() - t0
        ours_t = timeit(lambda: ours(situations, questions, rng=0), repeats=args.repeats,
                        warmup=0)
        ours_stages = dict(ours.timings)
        ref_t = timeit(lambda: reference(situations, questions), repeats=args.reference_repeats,
                       warmup=0)
        ref_stages = dict(reference.timings)
        _, ref_answers, ref_fused = reference(situations, questions)

        judge_texts = situations + [f"{s} {q}" for s, q in zip(situations, questions)]
        ours.judge.class_probabilities(judge_texts)  # compile
        judge_ours = timeit(lambda: ours.judge.class_probabilities(judge_texts),
                            repeats=args.repeats, warmup=0)
        judge_ref = timeit(lambda: [reference.score_batch(judge_texts[:b]),
                                    reference.score_batch(judge_texts[b:])],
                           repeats=args.reference_repeats, warmup=0)

    bound = stage_bound(calls, ours_stages, ref_t["best_s"])
    ratio = ref_t["best_s"] / ours_t["best_s"]
    judge_ratio = judge_ref["best_s"] / judge_ours["best_s"]
    results = {
        "settings": {k: v for k, v in vars(args).items() if k != "name"},
        "torch_threads": torch.get_num_threads(),
        "build_models_s": build_s,
        "pipeline": {
            "ours": {**ours_t, "situations_per_s": b / ours_t["best_s"],
                     "first_call_with_compile_s": compile_s, "stage_s": ours_stages,
                     "traces": dict(ours.traces)},
            "original": {**ref_t, "situations_per_s": b / ref_t["best_s"],
                         "stage_s": ref_stages},
            "ratio": ratio, "target": 10.0, "meets_target": ratio >= 10.0,
            "agreement": {
                "weak_answers": float(np.mean([" ".join(a.split()) == o for a, o in
                                               zip(ref_answers, out.weak_answers)])),
                "weak_fused": float(np.mean([" ".join(a.split()) == o for a, o in
                                             zip(ref_fused[0], out.weak_situations)]))},
            "counts": out.counts,
            "bound": bound,
        },
        "judge_alone": {
            "texts": 2 * b,
            "ours": {**judge_ours, "texts_per_s": 2 * b / judge_ours["best_s"]},
            "original": {**judge_ref, "texts_per_s": 2 * b / judge_ref["best_s"]},
            "ratio": judge_ratio, "target": 20.0, "meets_target": judge_ratio >= 20.0},
    }
    write_results(args.name, results)
    print_summary(results, b)


if __name__ == "__main__":
    main()
