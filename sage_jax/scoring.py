"""One model's file of answers (and rules of thumb), read, checked and scored: SaGE with the
BLEU / ROUGE-L / BERTScore baselines. `sage-jax score` and the score stage of `sage-jax run` both
score through here.

`args` is `sage-jax score`'s option namespace (or one with the same fields: text, format, columns,
edge_weights, collapse_identical, question_id_column, alpha, blend_weight, chunk_size, batch_size,
no_lexical, no_bertscore, embedder; lexical_tokenizer, "reference" when absent).
"""
from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Sequence
import sys

import numpy as np

from sage_jax import report

TEXT_FIELDS = {"answer": ("answer",), "rot": ("rot",), "blend": ("answer", "rot")}
# A question with more texts than MAX_TEXTS is almost surely a wrong --question-id-column
# (its [n, n] similarities alone would take n^2 * 4 bytes per question).
MAX_TEXTS = 1024


def _embed_all(embedder, texts: Sequence[str], batch_size: int, progress, desc: str) -> np.ndarray:
    """Embed distinct texts in one call (sorted by length across all of them); [T, d]."""
    with progress(len(texts), desc) as bar:
        return embedder.embed(texts, batch_size=batch_size, on_progress=bar.update)


def _distinct_per_row(index: np.ndarray) -> np.ndarray:
    """[batch, n] ids (-1 = none) -> [batch] number of distinct ids."""
    s = np.sort(index, axis=1)
    new = np.concatenate([s[:, :1] >= 0, (s[:, 1:] != s[:, :-1]) & (s[:, 1:] >= 0)], axis=1)
    return new.sum(axis=1)


class Loaded:
    """One input file, read and checked: everything scoring needs except the model."""

    def __init__(self, path: Path, name: str, args, questions: Sequence | None = None):
        """`questions`: the file's questions already read (`data.Question`s; the lm-eval task's
        answers, `harness_tasks.sage_moral`), else read from `path`."""
        from sage_jax import data

        self.path, self.name = path, name
        self.need = TEXT_FIELDS[args.text]
        self.questions = list(questions) if questions is not None else data.read_questions(
            path, format=args.format, columns=args.columns, need=self.need,
            weight_columns=[args.edge_weights] if args.edge_weights else None)
        big = max(self.questions, key=lambda q: q.n)
        if big.n > MAX_TEXTS:
            raise data.DataError(f"{path}:{big.lines[0]}: question {big.question_id} has {big.n} rows, more "
                                 f"than {MAX_TEXTS}; is --question-id-column {args.question_id_column!r} right?")
        self.n_max = big.n
        self.batches = {f: data.text_batch(self.questions, f, self.n_max) for f in self.need}
        self.first = self.batches[self.need[0]]
        self.mask = np.logical_and.reduce([b.mask for b in self.batches.values()])
        # Nodes keyed by text when collapsing identical texts: the reference keys them by the RoT
        # whenever RoTs are used (its use_rots graph), else by the answer.
        text = "rot" if "rot" in self.need else "answer"
        self.groups = self.batches[text].groups if args.collapse_identical else None
        self.weights = data.pair_matrix(self.questions, args.edge_weights, self.n_max) if args.edge_weights else None
        lexical_field = "rot" if args.text == "rot" else "answer"
        self.lexical_texts = [[t if ok else "" for t, ok in zip(q.texts(lexical_field), self.mask[b])]
                              for b, q in enumerate(self.questions)]


def embed_fields(item: Loaded, args, embedder_fn, progress) -> dict:
    """field -> [batch, n, d] embeddings: every distinct text of every field embedded once (answers
    and rules of thumb together), then placed per position."""
    from sage_jax import data

    texts, indices = data.shared_texts(*item.batches.values())
    vectors = _embed_all(embedder_fn(), texts, args.batch_size, progress, f"{item.name}: embed texts")
    return {f: data.gather(vectors, index) for f, index in zip(item.batches, indices)}


