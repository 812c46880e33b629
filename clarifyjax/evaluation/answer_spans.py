"""The best answer span of an extractive QA model, and AllenNLP transformer-qa's unanswerable
rule (allennlp-models `rc/models/transformer_qa.py` with `rc/models/utils.get_best_span`), as
pure, jittable array functions.

The rule, as AllenNLP computes it:
1. Only positions in `answer_mask` (the context tokens) and the CLS position may start or end a
   span; every other logit is replaced by the most negative float.
2. A span (i, j) scores start[i] + end[j]; only i <= j is allowed. The best span is the argmax
   over the flattened [s, s] matrix, row-major: on a tie the span with the smaller start wins,
   then the smaller end (torch's and jax's argmax both return the first maximum).
3. The question is unanswerable when the best span *starts* at CLS. Spans (CLS, j) that end in
   the context are allowed and, when best, also mean "no answer" (AllenNLP tests
   `best_span[0] == cls_index`). No threshold.

Consequences, documented and tested: CLS wins every exact tie with a span starting later (it
comes first in row-major order when at position 0); with `cls_index` > 0 a CLS start can only pair
with ends at or after it, and ties go to earlier starts.

Shapes: b = batch, s = sequence.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


class BestSpans(NamedTuple):
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
    """
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
