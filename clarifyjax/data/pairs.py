"""δ-CLARIFY, silver, fusion and judge files -> (input, target) pairs -> padded, bucketed batches.

Three layers, each usable alone:

1. **Tables** (`clarifyjax.files.tables`, re-exported here). `read_table(path, columns)` reads a TSV /
   CSV / JSONL file with the standard `csv` module and keeps each row's line number; a missing
   file, a missing column, a malformed row or an empty field raises `DataError` naming the file
   (and the line and column).
2. **Pairs.** `question_pairs`, `wh_question_pairs`, `answerer_pairs`, `fusion_pairs`,
   `judge_pairs` turn rows into `Pair(input, target, group)` with the formats of `clarifyjax.text.formats`;
   ``group`` is the situation, so that `split_by_group` can make seeded splits in which no dev
   situation is seen in training (silver and fusion have no train split). `unique_situations` gives
   PPO's prompts. `load_sft_pairs(data_config, task)` does all of this for a config.
3. **Batches.** `TokenizedDataset` encodes every text once into [N, max_length] id matrices.
   `BatchIterator` yields endless shuffled training batches: each global batch is padded to the
   length bucket of its longest row (so jitted shapes repeat, and every host pads alike), and each
   host gets its own contiguous slice of it. Its `position` ({epoch, index, seed, ...}) goes into
   checkpoints; an iterator built with that position continues with exactly the same batches, for
   any number of hosts. `eval_batches` covers a dataset once, padding the last batch with masked rows.

A batch is a dict of numpy arrays (local rows only), for a dataset with columns ``input`` and
``target``::

    input_ids, input_mask    int32 [local_batch, Ti]
    target_ids, target_mask  int32 [local_batch, Tt]
    index                    int32 [local_batch]   row of the dataset (texts: dataset.texts[...])
    example_mask             int32 [local_batch]   0 on padding rows (eval only)
"""
from __future__ import annotations

import dataclasses
import os
import re
import warnings
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from clarifyjax.data import discriminator
from clarifyjax.text import formats as fmt
from clarifyjax.files.tables import (REPO_ROOT, DataError, Table, check_data_paths,  # noqa: F401
                               read_table, resolve_data_path)
from clarifyjax.core.buckets import bucket_length, column_buckets

GOLD_COLUMNS = ("id", "source", "situation", "question")
SILVER_COLUMNS = ("Hypothesis", "Update", "UpdateType", "question_davinci", "situation")
FUSION_COLUMNS = ("input", "output")
TASKS = ("question", "wh_question", "answerer", "fusion", "judge", "discriminator")


# --------------------------------------------------------------------------- pairs


class Pair(NamedTuple):
    """One supervised example; ``group`` (the situation) keeps related rows in one split."""

    input: str  # (situation, question) for the discriminator (`discriminator_pairs`)
    target: str
    group: str


def _pairs(table: Table, make) -> list[Pair]:
    out = []
    for i, row in enumerate(table.rows):
        try:
            source, target, group = make(row, table.where(i))
            out.append(Pair(source, target, fmt.normalize_whitespace(group)))
        except fmt.TextFormatError as e:
            raise DataError(str(e)) from e
    return out


def question_pairs(table: Table) -> list[Pair]:
    """train/dev/test.tsv -> ("question: {situation}", question)."""
    return _pairs(table, lambda r, w: (*fmt.question_sft_example(r["situation"], r["question"],
                                                                  where=w), r["situation"]))


def wh_question_pairs(table: Table) -> list[Pair]:
    """train/dev/test.tsv -> ("{situation} Q.: {wh-word}", question).

    A question with no word to condition on (train.tsv line 14492 is just "?") makes no example:
    such rows are left out with a warning that names their lines.
    """
    wordless = [i for i, r in enumerate(table.rows) if not re.search(r"\w", r["question"])]
    if wordless:
        warnings.warn(f"{table.path}: {len(wordless)} row(s) whose question has no word are left "
                      f"out of the wh-question pairs (lines "
                      f"{', '.join(str(table.lines[i]) for i in wordless[:10])}"
                      f"{', ...' if len(wordless) > 10 else ''})", stacklevel=2)
        skip = set(wordless)
        table = dataclasses.replace(
            table, rows=[r for i, r in enumerate(table.rows) if i not in skip],
            lines=[n for i, n in enumerate(table.lines) if i not in skip])
    return _pairs(table, lambda r, w: (*fmt.wh_question_sft_example(
        r["situation"], r["question"], where=w), r["situation"]))


def answerer_pairs(table: Table) -> list[Pair]:
    """sc_dev_questions_gpt.tsv -> ("answer: {Hypothesis} TYPE: {UpdateType} QUESTION: {q}", Update)."""
    return _pairs(table, lambda r, w: (*fmt.answer_sft_from_row(r, where=w), r["situation"]))


_FUSION_SITUATION = re.compile(r"^SITUATION: (.*?) QUESTION:")


