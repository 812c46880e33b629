"""sage_jax.parascore against the formula computed with the `bert-score` package and an edit
distance written here, and the paraphrase filter's parsing and rules."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.env import require
from helpers.bert_score_package import package_score
from sage_jax.parascore import (diversity, edit_distance, filter_paraphrases, normalized_edit_distance,
                                numbered_candidates, parascore)

LAYER = 4


def levenshtein(a: str, b: str) -> int:
    """Plain dynamic programming over characters."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def formula(cands, sources, refs, folder, gamma=0.35, omega=0.05):
    f_source = package_score(cands, sources, folder, LAYER)[2].astype(np.float64)
    f_ref = package_score(cands, refs, folder, LAYER)[2].astype(np.float64)
    ds = []
    for c, s in zip(cands, sources):
        longest = max(len(c), len(s))
        ned = levenshtein(c, s) / longest if longest else 0.0
        ds.append(gamma if ned >= gamma else -1 + (1 + gamma) / gamma * ned)
    return np.maximum(f_source, f_ref) + omega * np.array(ds)


QUESTION = "Is it okay to lie to a friend to protect their feelings?"
PARAPHRASES = [
    "Is it acceptable to deceive a friend to spare their feelings?",
    "Should you lie to a friend so they are not hurt?",
    "Is it okay to lie to a friend to protect their feelings?",  # identical to the question
    "Can lying to a friend be justified to protect how they feel?",
    "Is it fine to tell a friend a lie to shield their emotions?",
    "What is the capital of France?",
    "",  # empty
    "Lie?",
    "Imagine a world in which honesty between friends sometimes wounds: would a gentle untruth that "
    "protects a friend's feelings be morally acceptable, or does friendship demand that we always "
    "tell the truth no matter how much it might hurt the people we care about most deeply?",
    "is it ok to lie to a friend to protect their feelings",
]


@pytest.mark.reference
@pytest.mark.slow  # two calls of the package on the real MiniLM
def test_parascore_equals_the_formula_with_the_package(minilm):
    """32 (source, candidate) pairs: SaGE's direction (question as candidate, paraphrase as source
    and reference), the reverse, identical strings, empty candidates and sources, long texts, and
    references that differ from the sources (the max)."""
    sources = PARAPHRASES + [QUESTION] * 10 + PARAPHRASES[:6] + ["", "same", "A long source. " * 30, ""]
    cands = [QUESTION] * 10 + PARAPHRASES + ["", "same", "Short.", "x", "", "y", "", "same",
                                             "A long candidate. " * 25, "not empty"]
    refs = PARAPHRASES + [QUESTION] * 10 + list(reversed(PARAPHRASES[:6])) + ["z", "same", "ref", "w"]
    assert len(cands) == len(sources) == len(refs) >= 30
    ours = parascore(sources, cands, refs, model=minilm, layer=LAYER)
    want = formula(cands, sources, refs, minilm)
    assert np.max(np.abs(ours - want)) <= 1e-5, np.max(np.abs(ours - want))
    assert ours[2] == pytest.approx(1.0 + 0.05 * -1.0, abs=1e-5)  # identical: F = 1, NED 0 -> DS = -1
    free = parascore(sources, cands, model=minilm, layer=LAYER)
    assert np.all(free <= ours + 1e-7) and np.any(free < ours - 1e-3)


@pytest.mark.reference
def test_edit_distance_is_levenshtein():
    nltk = require("nltk")
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = "".join(rng.choice(list("abé c"), size=rng.integers(0, 25)))
        b = "".join(rng.choice(list("abé c"), size=rng.integers(0, 25)))
        assert edit_distance(a, b) == levenshtein(a, b) == nltk.edit_distance(a, b)
    assert normalized_edit_distance("", "") == 0.0 and normalized_edit_distance("abc", "") == 1.0
    np.testing.assert_allclose(diversity(["abcd", "abcd", "abcd"], ["abcd", "abce", "wxyz"]),
                               [-1.0, -1 + 1.35 / 0.35 * 0.25, 0.35])


def test_numbered_candidates_are_anchored():
    text = ("Here are paraphrases:\n1. First one.\n 2) Second one  \n3.\nThe year 2023. Not an item\n"
            "10. Tenth\n4.No space is not an item")
    assert numbered_candidates(text) == ["First one.", "Second one", "", "Tenth"]


@pytest.mark.reference
def test_filter_drops_copies_and_duplicates_and_keeps_order(minilm):
    generation = "\n".join(f"{i}. {p}" for i, p in enumerate(PARAPHRASES, 1)) + "\n11. " + PARAPHRASES[0]
    scores = parascore(PARAPHRASES, [QUESTION] * len(PARAPHRASES), PARAPHRASES, model=minilm, layer=LAYER)
    threshold = float(np.median(scores[[0, 1, 3, 4, 5, 7, 8, 9]]))
    out = filter_paraphrases(f"  {QUESTION} ", [generation], model=minilm, layer=LAYER, threshold=threshold,
                             exclude=[PARAPHRASES[9]])
    expected = [PARAPHRASES[i] for i in (0, 1, 3, 4, 5, 7, 8) if scores[i] >= threshold]
    assert [p.text for p in out.kept] == expected and expected
    for p in out.kept:
        assert p.score == pytest.approx(scores[PARAPHRASES.index(p.text)], abs=1e-6)
    reasons = dict((t, r) for t, r in out.rejected)
    assert reasons[QUESTION] == "copy of the question" and reasons[""] == "empty"
    assert reasons[PARAPHRASES[9]] == "duplicate"
    assert [t for t, r in out.rejected if r == "duplicate"] == [PARAPHRASES[9], PARAPHRASES[0]]
    assert filter_paraphrases(QUESTION, "no numbered lines", model=minilm, layer=LAYER).kept == []


@pytest.mark.reference
def test_bad_arguments(minilm):
    with pytest.raises(ValueError, match="2 sources but 1 candidates"):
        parascore(["a", "b"], ["c"], model=minilm, layer=LAYER)
    with pytest.raises(ValueError, match=r"gamma must be a number in \(0, 1\]"):
        parascore(["a"], ["b"], model=minilm, layer=LAYER, gamma=0)
