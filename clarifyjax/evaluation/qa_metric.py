"""The informativeness metric's model: is a question unanswerable from its situation?

An extractive QA model (`models.hf.load_question_answering`: Hugging Face's
``...ForQuestionAnswering`` layout on BERT, RoBERTa or DeBERTa) reads (question, situation) as a
pair, question first as in SQuAD; `answer_spans.best_spans` applies AllenNLP transformer-qa's
rule with the situation's tokens as the only answer positions: the question is unanswerable
when the best span starts at CLS (no threshold). Pairs are length-sorted into bucketed batches
(`buckets`), each one jitted call.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from clarifyjax.text import formats
from clarifyjax.evaluation.answer_spans import best_spans
from clarifyjax.core.buckets import encoding_batches, pad_sequences
from clarifyjax.models.hf import load_encoder_tokenizer, load_question_answering
from clarifyjax.models.safetensors_io import check_folder, read_config
from clarifyjax.files.textfiles import check_texts


class Unanswerable:
    """`__call__(situations, questions) -> [n] bool` (True: the QA model's best span is CLS)."""

    def __init__(self, model, tokenizer, *, pad_token_id: int, use_token_types: bool,
                 max_length: int = 384, batch_size: int = 64):
        self.tokenizer, self.pad_token_id = tokenizer, pad_token_id
        self.use_token_types = use_token_types
        self.max_length, self.batch_size = max_length, batch_size
        self._graphdef, self._state = nnx.split(model)
        self._forward = jax.jit(self._forward_impl)

    def _forward_impl(self, state, ids, mask, types, answer_mask):
        start, end = nnx.merge(self._graphdef, state)(ids, mask, types)
        return best_spans(start, end, answer_mask).unanswerable

    def __call__(self, situations: Sequence[str], questions: Sequence[str]) -> np.ndarray:
        situations = [formats.strip_policy_prefix(s) for s in check_texts(situations,
                                                                          "situations")]
        questions = check_texts(questions, "questions")
        out = np.ones(len(questions), bool)  # an empty question asks nothing: unanswerable
        asked = [i for i, q in enumerate(questions) if q.strip()]
        if not asked:
            return out
        encodings = self.tokenizer.encode_batch([(questions[i], situations[i]) for i in asked])
        for index, chosen, ids, mask, types in encoding_batches(
                encodings, self.batch_size, self.max_length, self.pad_token_id,
                token_types=self.use_token_types):
            context = pad_sequences([[int(s == 1) for s in e.sequence_ids] for e in chosen],
                                    *ids.shape, 0)
            flags = np.asarray(self._forward(self._state, ids, mask, types, context))
            out[[asked[i] for i in index]] = flags[: len(index)]
        return out


def load_unanswerable(folder: str | os.PathLike, *, max_length: int = 384,
                      batch_size: int = 64, dtype: str = "float32") -> Unanswerable:
    """The QA model of a Hugging Face folder (safetensors, tokenizer.json) as `Unanswerable`."""
    folder = check_folder(folder)
    model = load_question_answering(folder, dtype=dtype)
    config = model.config
    hf = read_config(folder)
    tokenizer = load_encoder_tokenizer(folder, max_length, config.vocab_size)
    return Unanswerable(model, tokenizer, pad_token_id=int(hf.get("pad_token_id") or 0),
                        use_token_types=int(hf.get("type_vocab_size", 0) or 0) > 1,
                        max_length=max_length, batch_size=batch_size)