def fusion_pairs(table: Table) -> list[Pair]:
    """fusion_dev.csv -> ("merge: " + input, output), grouped by the input's situation."""
    def make(row, where):
        match = _FUSION_SITUATION.match(row["input"].strip())
        if not match:
            raise DataError(f"{where}: column 'input' does not start with 'SITUATION: ... "
                            f"QUESTION:': {row['input'][:80]!r}")
        return (*fmt.fusion_sft_from_row(row, where=where), match.group(1))
    return _pairs(table, make)


def judge_pairs(table: Table, text_column: str = "text", label_column: str = "class") -> list[Pair]:
    """A (text, class) table -> ("[moral_single]: " + text, "<class>{1|0|-1}</class> <text>..</text>").

    Labels are 1/0/-1 or good/ok/bad. A ``judgment`` column, when present, fills <text>.
    """
    for c in (text_column, label_column):
        if c not in table.columns:
            raise DataError(f"{table.path}: missing column {c!r}; the file has {list(table.columns)}")
    def make(row, where):
        judgment = row.get("judgment") or None
        return (*fmt.judge_sft_example(row[text_column], row[label_column], judgment, where=where),
                fmt.normalize_whitespace(row[text_column]))
    return _pairs(table, make)


def discriminator_pairs(table: Table) -> list[Pair]:
    """(situation, question, label) rows (`clarifyjax discriminator-data`) -> pairs whose input
    is the (situation, question) tuple, an encoder classifier's two segments, and whose target is
    the class id "1" (relevant) or "0" (irrelevant) (`classifier_dataset`)."""
    def make(row, where):
        pair = (fmt.normalize_whitespace(row["situation"]),
                fmt.normalize_whitespace(row["question"]))
        if not all(pair):
            raise fmt.TextFormatError(f"{where}: empty field "
                                      f"{'situation' if not pair[0] else 'question'!r}")
        return pair, str(fmt.discriminator_label(row["label"], where=where)), row["situation"]
    return _pairs(table, make)


# Polarity of a silver hypothesis (a Social-Chemistry rule of thumb), first match wins.
_NEGATIVE = re.compile(
    r"\b(wrong|rude|bad|mean|unacceptable|hurtful|shouldn't|should not|not (okay|ok|good|right|"
    r"acceptable|nice|polite|appropriate|fair)|inappropriate|selfish|cruel|unfair|disrespectful|"
    r"irresponsible|immoral|frowned upon|insensitive|dangerous|illegal)\b", re.IGNORECASE)
_NEUTRAL = re.compile(r"\b(okay|ok|understandable|normal|fine|acceptable|reasonable|allowed|"
                      r"natural)\b", re.IGNORECASE)
_POSITIVE = re.compile(r"\b(good|should|expected|polite|nice|kind|best|important|right|great|"
                       r"helpful|considerate|responsible|admirable|appropriate|ought)\b",
                       re.IGNORECASE)
# class of "situation + update" given the hypothesis' class: a strengthener keeps it, a weakener
# moves a good / bad act to "ok" and an ok act to "bad".
_WEAKENED = {1: 0, -1: 0, 0: -1}


def hypothesis_polarity(hypothesis: str) -> int | None:
    """1 (good), 0 (ok), -1 (bad) for a rule of thumb, or None when no cue word matches."""
    for pattern, label in ((_NEGATIVE, -1), (_NEUTRAL, 0), (_POSITIVE, 1)):
        if pattern.search(hypothesis):
            return label
    return None


def silver_judge_rows(table: Table) -> Table:
    """Silver (text, class) judgments derived from sc_dev_questions_gpt.tsv (a documented heuristic,
    for training a small judge when no judgment data is at hand).

    The hypothesis' polarity (cue words: "wrong", "rude" -> -1; "okay", "understandable" -> 0;
    "good", "should" -> 1) labels the bare situation; "situation + update" keeps it for a
    strengthener and moves it for a weakener (good/bad -> ok, ok -> bad). Rows without a cue are
    left out; duplicates are kept once. Columns: text, class.
    """
    rows, lines, seen = [], [], set()
    for i, row in enumerate(table.rows):
        polarity = hypothesis_polarity(row["Hypothesis"])
        if polarity is None:
            continue
        situation = fmt.ensure_period(fmt.normalize_whitespace(row["situation"]))
        update = fmt.normalize_whitespace(row["Update"])
        kind = row["UpdateType"].strip().lower()
        if kind not in fmt.UPDATE_TYPES:
            raise DataError(f"{table.where(i)}: column 'UpdateType' must be one of "
                            f"{fmt.UPDATE_TYPES}, got {row['UpdateType']!r}")
        label = polarity if kind == fmt.STRENGTHENER else _WEAKENED[polarity]
        for text, cls in ((situation, polarity), (f"{situation} {update}", label)):
            if (text, cls) not in seen:
                seen.add((text, cls))
                rows.append({"text": text, "class": str(cls)})
                lines.append(table.lines[i])
    return Table(table.path, ("text", "class"), rows, lines)