def _float64(x):
    return None if x is None else np.asarray(x, np.float64)


def _sage(item: Loaded, args, progress, embeddings, mask, *, groups=None, rot_embeddings=None,
          similarity=None) -> np.ndarray:
    """SaGE in float64 on the host CPU, as the reference's `entropy()` computes in Python floats
    (float32 strengths to the 10th power move a score by up to ~1.5e-6; `sage_jax.metric`)."""
    import jax

    from sage_jax import metric

    with progress(len(item.questions), f"{item.name}: SaGE") as bar, jax.enable_x64(True), \
            jax.default_device(jax.devices("cpu")[0]):
        tick = lambda done, total: bar.update(done - bar.n)  # noqa: E731
        scores = metric.sage_chunked(_float64(embeddings), mask, groups=groups, similarity=_float64(similarity),
                                     alpha=args.alpha, chunk_size=args.chunk_size, on_chunk=tick,
                                     blend_weight=args.blend_weight, rot_embeddings=_float64(rot_embeddings))
        return np.asarray(scores, np.float64)


def sage_scores(item: Loaded, args, embedder_fn, progress) -> np.ndarray:
    """Per-question SaGE of one loaded file, [batch] float64."""
    if item.weights is not None:
        return _sage(item, args, progress, None, item.mask, groups=item.groups, similarity=item.weights)
    emb = embed_fields(item, args, embedder_fn, progress)
    return _sage(item, args, progress, emb[item.need[0]], item.mask, groups=item.groups,
                 rot_embeddings=emb["rot"] if args.text == "blend" else None)


def sage_both_graphs(item: Loaded, args, embedder_fn, progress) -> dict[str, dict[str, np.ndarray]]:
    """SaGE of each text of a loaded file (answer, and rot and blend when it has RoTs) under both
    graphs, from one embedding: "distinct" (one node per position) and "text" (the reference's
    graph keyed by text: identical texts are one node, the blend's keyed by its RoT)."""
    emb = embed_fields(item, args, embedder_fn, progress)
    masks = {f: b.mask for f, b in item.batches.items()}
    keyed = {f: b.groups for f, b in item.batches.items()}
    out: dict[str, dict[str, np.ndarray]] = {"distinct": {}, "text": {}}
    for graph in out:
        for f in item.batches:
            out[graph][f] = _sage(item, args, progress, emb[f], masks[f],
                                  groups=keyed[f] if graph == "text" else None)
        if "rot" in item.batches:
            out[graph]["blend"] = _sage(item, args, progress, emb["answer"], item.mask, rot_embeddings=emb["rot"],
                                        groups=keyed["rot"] if graph == "text" else None)
    return out


def load_bertscore_model(args):
    """(model, layer) of the BERTScore baseline: --bertscore-model (default the embedder folder)
    at --bertscore-layer (default bert-score's layer for the model, else its last layer)."""
    from clarifyjax.evaluation.bertscore import default_layer, load_model
    from clarifyjax.models.embedder import default_embedder_path

    model = load_model(args.bertscore_model or args.embedder or default_embedder_path())
    layer = args.bertscore_layer
    if layer is None:
        layer = default_layer(model.name)
        layer = model.config.num_layers if layer is None else layer
    if layer > model.config.num_layers:
        raise ValueError(f"--bertscore-layer {layer}: the model has {model.config.num_layers} layers")
    return model, layer


def lexical_tokenizer(args) -> str:
    """How BLEU and ROUGE-L tokenise (`lexical.LEXICAL_TOKENIZERS`; "reference" by default)."""
    return getattr(args, "lexical_tokenizer", None) or "reference"


