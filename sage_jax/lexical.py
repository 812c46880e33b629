"""Pairwise consistency baselines over a question's texts: BLEU, ROUGE-L and BERTScore.

Per question, the score is the mean over the pairs i < j of its (non-empty) texts of a pair score,
as in the SaGE paper's Table 1 (Elazar et al.'s consistency with sim = BLEU / ROUGE / BERTScore):

* BLEU: nltk `sentence_bleu([text_i.split()], text_j.split())` with `SmoothingFunction().method1`,
  whitespace tokens, text i the reference and text j the hypothesis. This reproduces the `bleu_*`
  columns of the reference pairs files exactly (paraphrase `_1` = reference, `_2` = hypothesis).
* ROUGE-L: rouge-score's `rougeL` F-measure with `use_stemmer=True` (the `rouge_*` columns).
* BERTScore F1 on our encoder's token embeddings: greedy matching on the cosine of token
  vectors, no idf weighting, no baseline rescaling; special tokens excluded by the embedder.

Questions with fewer than 2 non-empty texts score NaN. BLEU and ROUGE are per-pair Python (nltk,
rouge-score); BERTScore is a jitted batch over questions.
"""
from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from clarifyjax.buckets import POWER_OF_TWO_BUCKETS, bucket_length


def _clean(texts: Sequence[str]) -> list[str]:
    return [t for t in texts if t is not None and t.strip()]


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


@lru_cache(maxsize=1)
def _smoothing():
    from nltk.translate.bleu_score import SmoothingFunction

    return SmoothingFunction().method1


def bleu_pair(reference: str, hypothesis: str) -> float:
    """Sentence BLEU-4 of `hypothesis` against `reference`, whitespace tokens, smoothing method 1."""
    from nltk.translate.bleu_score import sentence_bleu

    with warnings.catch_warnings():  # nltk warns on every pair without higher-order overlaps
        warnings.simplefilter("ignore")
        return float(sentence_bleu([reference.split()], hypothesis.split(), smoothing_function=_smoothing()))


class _CachingTokenizer:
    """rouge-score's default tokenizer (with the Porter stemmer), memoized per text: each text is in
    n - 1 pairs, and stemming dominates the cost."""

    def __init__(self):
        from rouge_score import tokenizers

        self._inner = tokenizers.DefaultTokenizer(use_stemmer=True)
        self._cache: dict[str, list[str]] = {}

    def tokenize(self, text: str) -> list[str]:
        tokens = self._cache.get(text)
        if tokens is None:
            if len(self._cache) > 100_000:
                self._cache.clear()
            tokens = self._cache[text] = self._inner.tokenize(text)
        return tokens


@lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_CachingTokenizer())


def rouge_l_pair(reference: str, hypothesis: str) -> float:
    """ROUGE-L F1 (rouge-score, Porter stemmer)."""
    return float(_rouge_scorer().score(reference, hypothesis)["rougeL"].fmeasure)


def bleu_consistency(texts_per_question: Sequence[Sequence[str]]) -> np.ndarray:
    """[batch] mean pairwise BLEU per question."""
    return pairwise_mean(texts_per_question, bleu_pair)


def rouge_l_consistency(texts_per_question: Sequence[Sequence[str]]) -> np.ndarray:
    """[batch] mean pairwise ROUGE-L F1 per question."""
    return pairwise_mean(texts_per_question, rouge_l_pair)


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def exact_match_consistency(texts_per_question: Sequence[Sequence[str]]) -> np.ndarray:
    """[batch] Elazar et al.'s consistency: the share of pairs i < j whose texts agree, here
    exactly, after collapsing whitespace and case (the SaGE paper's Table 1 column). It is
    `pairwise_mean` with a 0/1 pair score, so BLEU / ROUGE-L / BERTScore are its soft versions."""
    return pairwise_mean(texts_per_question, lambda a, b: float(_normalized(a) == _normalized(b)))


# ----------------------------------------------------------------------------- BERTScore


