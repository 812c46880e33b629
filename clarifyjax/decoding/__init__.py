"""Decoding: jitted generation and scoring for T5 and causal LMs (`generate`, `score`), the
seq2seq runner (`seq2seq.Seq2SeqModel`) and a causal LM folder as a text generator
(`local_lm.LocalLM`)."""
from __future__ import annotations

from clarifyjax.decoding.api import (  # noqa: F401  (the package's public API)
    Generation, TOP_P_CANDIDATES, filter_logits, SAMPLE_BLOCK, sample_categorical, generate,
    score,
)

__all__ = [
    "Generation", "TOP_P_CANDIDATES", "filter_logits", "SAMPLE_BLOCK", "sample_categorical", "generate",
    "score",
]
