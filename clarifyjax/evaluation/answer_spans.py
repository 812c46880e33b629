"""The best answer span of an extractive QA model, and AllenNLP transformer-qa's unanswerable rule
(allennlp-models `rc/models/transformer_qa.py`, `rc/models/utils.get_best_span`), as pure,
jittable array functions: `best_spans` (the rule is spelled out there). Shapes: b = batch,
s = sequence."""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


class BestSpans(NamedTuple):
    """What `best_spans` finds in each row: the span's first and last token, its score and whether
    the question is unanswerable (the span starts at CLS).

    Examples:
      >>> logits, answer_mask = jnp.array([[5.0, 1.0, 1.0, 1.0, 0.0]]), jnp.array([[0, 1, 1, 1, 0]])
      >>> spans = best_spans(logits, logits, answer_mask)  # the same start and end logits
      >>> print(spans.start, spans.end, spans.score, spans.unanswerable)  # CLS wins: unanswerable
      [0] [0] [10.] [ True]"""

    start: jax.Array  # [b] int32, position of the first token
    end: jax.Array  # [b] int32, position of the last token (inclusive)
    score: jax.Array  # [b] float32, start_logit + end_logit after masking
    unanswerable: jax.Array  # [b] bool, start == cls_index


@functools.partial(jax.jit, static_argnames="cls_index")
def best_spans(start_logits: jax.Array, end_logits: jax.Array, answer_mask: jax.Array,
               cls_index: int = 0) -> BestSpans:
    """start_logits, end_logits [b, s] float; answer_mask [b, s] (1 = a context token that may
    be part of an answer; the CLS position is always allowed) -> `BestSpans`.

    A caller with padding or question tokens leaves them out of `answer_mask`.

    The rule, as AllenNLP computes it: (1) only `answer_mask` positions and CLS may start or end a
    span, every other logit becomes the most negative float; (2) span (i, j), i <= j, scores
    start[i] + end[j], and the best is the first argmax over the flattened [s, s] matrix, row-major
    (ties go to the smaller start, then the smaller end, as torch's and jax's argmax); (3) the
    question is unanswerable when the best span *starts* at CLS (spans (CLS, j) ending in the
    context included, as AllenNLP tests `best_span[0] == cls_index`); no threshold. So CLS at
    position 0 wins every exact tie with a span starting later; with `cls_index` > 0 a CLS start
    pairs only with ends at or after it.

    Examples:
      >>> start = jnp.array([[0.0, 1.0, 3.0, 0.5, 9.0]])  # position 0 is CLS, 4 is padding
      >>> end = jnp.array([[0.0, 0.5, 1.0, 2.0, 9.0]])
      >>> spans = best_spans(start, end, jnp.array([[0, 1, 1, 1, 0]]))  # the answer mask
      >>> print(spans.start, spans.end, spans.score, spans.unanswerable)  # tokens 2..3: 3.0 + 2.0
      [2] [3] [5.] [False]"""
    s = start_logits.shape[-1]
    allowed = answer_mask.astype(bool) | (jnp.arange(s) == cls_index)[None]
    lowest = jnp.finfo(jnp.float32).min
    start = jnp.where(allowed, start_logits.astype(jnp.float32), lowest)
    end = jnp.where(allowed, end_logits.astype(jnp.float32), lowest)
    pair = start[:, :, None] + end[:, None, :]  # [b, i, j]
    upper = jnp.arange(s)[:, None] <= jnp.arange(s)[None, :]
    pair = jnp.where(upper[None], pair, -jnp.inf)
    flat = jnp.argmax(pair.reshape(pair.shape[0], s * s), axis=-1)
    best_start, best_end = (flat // s).astype(jnp.int32), (flat % s).astype(jnp.int32)
    score = (jnp.take_along_axis(start, best_start[:, None], axis=1)[:, 0]
             + jnp.take_along_axis(end, best_end[:, None], axis=1)[:, 0])
    return BestSpans(best_start, best_end, score, best_start == cls_index)
