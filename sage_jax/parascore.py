"""ParaScore, as the ParaScore toolkit computes it (the formula is above `parascore`), and the
paraphrase filter of SaGE's pipeline.

SaGE calls it with bert-base-uncased (BERTScore's default layer 9), the question as the candidate
and the paraphrase as both source and reference: F1(question, paraphrase) + omega * DS.
`filter_paraphrases` does that for an LLM's numbered output, with the reference's bugs fixed."""
from __future__ import annotations

import re
from typing import NamedTuple
from collections.abc import Sequence

import numpy as np

from clarifyjax.evaluation.bertscore import bertscore
from clarifyjax.files.textfiles import check_texts

GAMMA = 0.35
OMEGA = 0.05
THRESHOLD = 0.6  # the reference code's (the paper says > 0.8)
# A numbered line: "3. text" or "3) text" at the start of a line (the reference's unanchored
# r"\d+\.\s(.+)" also cut "in 2023. Then ..." out of the middle of a line).
NUMBERED_LINE = re.compile(r"^[ \t]*\d+[.)](?:[ \t]+(.*))?$", re.MULTILINE)
# The reference's own pattern (generate_paraphrases.py:62), for its preset `code`.
REFERENCE_NUMBERED = re.compile(r"\d+\.\s(.+)")


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance of two strings (insert, delete, substitute: 1 each), as nltk's
    `edit_distance(a, b)`. One numpy pass per character of the shorter string: the in-row
    dependency new[j] = min(new[j - 1] + 1, ...) is a running minimum of (tmp[k] - k) + j."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    codes_b = np.array([ord(c) for c in b], np.int64)
    steps = np.arange(len(b) + 1)
    row = steps.copy()
    for i, ch in enumerate(a, start=1):
        cost = (codes_b != ord(ch)).astype(np.int64)
        tmp = np.empty_like(row)
        tmp[0] = i
        tmp[1:] = np.minimum(row[1:] + 1, row[:-1] + cost)
        row = np.minimum.accumulate(tmp - steps) + steps
    return int(row[-1])


def normalized_edit_distance(a: str, b: str) -> float:
    """Levenshtein(a, b) / max(len(a), len(b)); 0 for two empty strings."""
    longest = max(len(a), len(b))
    return edit_distance(a, b) / longest if longest else 0.0


def diversity(candidates: Sequence[str], sources: Sequence[str], gamma: float = GAMMA) -> np.ndarray:
    """[N] the toolkit's DS(candidate, source)."""
    ned = np.array([normalized_edit_distance(c, s) for c, s in zip(candidates, sources)], np.float64)
    return np.where(ned >= gamma, gamma, -1.0 + ((1.0 + gamma) / gamma) * ned)


# The toolkit (shadowkiller33/parascore_toolkit, `ParaScorer.base_score(cands, sources, refs)`):
#     ParaScore = max(F_BERT(cand, source), F_BERT(cand, ref)) + omega * DS(cand, source)
#     DS        = gamma                                if NED >= gamma
#               = -1 + ((1 + gamma) / gamma) * NED     otherwise
#     NED       = Levenshtein(cand, source) / max(len(cand), len(source))   (characters, raw strings)
# with gamma = 0.35 and omega = 0.05, F_BERT the `bert-score` package's F1 and the Levenshtein
# distance nltk's `edit_distance` (substitution 1, no transpositions), computed row by row in numpy.
# Without references the score is F_BERT(cand, source) + omega * DS (the toolkit's `free_score`
# means this, but its code adds omega * DS to P, R and F in turn). Two empty strings have NED 0 (the
# toolkit divides by zero).
def parascore(sources: Sequence[str], candidates: Sequence[str], references: Sequence[str] | None = None, *,
              model, layer: int | None = None, gamma: float = GAMMA, omega: float = OMEGA) -> np.ndarray:
    """[N] float64 ParaScore of each candidate against its source (and reference).

    Args:
      sources, candidates: N texts each; references: N texts or None (reference-free score).
      model: a BERT / RoBERTa folder or `clarifyjax.evaluation.bertscore.BertScoreModel`; layer: BERTScore's
        hidden_states index (default the package's for the model).
      gamma: in (0, 1], the NED above which diversity no longer adds; omega: >= 0, its weight.
    """
    sources, candidates = check_texts(sources, "sources"), check_texts(candidates, "candidates")
    if len(sources) != len(candidates):
        raise ValueError(f"{len(sources)} sources but {len(candidates)} candidates; give one source each")
    if not (isinstance(gamma, (int, float)) and 0 < gamma <= 1):
        raise ValueError(f"gamma must be a number in (0, 1], got {gamma!r}")
    if not (isinstance(omega, (int, float)) and 0 <= omega < float("inf")):
        raise ValueError(f"omega must be a finite number >= 0, got {omega!r}")
    similarity = bertscore(candidates, sources, model=model, layer=layer)[2].astype(np.float64)
    if references is not None:
        references = check_texts(references, "references")
        if len(references) != len(candidates):
            raise ValueError(f"{len(references)} references but {len(candidates)} candidates")
        similarity = np.maximum(similarity,
                                bertscore(candidates, references, model=model, layer=layer)[2].astype(np.float64))
    return similarity + omega * diversity(candidates, sources, gamma)


