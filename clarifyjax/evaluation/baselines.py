"""ClarifyDelphi's baselines (paper §5) as question generators: situations in, one question each out.

`QuestionSampler` samples a question generator (the *t5* baseline, and the PPO policy);
`WhCandidates` asks the wh-conditioned generator one question per start ("why" alone: *why*);
`candidate_rewards` + `best_candidates` keep the candidate of highest raw defeasibility reward
(*pipeline* / *pipeline-nli*); `Discriminator` keeps the one of highest P(relevant)
(*discriminator*). Each call is one batched, jitted model call over all its rows."""
from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from clarifyjax.text import formats
from clarifyjax.reward.pipeline import RewardPipeline
from clarifyjax.decoding.seq2seq import Seq2SeqModel
from clarifyjax.text.generator import Sampling
from clarifyjax.models.encoder import labels_from_hf
from clarifyjax.models.safetensors_io import CheckpointError, check_folder, read_config
from clarifyjax.reward.nli import NLIFilter


class QuestionSampler:
    """One question per situation from a question generator (the PPO policy's input format)."""

    def __init__(self, model: Seq2SeqModel, sampling: Sampling):
        self.model, self.sampling = model, sampling

    def __call__(self, situations: Sequence[str], rng: jax.Array | None = None) -> list[str]:
        inputs = [formats.policy_input(s, where=f"situation {i}")
                  for i, s in enumerate(situations)]
        return self.model.generate(inputs, self.sampling, rng=rng).texts


class WhCandidates:
    """One question per (situation, start) from the wh-conditioned generator: [n][len(starts)]."""

    def __init__(self, model: Seq2SeqModel, sampling: Sampling, starts: Sequence[str]):
        if not starts:
            raise ValueError("WhCandidates: no question starts")
        self.model, self.sampling, self.starts = model, sampling, tuple(starts)

    def __call__(self, situations: Sequence[str], rng: jax.Array | None = None
                 ) -> list[list[str]]:
        inputs = [formats.wh_question_input(s, start, where=f"situation {i}")
                  for i, s in enumerate(situations) for start in self.starts]
        texts = self.model.generate(inputs, self.sampling, rng=rng).texts
        k = len(self.starts)
        return [texts[i * k: (i + 1) * k] for i in range(len(situations))]


def candidate_rewards(pipeline: RewardPipeline, situations: Sequence[str],
                      candidates: Sequence[Sequence[str]], rng=None) -> np.ndarray:
    """[n, k] raw rewards (JSD before normalization) of every candidate, in one pipeline call."""
    k = len(candidates[0]) if candidates else 0
    if any(len(c) != k for c in candidates):
        raise ValueError("candidate_rewards: every situation needs the same number of candidates")
    flat_situations = [s for s in situations for _ in range(k)]
    flat_questions = [q for c in candidates for q in c]
    out = pipeline(flat_situations, flat_questions, rng=rng)
    return np.asarray(out.raw_reward, np.float64).reshape(len(situations), k)


def best_candidates(candidates: Sequence[Sequence[str]], scores) -> list[str]:
    """The highest-scoring candidate of each situation (the first on ties)."""
    index = np.asarray(scores).argmax(axis=1)
    return [c[int(i)] for c, i in zip(candidates, index)]


class Discriminator:
    """P(relevant) of (situation, question) pairs from a sequence-classifier folder (DeBERTa-v2/v3,
    BERT or RoBERTa, as `clarifyjax train clarifyjax/presets/sft_discriminator*.yaml` exports it) whose
    id2label names `relevant_label`, run through `nli.NLIFilter`'s batched, bucketed pair
    forward (its "drop" labels are the other labels, unused here)."""

    def __init__(self, folder, *, relevant_label: str = "relevant", max_length: int = 128,
                 batch_size: int = 64, dtype: str = "float32"):
        folder = check_folder(folder)
        labels = [str(label) for label in labels_from_hf(read_config(folder),
                                                              folder / "config.json")]
        lower = [label.lower() for label in labels]
        if relevant_label.lower() not in lower or len(labels) < 2:
            raise CheckpointError(f"{folder / 'config.json'}: id2label {labels} has no "
                                  f"{relevant_label!r} label (and at least one other)")
        self.column = lower.index(relevant_label.lower())
        others = tuple(label for i, label in enumerate(labels) if i != self.column)
        self.classifier = NLIFilter.from_pretrained(folder, drop_labels=others,
                                                    max_length=max_length,
                                                    batch_size=batch_size, dtype=dtype)

    def relevance(self, situations: Sequence[str], questions: Sequence[str]) -> np.ndarray:
        """[n] P(relevant) of each (situation, question) pair."""
        sits = [formats.strip_policy_prefix(s) for s in situations]
        return self.classifier.probabilities(sits, list(questions))[:, self.column]

    def scores(self, situations: Sequence[str], candidates: Sequence[Sequence[str]]
               ) -> np.ndarray:
        """[n, k] P(relevant) of every candidate, in one batched call."""
        k = len(candidates[0]) if candidates else 0
        pairs = [(s, q) for s, c in zip(situations, candidates) for q in c]
        scores = np.zeros(len(pairs))  # an empty candidate (the model wrote only EOS) scores 0
        asked = [i for i, (_, q) in enumerate(pairs) if q.strip()]
        if asked:
            scores[asked] = self.relevance([pairs[i][0] for i in asked],
                                           [pairs[i][1] for i in asked])
        return scores.reshape(len(situations), k)