def warn_mostly_dropped(item: Loaded, texts) -> list[int]:
    """One warning line on stderr when some questions' texts lose most of their characters to
    the reference's tokenisation (non-Latin scripts, emoji); the indices of those questions."""
    from sage_jax import lexical

    dropped = lexical.mostly_dropped(texts)
    if dropped:
        ids = ", ".join(str(item.questions[b].question_id) for b in dropped[:5])
        print(f"sage-jax: warning: {item.name}: the reference's BLEU / ROUGE-L tokenisation drops "
              f"most characters of the texts of {len(dropped)} of {len(texts)} question(s) (e.g. "
              f"{ids}; not English?), so their BLEU and ROUGE-L say little; the unicode "
              "tokenizer reads every script (sage-jax score --lexical-tokenizer unicode, sage-jax "
              "run score.lexical_tokenizer=unicode)", file=sys.stderr, flush=True)
    return dropped


def baselines(item: Loaded, args, embedder_fn, progress) -> dict:
    """BLEU, ROUGE-L and BERTScore per question (NaN columns for the skipped ones)."""
    from sage_jax import lexical

    nan = np.full(len(item.questions), np.nan)
    out = {"bleu": nan, "rouge_l": nan, "bertscore": nan}
    texts = item.lexical_texts
    if not args.no_lexical:
        tokenizer = lexical_tokenizer(args)
        if tokenizer == "reference":
            warn_mostly_dropped(item, texts)
        with progress(len(texts), f"{item.name}: BLEU / ROUGE-L") as bar:
            bleu, rouge = np.full(len(texts), np.nan), np.full(len(texts), np.nan)
            for b, t in enumerate(texts):
                bleu[b] = lexical.bleu_consistency([t], tokenizer)[0]
                rouge[b] = lexical.rouge_l_consistency([t], tokenizer)[0]
                bar.update(1)
        out["bleu"], out["rouge_l"] = bleu, rouge
    if not args.no_bertscore:
        model, layer = args.bertscore
        with progress(len(texts), f"{item.name}: BERTScore pairs") as bar:
            def tick(done, total):
                bar.total = total
                bar.update(done - bar.n)

            out["bertscore"] = lexical.bertscore_consistency(texts, model=model, layer=layer, on_chunk=tick)
    return out


def score_loaded(item: Loaded, args, embedder_fn, progress) -> tuple[dict, dict]:
    """Score one loaded file; returns (per-question columns, summary)."""
    started = time.perf_counter()
    scores = sage_scores(item, args, embedder_fn, progress)
    sage_seconds = time.perf_counter() - started  # embedding included
    per_question = {
        "question_id": [q.question_id for q in item.questions],
        "n_texts": item.first.n_texts.tolist(),
        "n_valid": item.mask.sum(axis=1).tolist(),
        "distinct_texts": _distinct_per_row(np.where(item.mask, item.first.index, -1)).tolist(),
        "sage": scores,
        **baselines(item, args, embedder_fn, progress),
    }
    summary = {
        "model": item.name,
        "file": str(item.path),
        "text": args.text,
        "n_questions": len(item.questions),
        "empty_texts": int(sum(b.n_empty for b in item.batches.values())),
        **{key: report.statistics(per_question[key]) for key in report.METRICS},
        "sage_seconds": sage_seconds,
        "settings": {"alpha": args.alpha, "blend_weight": args.blend_weight if args.text == "blend" else None,
                     "collapse_identical": args.collapse_identical, "edge_weights": args.edge_weights,
                     "embedder": None if args.edge_weights else str(args.embedder or "all-MiniLM-L6-v2 (default)"),
                     "lexical_text": "rot" if args.text == "rot" else "answer",
                     "lexical_tokenizer": None if args.no_lexical else lexical_tokenizer(args),
                     "bertscore": None if args.no_bertscore else {
                         "model": str(args.bertscore_model or args.embedder or "all-MiniLM-L6-v2 (default)"),
                         "layer": args.bertscore[1], "idf": False, "rescaled": False}},
    }
    for key, skipped in (("bleu", args.no_lexical), ("rouge_l", args.no_lexical), ("bertscore", args.no_bertscore)):
        if skipped:
            summary.pop(key)
    return per_question, summary
