"""Pairs as tokenized, padded, bucketed batches that resume at a saved position.

`TokenizedDataset` encodes every text once. `BatchIterator` yields endless shuffled batches, each
padded to its length bucket and split by host; its `position` goes into checkpoints and resumes
the same batches on any number of hosts. `eval_batches` covers a dataset once. A batch is a dict of
numpy arrays: input_ids / input_mask / target_ids / target_mask [local_batch, T], index (the
dataset row) and, in eval, example_mask (0 on padding rows)."""
from __future__ import annotations

from typing import Any
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from clarifyjax.core.buckets import bucket_length, column_buckets
from clarifyjax.data.pairs import Pair
from clarifyjax.files.tables import DataError
from clarifyjax.text import formats


class TokenizedDataset:
    """Texts encoded once into [N, max_length] int32 matrices, one per column.

    Args:
      texts: column name -> N texts (e.g. {"input": [...], "target": [...]}).
      tokenizer: anything with ``encode_batch(texts, max_length, pad_to=None) -> (ids, mask)``.
      max_lengths: column name -> max tokens (EOS included; longer texts are truncated).
      buckets: padded lengths of batches (see `buckets.column_buckets`), shared by all columns.
    """

    def __init__(self, texts: Mapping[str, Sequence[str]], tokenizer, max_lengths: Mapping[str, int],
                 buckets: Sequence[int] = (), *, chunk: int = 2048):
        sizes = {name: len(column) for name, column in texts.items()}
        if len(set(sizes.values())) != 1:
            raise DataError(f"columns of different lengths: {sizes}")
        self.texts = {name: list(column) for name, column in texts.items()}
        self.size = next(iter(sizes.values()))
        self.ids: dict[str, np.ndarray] = {}
        self.lengths: dict[str, np.ndarray] = {}
        self.buckets: dict[str, tuple[int, ...]] = {}
        for name, column in self.texts.items():
            if name not in max_lengths:
                raise DataError(f"no max length for column {name!r}")
            length = int(max_lengths[name])
            parts_ids, parts_len = [], []
            for start in range(0, self.size, chunk):
                ids, mask = tokenizer.encode_batch(column[start:start + chunk], length,
                                                   pad_to=length)
                parts_ids.append(np.asarray(ids, np.int32))
                parts_len.append(np.asarray(mask).sum(axis=1).astype(np.int32))
            self.ids[name] = (np.concatenate(parts_ids) if parts_ids
                              else np.zeros((0, length), np.int32))
            self.lengths[name] = (np.concatenate(parts_len) if parts_len
                                  else np.zeros((0,), np.int32))
            self.buckets[name] = column_buckets(buckets, length)

    def __len__(self) -> int:
        return self.size

    def pad_lengths(self, global_indices: np.ndarray) -> dict[str, int]:
        """Per column, the bucket of the longest row among `global_indices` (same on every host)."""
        return {name: bucket_length(int(self.lengths[name][global_indices].max(initial=1)),
                                    self.buckets[name]) for name in self.ids}

    def gather(self, indices: np.ndarray, pad_lengths: Mapping[str, int],
               example_mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The batch of rows `indices`, each column cut to its padded length."""
        indices = np.asarray(indices, np.int64)
        batch: dict[str, np.ndarray] = {}
        for name, ids in self.ids.items():
            width = pad_lengths[name]
            rows = ids[indices, :width]
            batch[f"{name}_ids"] = rows
            batch[f"{name}_mask"] = (np.arange(width)[None, :]
                                     < self.lengths[name][indices][:, None]).astype(np.int32)
        batch["index"] = indices.astype(np.int32)
        batch["example_mask"] = (np.ones(len(indices), np.int32) if example_mask is None
                                 else example_mask.astype(np.int32))
        return batch


def sft_dataset(pairs: Sequence[Pair], tokenizer, model, buckets: Sequence[int] = ()
                ) -> TokenizedDataset:
    """Columns input / target of `pairs`, with the lengths of a `ModelConfig`."""
    return TokenizedDataset({"input": [p.input for p in pairs], "target": [p.target for p in pairs]},
                            tokenizer, {"input": model.max_input_length,
                                        "target": model.max_target_length}, buckets)


class _PairEncoder:
    """`TokenizedDataset`'s tokenizer interface over an encoder's `tokenizers.Tokenizer`
    (`hf.load_encoder_tokenizer`: truncation set, padding off) for (a, b) text pairs."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode_batch(self, pairs, max_length: int, pad_to: int | None = None):
        encodings = self.tokenizer.encode_batch([tuple(p) for p in pairs])
        width = pad_to or max(len(e.ids) for e in encodings)
        ids = np.zeros((len(pairs), width), np.int32)
        mask = np.zeros((len(pairs), width), np.int32)
        for i, e in enumerate(encodings):
            n = min(len(e.ids), max_length, width)
            ids[i, :n], mask[i, :n] = e.ids[:n], 1
        return ids, mask


def classifier_dataset(pairs: Sequence[Pair], tokenizer, max_length: int,
                       buckets: Sequence[int] = ()) -> TokenizedDataset:
    """An encoder classifier's examples: column input = the pair's two segments encoded
    together by `tokenizer` (a `tokenizers.Tokenizer`, e.g. [CLS] a [SEP] b [SEP]), at most
    `max_length` tokens, length-bucketed; column target = the class id (one "token", so batches
    have the SFT layout: target_ids [b, 1])."""
    ds = TokenizedDataset({"input": [p.input for p in pairs]}, _PairEncoder(tokenizer),
                          {"input": max_length}, buckets)
    try:
        labels = np.array([int(p.target) for p in pairs], np.int32).reshape(-1, 1)
    except ValueError as e:
        raise DataError(f"classifier targets must be class ids: {e}") from e
    ds.texts["target"] = [p.target for p in pairs]
    ds.ids["target"], ds.lengths["target"] = labels, np.ones(len(pairs), np.int32)
    ds.buckets["target"] = (1,)
    return ds


def situation_dataset(situations: Sequence[str], tokenizer, max_input_length: int,
                      buckets: Sequence[int] = (), prompt=formats.policy_input) -> TokenizedDataset:
    """PPO prompts: column input = prompt(situation) (a T5's "question: " + situation, or a
    decoder policy's `rl.prompts.CausalPolicyText.prompt`); ``texts["situation"]`` keeps the bare
    situations for the reward models (``texts`` has no ids for it)."""
    prompts = [prompt(s) for s in situations]
    ds = TokenizedDataset({"input": prompts}, tokenizer, {"input": max_input_length}, buckets)
    ds.texts["situation"] = list(situations)
    return ds


def _host(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is not in [0, {process_count})")
    return process_index, process_count


class BatchIterator:
    """Endless shuffled training batches of a `TokenizedDataset`, resumable and host-sharded.

    Epoch ``e`` visits the rows in the order ``default_rng([seed, e]).permutation(N)``, in
    ``N // global_batch_size`` full batches (the remainder is dropped, a different one each epoch).
    Host ``p`` of ``P`` gets rows ``[p * B/P, (p + 1) * B/P)`` of every global batch, so the hosts'
    shards are disjoint, cover the batch, and the global batch does not depend on ``P``.

    ``position`` is where the *next* batch comes from: save it together with the train state that
    has consumed every earlier batch, and pass it back as ``position=`` to continue identically.
    """

    def __init__(self, dataset: TokenizedDataset, global_batch_size: int, *, seed: int = 0,
                 shuffle: bool = True, position: Mapping[str, Any] | None = None,
                 process_index: int | None = None, process_count: int | None = None):
        self.dataset = dataset
        self.global_batch_size = int(global_batch_size)
        self.process_index, self.process_count = _host(process_index, process_count)
        if self.global_batch_size < 1 or self.global_batch_size % self.process_count:
            raise ValueError(f"global batch size {global_batch_size} must be a positive multiple "
                             f"of the process count {self.process_count}")
        if len(dataset) < self.global_batch_size:
            raise DataError(f"the dataset has {len(dataset)} rows, fewer than one batch of "
                            f"{self.global_batch_size}")
        self.local_batch_size = self.global_batch_size // self.process_count
        self.steps_per_epoch = len(dataset) // self.global_batch_size
        self.shuffle = bool(shuffle)
        self.seed, self.epoch, self.index = int(seed), 0, 0
        self._order_epoch, self._order = None, None
        if position is not None:
            self.restore(position)

    @property
    def position(self) -> dict[str, Any]:
        """JSON-ready {epoch, index, seed, num_examples, global_batch_size, shuffle}."""
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed,
                "num_examples": len(self.dataset), "global_batch_size": self.global_batch_size,
                "shuffle": self.shuffle}

    def restore(self, position: Mapping[str, Any]) -> None:
        """Continue from a saved `position` (its seed wins).

        Raises:
          DataError: a field is missing, or the dataset size or batch size changed since (the
            batches would differ).
        """
        for key in ("epoch", "index", "seed"):
            if key not in position:
                raise DataError(f"data position {dict(position)} lacks {key!r}")
        for key, mine in (("num_examples", len(self.dataset)),
                          ("global_batch_size", self.global_batch_size),
                          ("shuffle", self.shuffle)):
            if key in position and position[key] != mine:
                raise DataError(f"cannot resume: the data position was saved with {key}="
                                f"{position[key]}, but this iterator has {key}={mine}")
        epoch, index = int(position["epoch"]), int(position["index"])
        if epoch < 0 or not 0 <= index < self.steps_per_epoch:
            raise DataError(f"data position epoch={epoch}, index={index} is out of range "
                            f"({self.steps_per_epoch} batches per epoch)")
        self.seed, self.epoch, self.index = int(position["seed"]), epoch, index

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != (epoch, self.seed):
            n = len(self.dataset)
            self._order = (np.random.default_rng([self.seed, epoch]).permutation(n)
                           if self.shuffle else np.arange(n))
            self._order_epoch = (epoch, self.seed)
        return self._order

    def global_indices(self, epoch: int, index: int) -> np.ndarray:
        """Rows of global batch `index` of `epoch`: int64 [global_batch]."""
        start = index * self.global_batch_size
        return self._epoch_order(epoch)[start:start + self.global_batch_size]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        rows = self.global_indices(self.epoch, self.index)
        lo = self.process_index * self.local_batch_size
        batch = self.dataset.gather(rows[lo:lo + self.local_batch_size],
                                    self.dataset.pad_lengths(rows))
        self.index += 1
        if self.index == self.steps_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        return batch


def eval_batches(dataset: TokenizedDataset, global_batch_size: int, *,
                 process_index: int | None = None, process_count: int | None = None
                 ) -> Iterator[dict[str, np.ndarray]]:
    """Every row once, in order, in ``ceil(N / B)`` batches of the full size B; the rows that pad
    the last batch repeat row 0 and have ``example_mask`` 0. Host-sharded like `BatchIterator`."""
    p, n_proc = _host(process_index, process_count)
    if global_batch_size < 1 or global_batch_size % n_proc:
        raise ValueError(f"eval batch size {global_batch_size} must be a positive multiple of "
                         f"the process count {n_proc}")
    local = global_batch_size // n_proc
    for start in range(0, len(dataset), global_batch_size):
        rows = np.arange(start, min(start + global_batch_size, len(dataset)))
        mask = np.zeros(global_batch_size, np.int32)
        mask[:len(rows)] = 1
        rows = np.concatenate([rows, np.zeros(global_batch_size - len(rows), np.int64)])
        lengths = dataset.pad_lengths(rows[mask.astype(bool)])
        sl = slice(p * local, (p + 1) * local)
        yield dataset.gather(rows[sl], lengths, mask[sl])