def unique_situations(table: Table) -> list[str]:
    """The distinct situations of a table (whitespace-normalized), in order of first appearance."""
    return list(dict.fromkeys(fmt.normalize_whitespace(r["situation"]) for r in table.rows))


def split_by_group(pairs: Sequence[Pair], dev_fraction: float, seed: int
                   ) -> tuple[list[Pair], list[Pair]]:
    """Seeded (train, dev) split of whole groups: ``round(dev_fraction * groups)`` groups (at least
    one) go to dev. Deterministic for a seed; pairs keep their file order within each split."""
    if not 0.0 < dev_fraction < 1.0:
        raise ValueError(f"dev_fraction must be in (0, 1), got {dev_fraction}")
    groups = list(dict.fromkeys(p.group for p in pairs))
    if len(groups) < 2:
        raise DataError(f"cannot split {len(pairs)} pairs with {len(groups)} situation(s) in two")
    n_dev = min(len(groups) - 1, max(1, round(dev_fraction * len(groups))))
    order = np.random.default_rng(seed).permutation(len(groups))
    dev_groups = {groups[i] for i in order[:n_dev]}
    return ([p for p in pairs if p.group not in dev_groups],
            [p for p in pairs if p.group in dev_groups])


def read_pairs(path: str | os.PathLike, task: str, *, text_column: str = "text",
               label_column: str = "class", judge_source: str = "table") -> list[Pair]:
    """The pairs of one file for one SFT task (see `TASKS`)."""
    if task in ("question", "wh_question"):
        table = read_table(path, GOLD_COLUMNS[2:])
        return question_pairs(table) if task == "question" else wh_question_pairs(table)
    if task == "answerer":
        return answerer_pairs(read_table(path, SILVER_COLUMNS))
    if task == "fusion":
        return fusion_pairs(read_table(path, FUSION_COLUMNS))
    if task == "judge":
        if judge_source == "silver":
            return judge_pairs(silver_judge_rows(read_table(path, SILVER_COLUMNS)))
        return judge_pairs(read_table(path, (text_column, label_column)), text_column, label_column)
    if task == "discriminator":
        return discriminator_pairs(read_table(path, discriminator.COLUMNS))
    raise DataError(f"unknown SFT task {task!r}; expected one of {TASKS}")


def load_sft_pairs(data, task: str) -> tuple[list[Pair], list[Pair]]:
    """(train, dev) pairs for an `SFTDataConfig`: dev from ``dev_path`` or a seeded group split;
    ``train_fraction`` of the training situations (seeded, whole groups), ``train_rows`` after a
    seeded shuffle of train, ``dev_rows`` the first dev pairs."""
    kw = dict(text_column=data.text_column, label_column=data.label_column,
              judge_source=data.judge_source)
    train = read_pairs(resolve_data_path(data.train_path, "data.train_path"), task, **kw)
    if data.dev_path is None:
        train, dev = split_by_group(train, data.dev_fraction, data.split_seed)
    else:
        dev = read_pairs(resolve_data_path(data.dev_path, "data.dev_path"), task, **kw)
    if data.train_fraction is not None:
        groups = list(dict.fromkeys(p.group for p in train))
        k = max(1, round(data.train_fraction * len(groups)))
        order = np.random.default_rng(data.split_seed).permutation(len(groups))
        chosen = {groups[i] for i in order[:k]}
        train = [p for p in train if p.group in chosen]
    if data.train_rows is not None and data.train_rows < len(train):
        keep = np.sort(np.random.default_rng(data.split_seed).permutation(len(train))[
            :data.train_rows])
        train = [train[i] for i in keep]
    if data.dev_rows is not None:
        dev = dev[:data.dev_rows]
    return train, dev


def load_ppo_situations(data) -> tuple[list[str], list[str]]:
    """(train, dev) unique situations for a `PPODataConfig` (dev cut to ``dev_situations``)."""
    train = unique_situations(read_table(resolve_data_path(data.train_path, "data.train_path"),
                                         ("situation",)))
    dev = [] if data.dev_path is None else unique_situations(read_table(
        resolve_data_path(data.dev_path, "data.dev_path"), ("situation",)))
    if data.dev_situations is not None:
        dev = dev[:data.dev_situations]
    return train, dev


def as_hf_dataset(pairs: Sequence[Pair]):
    """The pairs as a `datasets.Dataset` with columns input, target, group (in memory, no hub)."""
    import datasets

    return datasets.Dataset.from_dict({"input": [p.input for p in pairs],
                                       "target": [p.target for p in pairs],
                                       "group": [p.group for p in pairs]})


# --------------------------------------------------------------------------- tokenized batches


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
                      buckets: Sequence[int] = ()) -> TokenizedDataset:
    """PPO prompts: column input = "question: " + situation; ``texts["situation"]`` keeps the
    bare situations for the reward models (``texts`` has no ids for it)."""
    prompts = [fmt.policy_input(s) for s in situations]
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
