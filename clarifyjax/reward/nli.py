"""The NLI filter of the reward pipeline: drop answers that the situation already entails or that
contradict it (ClarifyDelphi §3.3: roberta-large-wanli, premise = situation, hypothesis = answer).
Any Hugging Face BERT / RoBERTa sequence-classifier folder works; pairs run sorted by length,
padded to buckets, one jitted forward per bucket shape."""
from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from clarifyjax.core import sharding
from clarifyjax.config import NLI_THRESHOLD
from clarifyjax.models.safetensors_io import CheckpointError, check_folder, read_config
from clarifyjax.core.buckets import encoding_batches
from clarifyjax.models.encoder import SequenceClassifier, labels_from_hf
from clarifyjax.models.hf import load_classifier, load_encoder_tokenizer
from clarifyjax.files.textfiles import check_texts


@dataclasses.dataclass
class NLIResult:
    """keep [b] bool (False = drop the answer); probabilities [b, num_labels] float32, columns in
    the order of `labels` (the model's id2label)."""

    keep: np.ndarray
    probabilities: np.ndarray
    labels: tuple[str, ...]

    @property
    def predicted(self) -> list[str]:
        """The argmax label of every pair."""
        return [self.labels[i] for i in self.probabilities.argmax(-1)]


def _check_labels(labels: Sequence[str], drop_labels: Sequence[str], source) -> None:
    """Every name in drop_labels must be one of the model's labels (case-insensitive)."""
    if isinstance(drop_labels, str):
        drop_labels = (drop_labels,)
    lower = {label.lower() for label in labels}
    missing = [name for name in drop_labels if name.lower() not in lower]
    if missing or not drop_labels:
        raise CheckpointError(
            f"{source}: the model's labels {list(labels)} (config.json id2label) do not include "
            f"{missing or '(no drop labels given)'}; expected labels including "
            f"{list(drop_labels)} (case-insensitive). Fix id2label in config.json, or pass "
            "drop_labels naming this model's labels")


def keep_answers(probabilities: np.ndarray, drop_columns: np.ndarray,
                 threshold: float | None) -> np.ndarray:
    """The filter's rule: [b, num_labels] probabilities, drop_columns [num_labels] bool (the
    labels that drop an answer) -> keep [b] bool.

    threshold None: drop when the argmax label is a drop label (the original's rule,
    allenai/clarifydelphi Code/reward.py); a number t: drop when the drop labels' summed
    probability is >= t. The two differ, e.g. on (contradiction .3, entailment .25, neutral .45):
    argmax keeps the answer, t = 0.5 drops it.
    """
    if threshold is None:
        drop = drop_columns[probabilities.argmax(-1)]
    else:
        drop = probabilities[:, drop_columns].sum(-1) >= threshold
    return ~np.asarray(drop, bool)


