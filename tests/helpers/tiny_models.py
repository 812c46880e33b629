"""`clarifyjax.models.tiny`'s model folders for tests: a missing optional package (torch,
transformers, sentencepiece, tokenizers) or missing shared data fails under CI=true and skips
locally (`helpers.env`), as for any other test."""
from __future__ import annotations

from pathlib import Path

from clarifyjax.models import tiny
from helpers.env import require, shared_data


def _needs(*modules: str) -> None:
    for module in modules:
        require(module)
    shared_data("delta-clarify/train.tsv")  # the tokenizers' corpus


def tiny_spm_folder(root, **kwargs) -> Path:
    _needs("sentencepiece")
    return tiny.tiny_spm_folder(root, **kwargs)


def tiny_t5_folder(root, **kwargs) -> Path:
    _needs("sentencepiece", "torch", "transformers")
    return tiny.tiny_t5_folder(root, **kwargs)


def tiny_classifier_folder(root, *args, **kwargs) -> Path:
    _needs("tokenizers", "torch", "transformers")
    return tiny.tiny_classifier_folder(root, *args, **kwargs)


def tiny_deberta_classifier_folder(root, *args, **kwargs) -> Path:
    _needs("tokenizers", "torch", "transformers")
    return tiny.tiny_deberta_classifier_folder(root, *args, **kwargs)


def tiny_nli_folder(root, *args, **kwargs) -> Path:
    _needs("tokenizers", "torch", "transformers")
    return tiny.tiny_nli_folder(root, *args, **kwargs)


def tiny_llama_folder(root, **kwargs) -> Path:
    _needs("tokenizers", "torch", "transformers")
    return tiny.tiny_llama_folder(root, **kwargs)
