"""Hugging Face checkpoint folders: one loader per family (`loaders`, re-exported here), and each
family's tensor map (`t5_map`, `encoder_map`, `deberta_map`, `causal_lm_map`), all in the one
idiom of `tensor_map` (`TensorMap`, `check_tensors`, `read_into`)."""
from __future__ import annotations

from clarifyjax.models.hf.loaders import (  # noqa: F401  (the package's public API)
    load_t5, save_t5, load_encoder, load_sequence_classifier, load_encoder_tokenizer, load_causal_lm,
    read_generation_defaults, load_deberta, load_deberta_sequence_classifier, load_question_answering,
    load_classifier, save_sequence_classifier, CheckpointError, check_t5_folder,
    check_classifier_folder, check_causal_lm_folder, save_causal_lm,
)

__all__ = [
    "load_t5", "save_t5", "load_encoder", "load_sequence_classifier", "load_encoder_tokenizer",
    "load_causal_lm", "read_generation_defaults", "load_deberta", "load_deberta_sequence_classifier",
    "load_question_answering", "load_classifier", "save_sequence_classifier", "CheckpointError",
    "check_t5_folder", "check_classifier_folder", "check_causal_lm_folder", "save_causal_lm",
]
