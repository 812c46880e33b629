"""Decoding: jitted generation and scoring for T5 and causal LMs (`generate`, `score`), the
seq2seq runner (`seq2seq.Seq2SeqModel`) and a causal LM folder as a text generator
(`local_lm.LocalLM`).

Modules: `api` (`generate`, `score`: check the arguments, dispatch on the model's family),
`t5_loop` and `causal_loop` (one jitted generation loop per family), `scoring` (one jitted
teacher-forced scorer per family), `step` (what the loops share: `Generation`, the settings, one
step's choice), `sampling` (`filter_logits`, `sample_categorical`, per-row `choose_rows`).
"""
from __future__ import annotations

from clarifyjax.decoding.api import generate, score
from clarifyjax.decoding.sampling import (
    SAMPLE_BLOCK,
    TOP_P_CANDIDATES,
    filter_logits,
    sample_categorical,
)
from clarifyjax.decoding.step import Generation

__all__ = [  # the package's public API
    "SAMPLE_BLOCK",
    "TOP_P_CANDIDATES",
    "Generation",
    "filter_logits",
    "generate",
    "sample_categorical",
    "score",
]
