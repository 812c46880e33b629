"""sage_jax: SaGE (Semantic Graph Entropy) moral-consistency scoring in JAX.

`metric` is the pure, jitted SaGE; `data` reads input files, `lexical` and `parascore` are the
baselines and the paraphrase filter, `scoring` and `report` score and write one model's file, `run`
and `experiments` are `sage-jax run` and `sage-jax experiment`, `cli` the command. The metric
functions, `score(questions, get_response, use_rots=True)` (the reference library's function: a
float) and `score_details` (per question; `run.library`) are re-exported lazily, so `import
sage_jax` stays cheap: `import sage_jax as sage; sage.score(...)`."""
from __future__ import annotations

_METRIC = ("sage", "sage_from_similarity", "sage_blend", "sage_chunked", "blend_similarity",
           "mean_sage", "pairwise_cosine")

__all__ = [*_METRIC, "SentenceEmbedder", "score", "score_details"]


def __getattr__(name: str):
    if name in _METRIC:
        from sage_jax import metric

        return getattr(metric, name)
    if name in ("score", "score_details"):
        from sage_jax.run import library

        return library.score_questions if name == "score" else library.score_details
    if name == "SentenceEmbedder":
        from clarifyjax.models.embedder import SentenceEmbedder

        return SentenceEmbedder
    raise AttributeError(f"module 'sage_jax' has no attribute {name!r}")
