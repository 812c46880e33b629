"""Training data: δ-CLARIFY and the other tables as (input, target) pairs (`pairs`), tokenized,
bucketed batches, the discriminator baseline's rows (`discriminator`) and the situations and
questions of `score-questions` (`situations`)."""
from __future__ import annotations

from clarifyjax.data.batches import (  # noqa: F401  (the package's public API)
    TokenizedDataset, sft_dataset, classifier_dataset, situation_dataset, BatchIterator, eval_batches,
)
from clarifyjax.data.pairs import (  # noqa: F401  (the package's public API)
    GOLD_COLUMNS, SILVER_COLUMNS, FUSION_COLUMNS, TASKS, Pair, question_pairs,
    wh_question_pairs, answerer_pairs, fusion_pairs, judge_pairs, discriminator_pairs, hypothesis_polarity,
    silver_judge_rows, unique_situations, split_by_group, read_pairs, load_sft_pairs, load_ppo_situations,
    as_hf_dataset,
)

__all__ = [
    "GOLD_COLUMNS", "SILVER_COLUMNS", "FUSION_COLUMNS", "TASKS", "Pair", "question_pairs",
    "wh_question_pairs", "answerer_pairs", "fusion_pairs", "judge_pairs", "discriminator_pairs", "hypothesis_polarity",
    "silver_judge_rows", "unique_situations", "split_by_group", "read_pairs", "load_sft_pairs", "load_ppo_situations",
    "as_hf_dataset", "TokenizedDataset", "sft_dataset", "classifier_dataset",
    "situation_dataset", "BatchIterator", "eval_batches",
]