class NLIFilter:
    """Keep or drop (premise, hypothesis) pairs by an NLI classifier.

    A pair is dropped when its argmax label is one of `drop_labels`, or, with `threshold` set,
    when the summed probability of the drop labels is >= threshold. The default threshold is
    `clarifyjax.config.NLI_THRESHOLD`, shared with the YAML configs and the CLI.
    `traces` counts traces of the jitted forward per (rows, length) shape.
    """

    def __init__(self, model: SequenceClassifier, tokenizer, *,
                 drop_labels: Sequence[str] = ("entailment", "contradiction"),
                 threshold: float | None = NLI_THRESHOLD, batch_size: int = 64,
                 max_length: int = 128, source: str = "the model", mesh=None):
        config = model.config
        self.labels = tuple(config.labels)
        _check_labels(self.labels, drop_labels, source)
        if threshold is not None and not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 3 <= max_length <= config.max_tokens:
            raise ValueError(f"max_length {max_length} is outside [3, {config.max_tokens}] "
                             f"({source}: max_position_embeddings)")
        if isinstance(drop_labels, str):
            drop_labels = (drop_labels,)
        self.drop_labels = tuple(drop_labels)
        self.drop_columns = np.array([name.lower() in {d.lower() for d in drop_labels}
                                      for name in self.labels])
        self.threshold = threshold
        self.mesh = mesh  # a `sharding.process_mesh` holding the parameters, or None
        self.batch_size = batch_size
        self.max_length = max_length
        self.tokenizer = tokenizer
        self.pad_token_id = config.pad_token_id
        # RoBERTa has one token type; its tokenizers may still emit type ids 1 for the second text.
        self.use_token_types = config.type_vocab_size > 1
        self.config = config
        self._graphdef, self._state = nnx.split(model)
        self.traces: collections.Counter = collections.Counter()
        self._probabilities = jax.jit(self._probabilities_impl)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *,
                        drop_labels: Sequence[str] = ("entailment", "contradiction"),
                        threshold: float | None = NLI_THRESHOLD, batch_size: int = 64,
                        max_length: int = 128, dtype: str = "float32", mesh=None,
                        rules=None, precision: str = "default") -> NLIFilter:
        """Load a `...ForSequenceClassification` folder (BERT, RoBERTa or DeBERTa-v2/v3) with its
        tokenizer.json; with `mesh` (a `sharding.process_mesh`), each parameter straight into its
        shards by the logical axis `rules`, and the pairs of a batch split over the mesh's data x
        fsdp devices. `precision`: of the classifier's matmuls.

        Raises:
          CheckpointError: the model's id2label lacks one of drop_labels (the message lists both),
            or the folder lacks a file / tensor.
        """
        folder = check_folder(path)
        # Check the labels and the tokenizer before reading (possibly large) weights.
        hf_config = read_config(folder)
        _check_labels(labels_from_hf(hf_config, folder / "config.json"), drop_labels,
                      folder / "config.json")
        tokenizer = load_encoder_tokenizer(folder, max_length, hf_config.get("vocab_size"))
        model = load_classifier(folder, dtype=dtype, mesh=mesh, rules=rules,  # BERT/RoBERTa/DeBERTa
                                precision=precision)
        return cls(model, tokenizer, drop_labels=drop_labels,
                   threshold=threshold, batch_size=batch_size, max_length=max_length,
                   source=str(folder), mesh=mesh)

    def _probabilities_impl(self, state, input_ids, attention_mask, token_type_ids):
        self.traces[tuple(input_ids.shape)] += 1  # runs only while tracing
        logits = nnx.merge(self._graphdef, state)(input_ids, attention_mask, token_type_ids)
        return jax.nn.softmax(logits, axis=-1)

    def probabilities(self, premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        """[b, num_labels] label probabilities of each (premise, hypothesis) pair."""
        premises = check_texts(premises, "premises")
        hypotheses = check_texts(hypotheses, "hypotheses")
        if len(premises) != len(hypotheses):
            raise ValueError(f"{len(premises)} premises but {len(hypotheses)} hypotheses: "
                             "pairs must line up")
        out = np.zeros((len(premises), len(self.labels)), np.float32)
        if not premises:
            return out
        encodings = self.tokenizer.encode_batch(list(zip(premises, hypotheses)))
        pending = []
        for index, _, ids, mask, types in encoding_batches(
                encodings, self.batch_size, self.max_length, self.pad_token_id,
                token_types=self.use_token_types, shards=sharding.row_shards(self.mesh)):
            pending.append((index, self._probabilities(
                self._state, *(sharding.place_rows(x, self.mesh) for x in (ids, mask, types)))))
        for index, probs in pending:  # dispatched asynchronously above
            out[index] = np.asarray(probs)[: len(index)]
        return out

    def decide(self, probabilities: np.ndarray) -> np.ndarray:
        """[b, num_labels] probabilities -> keep [b] bool, by argmax or by threshold."""
        probabilities = np.asarray(probabilities)
        if probabilities.ndim != 2 or probabilities.shape[1] != len(self.labels):
            raise ValueError(f"probabilities must be [batch, {len(self.labels)}], got shape "
                             f"{probabilities.shape}")
        return keep_answers(probabilities, self.drop_columns, self.threshold)

    def __call__(self, premises: Sequence[str], hypotheses: Sequence[str]) -> NLIResult:
        """premises = situations, hypotheses = answers -> which answers to keep."""
        probabilities = self.probabilities(premises, hypotheses)
        return NLIResult(keep=self.decide(probabilities), probabilities=probabilities,
                         labels=self.labels)