@jax.jit
def bertscore_f1_matrix(tokens: jax.Array, token_mask: jax.Array) -> jax.Array:
    """BERTScore F1 between every pair of texts of each question (greedy matching, no idf).

    Args:
      tokens: [batch, n, length, d] token embeddings (any scale: they are L2-normalized here).
      token_mask: [batch, n, length] bool, True for real tokens.

    Returns:
      [batch, n, n] float32 F1 (symmetric); NaN where either text has no tokens.
    """
    x = tokens.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-30))
    # sim[b, i, j, s, t] = cos(token s of text i, token t of text j)
    sim = jnp.einsum("bisd,bjtd->bijst", x, x, precision=jax.lax.Precision.HIGHEST)
    both = token_mask[:, :, None, :, None] & token_mask[:, None, :, None, :]
    sim = jnp.where(both, sim, -jnp.inf)
    count = jnp.sum(token_mask, axis=-1).astype(jnp.float32)                          # [b, n]
    best_for_i = jnp.max(sim, axis=-1)                                                 # [b, i, j, s]
    recall = jnp.sum(jnp.where(token_mask[:, :, None, :], best_for_i, 0.0), axis=-1) / count[:, :, None]
    precision = jnp.swapaxes(recall, -1, -2)  # the hypothesis' tokens matched into the reference
    f1 = 2 * precision * recall / (precision + recall)
    empty = (count[:, :, None] == 0) | (count[:, None, :] == 0)
    return jnp.where(empty, jnp.nan, f1)


def bertscore_consistency(texts_per_question: Sequence[Sequence[str]],
                          token_embeddings: Callable[[Sequence[str]], list[np.ndarray]], *,
                          chunk_size: int = 16, questions_per_call: int = 512,
                          on_chunk: Callable[[int, int], None] | None = None) -> np.ndarray:
    """[batch] mean pairwise BERTScore F1 per question.

    Args:
      texts_per_question: the texts of each question (empty ones are dropped).
      token_embeddings: texts -> list of [length_i, d] arrays, special tokens excluded (e.g.
        `SentenceEmbedder.token_embeddings`). Called on the distinct texts of `questions_per_call`
        questions at a time (few calls: the embedder buckets by length inside each).
      chunk_size: questions per jitted F1 call; the token length is padded to a power of two, so
        only a few shapes compile.
      on_chunk: optional callback(n_done, n_total).
    """
    total = len(texts_per_question)
    out = np.full(total, np.nan)
    # One n for every chunk, so that only the token length varies between compiled shapes.
    n = max([len(_clean(t)) for t in texts_per_question] + [2])
    upper = np.triu(np.ones((n, n), bool), k=1)
    for block in range(0, total, questions_per_call):
        block_texts = [_clean(t) for t in texts_per_question[block:block + questions_per_call]]
        distinct = list(dict.fromkeys(t for texts in block_texts for t in texts))
        vectors = dict(zip(distinct, token_embeddings(distinct))) if distinct else {}
        d = next(iter(vectors.values())).shape[-1] if vectors else 1
        for offset in range(0, len(block_texts), chunk_size):
            chunk = block_texts[offset:offset + chunk_size]
            length = bucket_length(max([len(vectors[t]) for texts in chunk for t in texts] + [1]),
                                   POWER_OF_TWO_BUCKETS)
            tokens = np.zeros((chunk_size, n, length, d), np.float32)
            token_mask = np.zeros((chunk_size, n, length), bool)
            for b, texts in enumerate(chunk):
                for i, t in enumerate(texts):
                    v = np.asarray(vectors[t], np.float32)
                    tokens[b, i, :len(v)] = v
                    token_mask[b, i, :len(v)] = True
            f1 = np.asarray(bertscore_f1_matrix(tokens, token_mask))
            for b, texts in enumerate(chunk):
                k = len(texts)
                if k >= 2:
                    out[block + offset + b] = float(np.mean(f1[b][:k, :k][upper[:k, :k]]))
            if on_chunk is not None:
                on_chunk(min(block + offset + chunk_size, total), total)
    return out
