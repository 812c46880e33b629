"""Pairwise consistency baselines over a question's texts: BLEU, ROUGE-L and BERTScore.

Per question, the mean over the pairs i < j of its non-empty texts of a pair score (the SaGE
paper's Elazar et al. consistency, as the reference code computes it: see above `pairwise_mean`).
BLEU and ROUGE-L reproduce the reference pairs files' columns; `tokenizer="unicode"` reads every
script where the reference's tokenization suits English only."""
from __future__ import annotations

import re
import unicodedata
import warnings
from functools import lru_cache
from collections.abc import Callable, Sequence

import numpy as np

from clarifyjax.evaluation.bertscore import bertscore


def _clean(texts: Sequence[str]) -> list[str]:
    return [t for t in texts if t is not None and t.strip()]


# Per question, the score is the mean over the pairs i < j of its (non-empty) texts of a pair score:
# the SaGE paper's Elazar et al. (2021) consistency (its section 5.1, Table 1's BLEU / ROUGE /
# BERTScore columns), Cons(q) = 2 / (n (n - 1)) * sum over pairs of sim(a_i, a_j). The paper prints
# the sum over i != j, which with that factor would be twice the mean over ordered pairs (2 for
# identical answers); the reference code averages the C(n,2) pairs i < j of its pairs files, and so
# do we. Questions with fewer than 2 non-empty texts score NaN.
def pairwise_mean(texts_per_question: Sequence[Sequence[str]], pair_score: Callable[[str, str], float]
                  ) -> np.ndarray:
    """Mean of pair_score(text_i, text_j) over i < j per question: [batch] float64 (NaN if < 2 texts)."""
    out = np.full(len(texts_per_question), np.nan)
    for b, texts in enumerate(texts_per_question):
        texts = _clean(texts)
        scores = [pair_score(texts[i], texts[j]) for i in range(len(texts)) for j in range(i + 1, len(texts))]
        if scores:
            out[b] = float(np.mean(scores))
    return out


# ----------------------------------------------------------------------------- BLEU, ROUGE-L


LEXICAL_TOKENIZERS = ("reference", "unicode")
# Scripts written without spaces between words: each character is a token of its own.
_NO_SPACES = re.compile("[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u31f0-\u31ff"
                        "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")
_ROUGE_KEPT = re.compile(r"[a-z0-9]")


# Tokenisation (`tokenizer=`): "reference" (the default) is the reference's; it suits English only.
# rouge-score keeps only [a-z0-9], so Chinese, Arabic, Russian or emoji answers lose every character
# (three identical Chinese answers get ROUGE-L 0), and a script written without spaces is one
# whitespace token per sentence for BLEU (`mostly_dropped` finds such questions, for a warning).
# "unicode" reads every script: NFKC, runs of letters, marks and digits are words, and each
# character of a script written without spaces (Han, kana, Thai, Lao, Khmer, Myanmar) and each
# non-ASCII symbol is a token of its own; punctuation separates. For ROUGE-L its ASCII words are
# lowercased and stemmed exactly as rouge-score does, so English scores as with the reference's.
def unicode_tokens(text: str) -> list[str]:
    """The words of `text` in any script (see above): NFKC; letters, marks and digits make
    words; a character of a script written without spaces, or a symbol (emoji), is one token."""
    tokens: list[str] = []
    word: list[str] = []
    for c in unicodedata.normalize("NFKC", text):
        kind = unicodedata.category(c)[0]
        if _NO_SPACES.match(c) or kind == "S":
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(c)
        elif kind in "LMN":
            word.append(c)
        elif word:
            tokens.append("".join(word))
            word = []
    if word:
        tokens.append("".join(word))
    return tokens


def kept_share(text: str) -> float:
    """The share of `text`'s non-space characters that rouge-score's tokenizer keeps ([a-z0-9]
    after lowercasing); 1.0 for a text of spaces only."""
    total = sum(not c.isspace() for c in text)
    return len(_ROUGE_KEPT.findall(text.lower())) / total if total else 1.0


def mostly_dropped(texts_per_question: Sequence[Sequence[str]], below: float = 0.5) -> list[int]:
    """Indices of the questions whose (non-empty) texts lose most of their characters to the
    reference's tokenisation: under `below` of them survive rouge-score's tokenizer."""
    out = []
    for b, texts in enumerate(texts_per_question):
        texts = _clean(texts)
        total = sum(sum(not c.isspace() for c in t) for t in texts)
        kept = sum(len(_ROUGE_KEPT.findall(t.lower())) for t in texts)
        if total and kept < below * total:
            out.append(b)
    return out


def _check_tokenizer(tokenizer: str) -> str:
    if tokenizer not in LEXICAL_TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {LEXICAL_TOKENIZERS}, got {tokenizer!r}")
    return tokenizer


@lru_cache(maxsize=1)
def _smoothing():
    from nltk.translate.bleu_score import SmoothingFunction

    return SmoothingFunction().method1


# BLEU: nltk `sentence_bleu([text_i.split()], text_j.split())` with `SmoothingFunction().method1`,
# text i the reference and text j the hypothesis: this reproduces the `bleu_*` columns of the
# reference pairs files exactly (paraphrase `_1` = reference, `_2` = hypothesis). ROUGE-L:
# rouge-score's `rougeL` F-measure with `use_stemmer=True` (the `rouge_*` columns).
def bleu_pair(reference: str, hypothesis: str, tokenizer: str = "reference") -> float:
    """Sentence BLEU-4 of `hypothesis` against `reference`, smoothing method 1; whitespace tokens
    ("reference") or `unicode_tokens` ("unicode")."""
    from nltk.translate.bleu_score import sentence_bleu

    split = unicode_tokens if _check_tokenizer(tokenizer) == "unicode" else str.split
    with warnings.catch_warnings():  # nltk warns on every pair without higher-order overlaps
        warnings.simplefilter("ignore")
        return float(sentence_bleu([split(reference)], split(hypothesis), smoothing_function=_smoothing()))


