"""Multiple-choice accuracy by the log-likelihood of each choice, as lm-evaluation-harness 0.4.13's
`hf` model computes it, on a local causal LM folder through `clarifyjax.decoding.score`:
`ChoiceScorer` (how a request is tokenized is above it), `doc_metrics` (acc, acc_norm, MC2) and
`evaluate_choices`."""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from clarifyjax.files.tables import DataError
from sage_jax.experiments.benchmarks import TARGET_DELIMITER, Doc
from clarifyjax.text.tokenizer import CausalTokenizer


# A request (context, continuation): trailing spaces of the context move to the continuation; the
# continuation's tokens are those of tokenize(context + continuation) beyond tokenize(context), both
# with the tokenizer's own special tokens (BOS); an empty context is the BOS (else EOS) id alone; the
# sequence is cut from the left to max_length + 1 tokens (lm-eval's `max_length`). The score is the
# sum of the continuation tokens' log-probabilities.
class ChoiceScorer:
    """Log-likelihoods of continuations under a local causal LM folder (loaded once)."""

    def __init__(self, folder: str | os.PathLike, *, dtype: str = "float32", max_length: int | None = None,
                 batch_size: int = 16):
        from clarifyjax.decoding.local_lm import context_length

        self.folder = str(folder)
        self.tokenizer = CausalTokenizer(folder)
        self.max_length = max_length or context_length(folder)
        self.dtype, self.batch_size = dtype, batch_size
        self._model = None

    def sharing(self, max_length: int | None, batch_size: int) -> ChoiceScorer:
        """Another scorer of the same folder with other settings, on the same loaded weights."""
        other = ChoiceScorer(self.folder, dtype=self.dtype, max_length=max_length, batch_size=batch_size)
        other._model = self.model
        return other

    @property
    def model(self):
        if self._model is None:
            from clarifyjax.models.hf import load_causal_lm

            _, self._model = load_causal_lm(self.folder, dtype=self.dtype)
        return self._model

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's `_encode_pair` (with its empty-context rule)."""
        if not context:
            prefix = self.tokenizer.bos_id if self.tokenizer.bos_id is not None else self.tokenizer.eos_id
            return [prefix], self.tokenizer.encode(continuation)
        spaces = len(context) - len(context.rstrip())
        if spaces:
            continuation, context = context[-spaces:] + continuation, context[:-spaces]
        whole = self.tokenizer.encode(context + continuation)
        prompt = self.tokenizer.encode(context)
        return prompt, whole[len(prompt):]

    def _rows(self, requests: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        rows = []
        for context, continuation in requests:
            prompt, target = self.encode_pair(context, continuation)
            if not target:
                raise DataError(f"the continuation {continuation!r} has no tokens of its own after its context")
            full = (prompt + target)[-(self.max_length + 1):]
            if len(full) <= len(target):
                raise DataError(f"the continuation {continuation[:60]!r} is longer than max_length {self.max_length}")
            rows.append((full[:-len(target)], target))
        return rows

    def loglikelihoods(self, requests: Sequence[tuple[str, str]]) -> np.ndarray:
        """[R] float64: log p(continuation | context) of each request."""
        from clarifyjax.decoding import score

        rows = self._rows(requests)
        out = np.zeros(len(rows))
        order = sorted(range(len(rows)), key=lambda i: (len(rows[i][0]), len(rows[i][1])))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            p_len = max(len(rows[i][0]) for i in chunk)
            t_len = max(len(rows[i][1]) for i in chunk)
            n_rows = self.batch_size  # one batch shape per length bucket, compiled once
            prompts = np.zeros((n_rows, p_len), np.int32)
            p_mask = np.zeros_like(prompts)
            targets = np.zeros((n_rows, t_len), np.int32)
            t_mask = np.zeros_like(targets)
            for r, i in enumerate(chunk):
                prompt, target = rows[i]
                prompts[r, p_len - len(prompt):], p_mask[r, p_len - len(prompt):] = prompt, 1
                targets[r, :len(target)], t_mask[r, :len(target)] = target, 1
            prompts[len(chunk):, -1] = p_mask[len(chunk):, -1] = 1  # filler rows: one token, no target
            logp = np.asarray(score(self.model, prompts, p_mask, targets, t_mask), np.float64)
            out[chunk] = logp[:len(chunk)].sum(axis=1)
        return out


# lm-eval's `process_results`: acc = the argmax of the log-likelihoods is the gold index (first
# index on ties); acc_norm = the same after dividing each by its choice's length in characters
# (`completion_len`); TruthfulQA MC2 = the probability mass of the true answers among all.
def doc_metrics(task: str, doc: Doc, lls: np.ndarray) -> dict:
    """One document's metrics from its choices' log-likelihoods."""
    if task == "truthfulqa_mc2":
        probs = np.exp(lls)
        probs = probs / probs.sum()
        return {"mc2": float(probs[np.asarray(doc.labels) == 1].sum())}
    acc = float(np.argmax(lls) == doc.gold)
    if task == "truthfulqa_mc1":
        return {"mc1": acc}
    lengths = np.array([float(len(c)) for c in doc.choices])
    return {"acc": acc, "acc_norm": float(np.argmax(lls / lengths) == doc.gold)}


def evaluate_choices(scorer: ChoiceScorer, task: str, docs: Sequence[Doc], contexts: Sequence[str]) -> list[dict]:
    """Per document: its id, each choice's log-likelihood and its metrics."""
    requests = [(ctx, TARGET_DELIMITER + choice) for doc, ctx in zip(docs, contexts) for choice in doc.choices]
    lls = scorer.loglikelihoods(requests)
    out, at = [], 0
    for doc in docs:
        mine = lls[at:at + len(doc.choices)]
        at += len(doc.choices)
        out.append({"doc_id": doc.doc_id, "gold": doc.gold, "labels": list(doc.labels), "choices": list(doc.choices),
                    "loglikelihoods": mine.tolist(), **doc_metrics(task, doc, mine)})
    return out
