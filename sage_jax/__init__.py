"""sage_jax: SaGE (Semantic Graph Entropy) moral-consistency scoring in JAX.

  metric    pure, jitted SaGE over [batch, n, d] embeddings or [batch, n, n] similarities (jax only)
  SentenceEmbedder  the sentence embedder (clarifyjax.models.embedder), re-exported here
  lexical   pairwise BLEU / ROUGE-L / BERTScore consistency baselines (clarifyjax.evaluation.bertscore)
  parascore ParaScore (the toolkit's) and the paraphrase filter
  data      long / pairs files (read by clarifyjax.files.tables) -> questions -> padded [batch, n]
            batches
  report    per-question CSV, summary JSON, table, PNG; the output folder, replaced as a whole
  scoring   one model's file scored (SaGE and the baselines), for `score` and `run` alike
  run       `sage-jax run`: its config, presets and prompts, generators, resumable stages, the
            pipeline and its report
  experiments  `sage-jax experiment`: the SaGE paper's experiments (Tables 1-4, Figures 3-4) as configs
  cli       `sage-jax score ...`, `sage-jax run ...`, `sage-jax experiment ...`

The metric functions are re-exported here lazily, so `import sage_jax` stays cheap, and so is
`score(questions, get_response, use_rots=True)`, the reference library's function
(sage_jax.run.library): `import sage_jax as sage; sage.score(...)`.
"""
from __future__ import annotations

_METRIC = ("sage", "sage_from_similarity", "sage_blend", "sage_chunked", "blend_similarity",
           "mean_sage", "pairwise_cosine")

__all__ = [*_METRIC, "SentenceEmbedder", "score"]


def __getattr__(name: str):
    if name in _METRIC:
        from sage_jax import metric

        return getattr(metric, name)
    if name == "score":
        from sage_jax.run.library import score_questions

        return score_questions
    if name == "SentenceEmbedder":
        from clarifyjax.models.embedder import SentenceEmbedder

        return SentenceEmbedder
    raise AttributeError(f"module 'sage_jax' has no attribute {name!r}")
