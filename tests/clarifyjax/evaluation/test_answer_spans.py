"""The unanswerable rule (AllenNLP transformer-qa) on hand-built logits.

Reference: a plain-Python transcription of allennlp-models' `get_best_span` after transformer-qa's
masking (context tokens and CLS allowed; spans i <= j; first maximum in row-major order;
unanswerable when the best span starts at CLS). Edge cases each get a hand-built batch row.
"""
from __future__ import annotations

import numpy as np
import pytest

from clarifyjax.evaluation.answer_spans import best_spans

NEG = -1e4


def reference(start, end, mask, cls_index=0):
    """(start, end, unanswerable) by enumerating every allowed span, first maximum kept."""
    allowed = [bool(m) or i == cls_index for i, m in enumerate(mask)]
    best, best_score = None, -np.inf
    for i in range(len(start)):
        for j in range(i, len(start)):
            if allowed[i] and allowed[j] and start[i] + end[j] > best_score:
                best, best_score = (i, j), start[i] + end[j]
    return best[0], best[1], best[0] == cls_index


def run(rows, cls_index=0):
    start, end, mask = (np.array([r[k] for r in rows], np.float32) for k in range(3))
    out = best_spans(start, end, mask, cls_index)
    return [(int(a), int(b), bool(u)) for a, b, u in zip(out.start, out.end, out.unanswerable)]


# position 0 is CLS; 1-2 the question (masked out); 3-6 the context; 7 padding
MASK = [0, 0, 0, 1, 1, 1, 1, 0]


def row(start, end):
    return (start, end, MASK)


CASES = {
    # CLS start and end clearly best: no answer.
    "cls_best": (row([5, 0, 0, 1, 0, 0, 0, 0], [5, 0, 0, 0, 1, 0, 0, 0]), (0, 0, True)),
    # a context span beats CLS: (3, 4) scores 4 + 3 = 7 > 2 + 2.
    "context_best": (row([2, 0, 0, 4, 0, 0, 0, 0], [2, 0, 0, 0, 3, 0, 0, 0]), (3, 4, False)),
    # an exact tie between (0, 0) = 2 + 4 and (3, 4) = 3 + 3 (with (0, 4) = 5 below both): CLS
    # comes first in row-major order and wins.
    "tie_goes_to_cls": (row([2, 0, 0, 3, 0, 0, 0, 0], [4, 0, 0, 0, 3, 0, 0, 0]), (0, 0, True)),
    # a span from CLS into the context, (0, 5) = 3 + 5, beats (0, 0) = 3 + 1 and every span
    # starting in the context, (3, 5) = 2 + 5: it starts at CLS, so no answer.
    "cls_to_context_is_no_answer": (row([3, 0, 0, 2, 0, 0, 0, 0], [1, 0, 0, 0, 0, 5, 0, 0]),
                                    (0, 5, True)),
    # question tokens and padding have the largest logits but are never chosen.
    "masked_positions_never_win": (row([0, 9, 9, 1, 0, 0, 0, 9], [0, 9, 9, 0, 1, 0, 0, 9]),
                                   (3, 4, False)),
    # the best start (6) lies after the best end (3): only i <= j counts, (3, 3) = 1 + 4 wins.
    "end_before_start_is_not_a_span": (row([0, 0, 0, 1, 0, 0, 5, 0], [0, 0, 0, 4, 0, 0, 0, 0]),
                                       (3, 3, False)),
    # two context spans tie: the earlier start wins, then the earlier end.
    "context_tie_earlier_wins": (row([NEG, 0, 0, 2, 2, 0, 0, 0], [NEG, 0, 0, 0, 3, 3, 0, 0]),
                                 (3, 4, False)),
    # CLS below every context span by a hair: answered.
    "cls_just_below": (row([2.9999, 0, 0, 3, 0, 0, 0, 0], [3, 0, 0, 0, 3, 0, 0, 0]),
                       (3, 4, False)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_built_cases(name):
    case, expected = CASES[name]
    assert run([case]) == [expected]
    assert reference(*case) == expected


def test_cls_is_chosen_exactly_when_the_best_span_score_is_at_cls():
    """Random logits (with many exact ties: small integers), against the enumeration, and the
    statement itself: unanswerable iff max over spans starting at CLS >= max over the others."""
    rng = np.random.RandomState(0)
    rows = []
    for _ in range(300):
        mask = (rng.rand(8) < 0.6).astype(np.float32)
        mask[0] = 0
        rows.append((rng.randint(-3, 4, 8).astype(np.float32),
                     rng.randint(-3, 4, 8).astype(np.float32), mask))
    got = run(rows)
    assert got == [reference(*r) for r in rows]
    for (start, end, mask), (_, _, unanswerable) in zip(rows, got):
        allowed = (mask > 0) | (np.arange(8) == 0)
        at_cls = start[0] + max(end[j] for j in range(8) if allowed[j])
        others = [start[i] + end[j] for i in range(1, 8) for j in range(i, 8)
                  if allowed[i] and allowed[j]]
        assert unanswerable == (not others or at_cls >= max(others))
    assert 0 < sum(u for _, _, u in got) < len(got)  # both outcomes occur


def test_cls_at_another_position():
    """XLNet-style CLS at the end: a CLS start can only pair with an end at CLS."""
    mask = [1, 1, 1, 0]
    rows = [([0, 0, 0, 2], [0, 5, 0, 2], mask), ([0, 0, 0, 2], [0, 1, 0, 2], mask)]
    assert run(rows, cls_index=3) == [(0, 1, False), (3, 3, True)]
    assert [reference(*r, cls_index=3) for r in rows] == [(0, 1, False), (3, 3, True)]


def test_jits_and_scores():
    import jax

    start = np.array([[1.0, 0.0, 2.0]], np.float32)
    end = np.array([[0.0, 0.5, 1.0]], np.float32)
    out = jax.jit(best_spans)(start, end, np.array([[0, 1, 1]]))
    assert (int(out.start[0]), int(out.end[0]), float(out.score[0])) == (2, 2, 3.0)
