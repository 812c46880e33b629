"""The `!function` entry points of the task YAMLs beside this file. lm-eval runs this file by its
path, as a module of its own, so it defines nothing: it hands over `sage_moral`'s functions, which
are then imported once, under their package's name (their settings are dataclasses)."""
from __future__ import annotations

from sage_jax.harness_tasks.sage_moral import (agg_bertscore, agg_bertscore_ci_high, agg_bertscore_ci_low,
                                               agg_bleu, agg_bleu_ci_high, agg_bleu_ci_low, agg_rouge_l,
                                               agg_rouge_l_ci_high, agg_rouge_l_ci_low, agg_sage,
                                               agg_sage_ci_high, agg_sage_ci_low, doc_to_text, load_dataset,
                                               parse_answers, process_results)

__all__ = ["agg_bertscore", "agg_bertscore_ci_high", "agg_bertscore_ci_low", "agg_bleu", "agg_bleu_ci_high",
           "agg_bleu_ci_low", "agg_rouge_l", "agg_rouge_l_ci_high", "agg_rouge_l_ci_low", "agg_sage",
           "agg_sage_ci_high", "agg_sage_ci_low", "doc_to_text", "load_dataset", "parse_answers",
           "process_results"]
