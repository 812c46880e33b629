"""A user's files: UTF-8 text with line-numbered errors and atomic writes (`textfiles`), CSV /
TSV / JSONL tables (`tables`), resumable chunks (`chunkstore`), child processes' results."""
from __future__ import annotations

