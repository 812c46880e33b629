"""Padded shapes, so that jitted shapes repeat: every variable-length batch of the project (the
tokenizer's batches, the reward's seq2seq stages, the encoders, the training data, the SaGE
embedder and its BERTScore baseline) is padded to one of a few bucket lengths and row counts
(`bucket_rows`, `padded_rows`), and each shape compiles once. The rule is written here only.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512)
# Finer steps, for models that run on many short inputs per call (the reward's seq2seq stages): the
# encoder is compute-bound, so a padded column costs as much as a real one, and powers of two pad
# an input of 65 tokens to 128. More shapes compile, each once.
FINE_BUCKETS = (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448,
                512)
# Finer still, for the sentence embedder, which reads short sentences by the thousand: every length
# up to 31, then steps of 4, 8, 16 and 32. Padding costs as much as real tokens, and each of the
# ~60 shapes compiles once per process (benchmarks/results/sage.json measures the trade).
SENTENCE_BUCKETS = (*range(1, 32), *range(32, 64, 4), *range(64, 128, 8), *range(128, 256, 16),
                    *range(256, 513, 32))
POWER_OF_TWO_BUCKETS = tuple(2 ** k for k in range(3, 16))  # 8 ... 32768


def bucket_length(n: int, buckets: Sequence[int] = DEFAULT_BUCKETS, *,
                  cap: int | None = None) -> int:
    """The smallest bucket >= `n`, never above `cap` (inputs truncated to `cap` make it the last
    bucket). Past the largest bucket, `n` is rounded up to a multiple of it (512, 1024, ...)."""
    if n < 0:
        raise ValueError(f"bucket_length: negative length {n}")
    if not buckets or list(buckets) != sorted(buckets) or buckets[0] < 1:
        raise ValueError(f"bucket_length: buckets must be increasing positive ints, got {buckets}")
    length = next((int(b) for b in buckets if n <= b), None)
    if length is None:
        largest = buckets[-1]
        length = int(-(-n // largest) * largest)
    return length if cap is None else min(length, int(cap))


def column_buckets(buckets: Sequence[int], max_length: int) -> tuple[int, ...]:
    """The padded lengths of one column of a dataset: the given ones below `max_length`, then
    `max_length` (no buckets given: powers of two from 8)."""
    buckets = buckets or POWER_OF_TWO_BUCKETS
    return tuple(sorted({b for b in buckets if b < max_length} | {max_length}))


def bucket_rows(n: int, batch_size: int) -> int:
    """Rows for a batch of n <= batch_size sequences: batch_size, or a power of two for the rest."""
    return batch_size if n >= batch_size else min(batch_size, 1 << max(0, n - 1).bit_length())


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


def equal_chunks(n: int, size: int) -> list[slice]:
    """ceil(n / size) slices of n rows whose sizes differ by at most one, so that each batch pads
    to the same shapes (a short last chunk would compile every stage again)."""
    k = max(1, -(-n // size))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Indices of the inputs, sorted by length, cut into batches of at most batch_size (so that a
    batch pads to the bucket of lengths close to its own)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


def pad_sequences(sequences: Sequence[Sequence[int]], rows: int, length: int,
                  fill: int) -> np.ndarray:
    """Right-pad `sequences` (each <= length) into an int32 array [rows, length] of `fill`."""
    out = np.full((rows, length), fill, dtype=np.int32)
    for i, seq in enumerate(sequences):
        out[i, : len(seq)] = seq
    return out


def encoding_batches(encodings: Sequence, batch_size: int, max_length: int, pad_id: int, *,
                     token_types: bool = True, shards: int = 1):
    """The padded batches of tokenized texts or text pairs (`tokenizers` Encodings, with .ids,
    .attention_mask and .type_ids): length-sorted, each padded to its length bucket (capped at
    max_length) and to `bucket_rows` rows, a multiple of `shards`. Yields (index, chosen, ids,
    mask, types): the inputs' positions, their Encodings, and [rows, length] int32 arrays
    (types all 0 when the model has no token types)."""
    lengths = [len(e.ids) for e in encodings]
    for index in length_sorted_batches(lengths, batch_size):
        length = bucket_length(max(lengths[i] for i in index), cap=max_length)
        rows = -(-bucket_rows(len(index), batch_size) // shards) * shards
        chosen = [encodings[i] for i in index]
        ids = pad_sequences([e.ids for e in chosen], rows, length, pad_id)
        mask = pad_sequences([e.attention_mask for e in chosen], rows, length, 0)
        types = pad_sequences([e.type_ids for e in chosen], rows, length, 0)
        yield index, chosen, ids, mask, types if token_types else np.zeros_like(types)
