"""sage_jax: SaGE (Semantic Graph Entropy) moral-consistency scoring in JAX.

  metric    pure, jitted SaGE over [batch, n, d] embeddings or [batch, n, n] similarities (jax only)
  embed     sentence embedder on clarifyjax.models.encoder (sentence-transformers folders)
  lexical   pairwise BLEU / ROUGE-L / BERTScore consistency baselines (clarifyjax.evaluation.bertscore)
  parascore ParaScore (the toolkit's) and the paraphrase filter
  data      long / pairs files (read by clarifyjax.files.tables) -> questions -> padded [batch, n]
            batches
  report    per-question CSV, summary JSON, table, PNG; the output folder, replaced as a whole
  scoring   one model's file scored (SaGE and the baselines), for `score` and `run` alike
  prompts   the `code` and `paper` presets of `sage-jax run` (the reference's prompts, fixed)
  generators  OpenAI-compatible endpoints and recorded files as clarifyjax.text.generator generators
  run_config, stages, pipeline, run_report   `sage-jax run`: config, resumable stages, report
  cli       `sage-jax score ...`, `sage-jax run ...`

The metric functions are re-exported here lazily, so `import sage_jax` stays cheap.
"""
from __future__ import annotations

_METRIC = ("sage", "sage_from_similarity", "sage_blend", "sage_chunked", "blend_similarity",
           "mean_sage", "pairwise_cosine")

__all__ = list(_METRIC)


def __getattr__(name: str):
    if name in _METRIC:
        from sage_jax import metric

        return getattr(metric, name)
    raise AttributeError(f"module 'sage_jax' has no attribute {name!r}")
