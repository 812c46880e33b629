"""Padded lengths, so that jitted shapes repeat: every variable-length batch of the project (the
tokenizer's batches, the reward's seq2seq stages, the encoders, the training data) is padded to
one of a few bucket lengths, and each shape compiles once.
"""
from __future__ import annotations

from typing import Sequence

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