class _CachingTokenizer:
    """rouge-score's default tokenizer (with the Porter stemmer), memoized per text: each text is in
    n - 1 pairs, and stemming dominates the cost."""

    def __init__(self, unicode: bool = False):
        from rouge_score import tokenizers

        self._inner = tokenizers.DefaultTokenizer(use_stemmer=True)
        self._cache: dict[str, list[str]] = {}
        self._unicode = unicode

    def tokenize(self, text: str) -> list[str]:
        tokens = self._cache.get(text)
        if tokens is None:
            if len(self._cache) > 100_000:
                self._cache.clear()
            tokens = self._cache[text] = self._tokens(text)
        return tokens

    def _tokens(self, text: str) -> list[str]:
        if not self._unicode:
            return self._inner.tokenize(text)
        out: list[str] = []
        for token in unicode_tokens(text.lower()):  # ASCII words exactly as rouge-score's
            out += self._inner.tokenize(token) if token.isascii() else [token]
        return out


@lru_cache(maxsize=2)
def _rouge_scorer(tokenizer: str = "reference"):
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_CachingTokenizer(tokenizer == "unicode"))


def rouge_l_pair(reference: str, hypothesis: str, tokenizer: str = "reference") -> float:
    """ROUGE-L F1 (rouge-score, Porter stemmer); rouge-score's tokens ("reference") or
    `unicode_tokens` with rouge-score's lowercasing and stemming of ASCII words ("unicode")."""
    scorer = _rouge_scorer(_check_tokenizer(tokenizer))
    return float(scorer.score(reference, hypothesis)["rougeL"].fmeasure)


def bleu_consistency(texts_per_question: Sequence[Sequence[str]], tokenizer: str = "reference"
                     ) -> np.ndarray:
    """[batch] mean pairwise BLEU per question."""
    _check_tokenizer(tokenizer)
    return pairwise_mean(texts_per_question, lambda a, b: bleu_pair(a, b, tokenizer))


def rouge_l_consistency(texts_per_question: Sequence[Sequence[str]], tokenizer: str = "reference"
                        ) -> np.ndarray:
    """[batch] mean pairwise ROUGE-L F1 per question."""
    _check_tokenizer(tokenizer)
    return pairwise_mean(texts_per_question, lambda a, b: rouge_l_pair(a, b, tokenizer))


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def exact_match_consistency(texts_per_question: Sequence[Sequence[str]]) -> np.ndarray:
    """[batch] Elazar et al. (2021)'s own, strict consistency: the share of pairs i < j whose texts
    agree exactly, after collapsing whitespace and case (their ParaRel measure compares the
    predictions for paraphrased queries). It is `pairwise_mean` with a 0/1 pair score; the SaGE
    paper's columns replace that score with BLEU / ROUGE-L / BERTScore (the functions above and
    below). Not a column of the SaGE paper: free-text answers rarely agree exactly."""
    return pairwise_mean(texts_per_question, lambda a, b: float(_normalized(a) == _normalized(b)))


# ----------------------------------------------------------------------------- BERTScore


# BERTScore F1 through `clarifyjax.evaluation.bertscore` (the reference calls the package with
# bert-base-uncased, layer 9, no idf, no rescaling), text i the reference and text j the candidate,
# in jitted batches over all the pairs (BLEU and ROUGE are per-pair Python).
def bertscore_consistency(texts_per_question: Sequence[Sequence[str]], *, model, layer: int | None = None,
                          batch_size: int = 1, pairs_per_call: int = 4096,
                          on_chunk: Callable[[int, int], None] | None = None) -> np.ndarray:
    """[batch] mean pairwise BERTScore F1 per question, as the reference scores its pairs.

    Every pair i < j of a question's (non-empty) texts is scored by `clarifyjax.evaluation.bertscore` with
    text j the candidate and text i the reference, no idf and no rescaling: the `bert-score`
    package's F1 on the pairs listed question by question, in batches of `batch_size` pairs
    (whose padding the package lets into the scores; the reference calls it one pair at a time,
    batch_size 1, the default).

    Args:
      model: a BERT / RoBERTa (or sentence-transformers) folder or a `BertScoreModel`.
      layer: hidden_states index; default the package's for the model.
      pairs_per_call: pairs per `bertscore` call (rounded to whole batches of `batch_size`, so
        the scores are those of one call over every pair).
      on_chunk: optional callback(n_pairs_done, n_pairs_total).
    """
    owner, cands, refs = [], [], []
    for b, texts in enumerate(texts_per_question):
        texts = _clean(texts)
        for i in range(len(texts)):
            for j in range(i + 1, len(texts)):
                owner.append(b)
                cands.append(texts[j])
                refs.append(texts[i])
    f1 = np.zeros(len(cands))
    step = max(1, pairs_per_call // batch_size) * batch_size
    for start in range(0, len(cands), step):
        stop = min(start + step, len(cands))
        f1[start:stop] = bertscore(cands[start:stop], refs[start:stop], model=model, layer=layer,
                                   batch_size=batch_size)[2]
        if on_chunk is not None:
            on_chunk(stop, len(cands))
    total = np.bincount(np.asarray(owner, np.int64), weights=f1, minlength=len(texts_per_question))
    count = np.bincount(np.asarray(owner, np.int64), minlength=len(texts_per_question))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)