def numbered_candidates(text: str) -> list[str]:
    """The items of an LLM's numbered list ("1. ...", "2) ..." at line starts), stripped."""
    return [(m.group(1) or "").strip() for m in NUMBERED_LINE.finditer(text)]


class Paraphrase(NamedTuple):
    text: str
    score: float


class Screened(NamedTuple):
    """The outcome of `filter_paraphrases`: the kept paraphrases in generation order, and each
    rejected candidate with why ("empty", "copy of the question", "duplicate", "below threshold")."""
    kept: list[Paraphrase]
    rejected: list[tuple[str, str]]


def filter_paraphrases(question: str, generations: str | Sequence[str], *, model, layer: int | None = None,
                       threshold: float = THRESHOLD, gamma: float = GAMMA, omega: float = OMEGA,
                       exclude: Sequence[str] = (), reference: bool = False) -> Screened:
    """Paraphrase candidates of `question` as SaGE's pipeline keeps them, its bugs fixed
    (`reference=True`: as the reference keeps them, bugs included: `re.findall(r'\\d+\\.\\s(.+)')`
    over the generation stripped of spaces and newlines, unanchored and unstripped, nothing dropped
    before scoring, `exclude` ignored).

    Candidates are the numbered lines of each generation (anchored at the line start), stripped.
    Empty ones, verbatim copies of the (stripped) question and repeats (of an earlier candidate or
    of `exclude`, e.g. the paraphrases kept in an earlier round) are dropped before scoring: the
    reference's duplicate check compared a string with dicts and removed nothing, so a copy of the
    question (ParaScore about 0.95) passed. The rest are scored as SaGE does,
    ParaScore(source = reference = paraphrase, candidate = question), in one batch, and those with
    a score >= threshold are kept in generation order.
    """
    question = question.strip()
    texts = [generations] if isinstance(generations, str) else check_texts(generations, "generations")
    seen = {t.strip() for t in exclude}
    candidates, rejected = [], []
    for text in texts:
        found = REFERENCE_NUMBERED.findall(text.strip(" \n")) if reference else numbered_candidates(text)
        for candidate in found:
            reason = None if reference else (
                "empty" if not candidate else "copy of the question" if candidate == question
                else "duplicate" if candidate in seen else None)
            if reason:
                rejected.append((candidate, reason))
            else:
                seen.add(candidate)
                candidates.append(candidate)
    if not candidates:
        return Screened([], rejected)
    scores = parascore(candidates, [question] * len(candidates), candidates, model=model, layer=layer,
                       gamma=gamma, omega=omega)
    kept = []
    for candidate, score in zip(candidates, scores):
        if score >= threshold:
            kept.append(Paraphrase(candidate, float(score)))
        else:
            rejected.append((candidate, "below threshold"))
    return Screened(kept, rejected)
