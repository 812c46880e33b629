"""δ-CLARIFY, silver, fusion and judge files -> (input, target) pairs.

`question_pairs`, `wh_question_pairs`, `answerer_pairs`, `fusion_pairs` and `judge_pairs` turn
table rows (`clarifyjax.files.tables`) into `Pair(input, target, group)`; ``group`` is the
situation, so `split_by_group` keeps dev situations out of training. `load_sft_pairs(data_config,
task)` does it all for a config; batches are `clarifyjax.data.batches`."""
from __future__ import annotations

import dataclasses
import os
import re
import warnings
from typing import NamedTuple
from collections.abc import Sequence

import numpy as np

from clarifyjax.data import discriminator
from clarifyjax.text import formats
from clarifyjax.files.tables import (REPO_ROOT, DataError, Table, check_data_paths,  # noqa: F401
                               read_table, resolve_data_path)

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
            out.append(Pair(source, target, formats.normalize_whitespace(group)))
        except formats.TextFormatError as e:
            raise DataError(str(e)) from e
    return out


def question_pairs(table: Table) -> list[Pair]:
    """train/dev/test.tsv -> ("question: {situation}", question)."""
    return _pairs(table, lambda r, w: (*formats.question_sft_example(r["situation"], r["question"],
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
    return _pairs(table, lambda r, w: (*formats.wh_question_sft_example(
        r["situation"], r["question"], where=w), r["situation"]))


def answerer_pairs(table: Table) -> list[Pair]:
    """sc_dev_questions_gpt.tsv -> ("answer: {Hypothesis} TYPE: {UpdateType} QUESTION: {q}", Update)."""
    return _pairs(table, lambda r, w: (*formats.answer_sft_from_row(r, where=w), r["situation"]))


_FUSION_SITUATION = re.compile(r"^SITUATION: (.*?) QUESTION:")


def fusion_pairs(table: Table) -> list[Pair]:
    """fusion_dev.csv -> ("merge: " + input, output), grouped by the input's situation."""
    def make(row, where):
        match = _FUSION_SITUATION.match(row["input"].strip())
        if not match:
            raise DataError(f"{where}: column 'input' does not start with 'SITUATION: ... "
                            f"QUESTION:': {row['input'][:80]!r}")
        return (*formats.fusion_sft_from_row(row, where=where), match.group(1))
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
        return (*formats.judge_sft_example(row[text_column], row[label_column], judgment, where=where),
                formats.normalize_whitespace(row[text_column]))
    return _pairs(table, make)


def discriminator_pairs(table: Table) -> list[Pair]:
    """(situation, question, label) rows (`clarifyjax discriminator-data`) -> pairs whose input
    is the (situation, question) tuple, an encoder classifier's two segments, and whose target is
    the class id "1" (relevant) or "0" (irrelevant) (`classifier_dataset`)."""
    def make(row, where):
        pair = (formats.normalize_whitespace(row["situation"]),
                formats.normalize_whitespace(row["question"]))
        if not all(pair):
            raise formats.TextFormatError(f"{where}: empty field "
                                          f"{'situation' if not pair[0] else 'question'!r}")
        return pair, str(formats.discriminator_label(row["label"], where=where)), row["situation"]
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
        situation = formats.ensure_period(formats.normalize_whitespace(row["situation"]))
        update = formats.normalize_whitespace(row["Update"])
        kind = row["UpdateType"].strip().lower()
        if kind not in formats.UPDATE_TYPES:
            raise DataError(f"{table.where(i)}: column 'UpdateType' must be one of "
                            f"{formats.UPDATE_TYPES}, got {row['UpdateType']!r}")
        label = polarity if kind == formats.STRENGTHENER else _WEAKENED[polarity]
        for text, cls in ((situation, polarity), (f"{situation} {update}", label)):
            if (text, cls) not in seen:
                seen.add((text, cls))
                rows.append({"text": text, "class": str(cls)})
                lines.append(table.lines[i])
    return Table(table.path, ("text", "class"), rows, lines)


def unique_situations(table: Table) -> list[str]:
    """The distinct situations of a table (whitespace-normalized), in order of first appearance."""
    return list(dict.fromkeys(formats.normalize_whitespace(r["situation"]) for r in table.rows))


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
        return discriminator_pairs(read_table(path, discriminator.DISCRIMINATOR_COLUMNS))
    raise DataError(f"unknown SFT task {task!r}; expected one of {TASKS}")


def load_sft_pairs(data, task: str) -> tuple[list[Pair], list[Pair]]:
    """(train, dev) pairs for an `SFTDataConfig`: dev from ``dev_path`` or a seeded group split;
    ``train_fraction`` of the training situations (seeded, whole groups), ``train_rows`` after a
    seeded shuffle of train, ``dev_rows`` the first dev pairs. A file that gives no pair (a
    header and no rows) is a DataError."""
    kw = dict(text_column=data.text_column, label_column=data.label_column,
              judge_source=data.judge_source)
    path = resolve_data_path(data.train_path, "data.train_path")
    train = not_empty(read_pairs(path, task, **kw), path, f"{task} pairs", "data.train_path")
    if data.dev_path is None:
        train, dev = split_by_group(train, data.dev_fraction, data.split_seed)
    else:
        path = resolve_data_path(data.dev_path, "data.dev_path")
        dev = not_empty(read_pairs(path, task, **kw), path, f"{task} pairs", "data.dev_path")
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


def not_empty(items: list, path, what: str, option: str) -> list:
    """`items`, or a DataError naming the option and file when it gave none (a header and no
    rows)."""
    if not items:
        raise DataError(f"{option}: {path}: no {what} in it (only a header, or no row the task can use)")
    return items


def load_ppo_situations(data) -> tuple[list[str], list[str]]:
    """(train, dev) unique situations for a `PPODataConfig` (dev cut to ``dev_situations``);
    a file that holds none is a DataError."""
    path = resolve_data_path(data.train_path, "data.train_path")
    train = not_empty(unique_situations(read_table(path, ("situation",))), path, "situations",
                      "data.train_path")
    dev = []
    if data.dev_path is not None:
        path = resolve_data_path(data.dev_path, "data.dev_path")
        dev = not_empty(unique_situations(read_table(path, ("situation",))), path, "situations",
                        "data.dev_path")
    if data.dev_situations is not None:
        dev = dev[:data.dev_situations]
    return train, dev


def as_hf_dataset(pairs: Sequence[Pair]):
    """The pairs as a `datasets.Dataset` with columns input, target, group (in memory, no hub)."""
    import datasets

    return datasets.Dataset.from_dict({"input": [p.input for p in pairs],
                                       "target": [p.target for p in pairs],
                                       "group": [p.group for p in pairs]})
