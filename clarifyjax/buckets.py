"""Padded shapes, so that jitted shapes repeat: every variable-length batch of the project (the
tokenizer's batches, the reward's seq2seq stages, the encoders, the training data) is padded to
one of a few bucket lengths, and the reward models' batches to a few row counts
(`padded_rows`, `pad_rows`), and each shape compiles once.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512)
# Finer steps, for models that run on many short inputs per call (the reward's seq2seq stages): the
# encoder is compute-bound, so a padded column costs as much as a real one, and powers of two pad
# an input of 65 tokens to 128. More shapes compile, each once.
FINE_BUCKETS = (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448,
                512)


def bucket_length(n: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    """The smallest bucket >= `n`, so that jitted shapes repeat.

    Past the largest bucket, `n` is rounded up to a multiple of it (512, 1024, ...).
    """
    if n < 0:
        raise ValueError(f"bucket_length: negative length {n}")
    if not buckets or list(buckets) != sorted(buckets) or buckets[0] < 1:
        raise ValueError(f"bucket_length: buckets must be increasing positive ints, got {buckets}")
    for b in buckets:
        if n <= b:
            return int(b)
    largest = buckets[-1]
    return int(-(-n // largest) * largest)


def padded_rows(n: int, multiple: int, *, power_of_two: bool = False) -> int:
    """Rows of a batch holding n texts: n rounded up to `multiple` (or to multiple * 2^k), so
    that a few batch shapes repeat and each jitted function compiles once per shape."""
    if multiple < 1:
        raise ValueError(f"padded_rows: multiple must be >= 1, got {multiple}")
    blocks = max(1, -(-n // multiple))
    if power_of_two:
        blocks = 1 << (blocks - 1).bit_length()
    return blocks * multiple


def pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """Repeat the last row up to `rows` rows (a copy of a real row finishes with it)."""
    if array.shape[0] >= rows:
        return array
    filler = np.repeat(array[-1:], rows - array.shape[0], axis=0)
    return np.concatenate([array, filler], axis=0)
