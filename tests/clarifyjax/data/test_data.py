"""clarifyjax.data on the real δ-CLARIFY files: counts, formats, splits, batches, resume, host shards.

Row counts are those documented in ../shared/data/README.md. Formats are checked against string
templates written here (not through clarifyjax.text.formats). Batching is checked with a toy word
tokenizer defined here, and once end to end with the project's SentencePiece tokenizer.
"""
from __future__ import annotations

import collections
import functools
import io
import re

import numpy as np
import pytest

from clarifyjax import data
from clarifyjax.files import tables
from clarifyjax.core.buckets import column_buckets
from clarifyjax.config import SFTDataConfig, load_config
from helpers.env import REPO_ROOT, require, shared_data

PAD, EOS = 0, 1


class WordTokenizer:
    """Toy tokenizer with the project's interface: one id per word (3 + crc % 500), then EOS."""

    def encode_batch(self, texts, max_length, pad_to=None):
        import zlib

        width = max_length if pad_to is None else pad_to
        ids = np.full((len(texts), width), PAD, np.int32)
        mask = np.zeros((len(texts), width), np.int32)
        for i, text in enumerate(texts):
            row = [3 + zlib.crc32(w.encode()) % 500 for w in text.split()][:max_length - 1] + [EOS]
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
        return ids, mask


@functools.cache
def gold(name):
    return tables.read_table(shared_data(f"delta-clarify/{name}"), data.GOLD_COLUMNS)


# --------------------------------------------------------------------------- counts and formats


def test_gold_counts_as_documented():
    for name, rows, situations in (("train.tsv", 27475, 5432), ("dev.tsv", 2490, 500),
                                   ("test.tsv", 2505, 501)):
        table = gold(name)
        assert len(table) == rows
        assert len({r["situation"] for r in table.rows}) == situations
    # train.tsv spells one situation twice, once with a double space: normalized, they are one
    assert len(data.unique_situations(gold("train.tsv"))) == 5431
    assert data.unique_situations(gold("dev.tsv"))[:2] == [
        "It's understood that sometimes things don't work out.", "trying to forgive people"]


def test_silver_and_fusion_counts_as_documented():
    silver = tables.read_table(shared_data("delta-clarify/sc_dev_questions_gpt.tsv"), data.SILVER_COLUMNS)
    assert len(silver) == 1676
    assert collections.Counter(r["UpdateType"] for r in silver.rows) == {
        "strengthener": 868, "weakener": 808}
    assert sum(r["situation"] == r["Hypothesis"] for r in silver.rows) == 708
    fusion = tables.read_table(shared_data("delta-clarify/fusion_dev.csv"), data.FUSION_COLUMNS)
    assert len(fusion) == 9928
    pairs = data.fusion_pairs(fusion)
    assert len({p.group for p in pairs}) == 4843


def test_quoted_fields_are_unquoted():
    # train.tsv quotes fields that contain quotes ("... says ""I love you"" ..."): csv rules apply
    rows = [r for r in gold("train.tsv").rows if r["id"] == "20051"]
    assert rows[0]["situation"].startswith('Eric picks up the phone and says "I.....love')


def test_pair_formats_match_the_original_templates():
    table = gold("dev.tsv")
    for row, pair in zip(table.rows[:200], data.question_pairs(table)):
        assert pair.input == "question: " + " ".join(row["situation"].split())
        assert pair.target == " ".join(row["question"].split())
    for row, pair in zip(table.rows[:200], data.wh_question_pairs(table)):
        first = re.sub(r"[^\w']+$", "", row["question"].split()[0]).lower()
        assert pair.input == " ".join(row["situation"].split()) + " Q.: " + first
    silver = tables.read_table(shared_data("delta-clarify/sc_dev_questions_gpt.tsv"), data.SILVER_COLUMNS)
    for row, pair in zip(silver.rows[:200], data.answerer_pairs(silver)):
        assert pair.input == (f"answer: {row['Hypothesis']} TYPE: {row['UpdateType']} "
                              f"QUESTION: {row['question_davinci']}")
        assert pair.target == row["Update"].strip()
    fusion = tables.read_table(shared_data("delta-clarify/fusion_dev.csv"), data.FUSION_COLUMNS)
    for row, pair in zip(fusion.rows[:200], data.fusion_pairs(fusion)):
        assert pair.input == "merge: " + " ".join(row["input"].split())  # whitespace collapsed
        assert pair.target == " ".join(row["output"].split())
        assert pair.input.startswith("merge: SITUATION: " + pair.group + " QUESTION: ")


def test_judge_pairs_from_a_table_and_from_silver(tmp_path):
    table = tmp_path / "judge.tsv"
    table.write_text("text\tclass\nhelping a friend\t1\nlying to mom\tbad\nsleeping in\tok\n")
    pairs = data.read_pairs(table, "judge")
    assert [p.input for p in pairs] == ["[moral_single]: helping a friend",
                                        "[moral_single]: lying to mom", "[moral_single]: sleeping in"]
    assert [re.match(r"<class>(-?\d)</class> <text>.+</text>$", p.target).group(1)
            for p in pairs] == ["1", "-1", "0"]
    silver = tables.read_table(shared_data("delta-clarify/sc_dev_questions_gpt.tsv"), data.SILVER_COLUMNS)
    rows = data.silver_judge_rows(silver)
    labels = collections.Counter(r["class"] for r in rows.rows)
    assert set(labels) == {"-1", "0", "1"} and len(rows) > 1500
    # the heuristic, checked on rows whose hypothesis is unambiguous
    by_text = {r["text"]: r["class"] for r in rows.rows}
    assert by_text["help your family with funeral expenses."] == "1"
    assert by_text["help your family with funeral expenses. They have asked you to chip in"] == "1"
    assert by_text["help your family with funeral expenses. You are not financially stable to help out"] == "0"
    assert data.hypothesis_polarity("It's wrong to lie.") == -1
    assert data.hypothesis_polarity("You shouldn't lie.") == -1
    assert data.hypothesis_polarity("It's okay to rest.") == 0
    assert data.hypothesis_polarity("Dogs bark.") is None


def test_seeded_group_splits_are_disjoint_deterministic_and_complete():
    cfg = load_config(REPO_ROOT / "clarifyjax" / "presets" / "sft_fusion.yaml")
    train, dev = data.load_sft_pairs(cfg.data, cfg.task)
    again = data.load_sft_pairs(cfg.data, cfg.task)
    assert (train, dev) == again
    assert not {p.group for p in train} & {p.group for p in dev}
    assert len(train) + len(dev) == 9928
    assert round(0.1 * 4843) == len({p.group for p in dev})
    other = data.split_by_group(train + dev, 0.1, seed=1)[1]
    assert {p.group for p in other} != {p.group for p in dev}
    cfg = load_config(REPO_ROOT / "clarifyjax" / "presets" / "sft_answerer.yaml")
    train, dev = data.load_sft_pairs(cfg.data, cfg.task)
    assert len(train) + len(dev) == 1676 and not {p.group for p in train} & {p.group for p in dev}


def test_row_limits_and_ppo_situations():
    data_config = SFTDataConfig(train_path="../shared/data/delta-clarify/train.tsv", train_rows=2000,
                                dev_rows=100)
    shared_data("delta-clarify/train.tsv")
    train, dev = data.load_sft_pairs(data_config, "question")
    assert len(train) == 2000 and len(dev) == 100
    assert len({p.group for p in train}) > 1000  # a seeded sample, not the first 400 situations
    cfg = load_config(REPO_ROOT / "clarifyjax" / "presets" / "ppo_tiny.yaml")
    train_s, dev_s = data.load_ppo_situations(cfg.data)
    assert len(train_s) == 5431 and len(set(train_s)) == 5431
    assert len(dev_s) == cfg.data.dev_situations


@pytest.mark.reference
def test_hf_dataset_view():
    require("datasets")
    pairs = data.question_pairs(gold("dev.tsv"))[:10]
    ds = data.as_hf_dataset(pairs)
    assert ds.num_rows == 10 and ds[3]["input"] == pairs[3].input


# --------------------------------------------------------------------------- errors


def test_missing_file_column_and_malformed_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(tables.DataError, match="data file not found: nowhere/x.tsv"):
        tables.read_table("nowhere/x.tsv", ["a"])
    f = tmp_path / "t.tsv"
    f.write_text("id\tsource\tsituation\nA\tB\tC\n")
    with pytest.raises(tables.DataError, match=r"t\.tsv: missing column\(s\) \['question'\]"):
        data.read_pairs(f, "question")
    f.write_text("id\tsource\tsituation\tquestion\n1\tx\tfine\twhy?\n2\tx\tonly three\n")
    with pytest.raises(tables.DataError, match=r"t\.tsv:3: malformed row: 3 fields"):
        data.read_pairs(f, "question")
    f.write_text("id\tsource\tsituation\tquestion\n1\tx\tfine\twhy?\n2\tx\t \twhy?\n")
    with pytest.raises(tables.DataError, match=r"t\.tsv:3: column 'situation' is empty"):
        data.read_pairs(f, "question")
    f.write_text('id\tsource\tsituation\tquestion\n1\tx\t"multi\nline"\twhy?\n3\tx\ty\t"bad"q\n')
    with pytest.raises(tables.DataError, match=r"t\.tsv:4: malformed row"):
        data.read_pairs(f, "question")
    s = tmp_path / "s.tsv"
    s.write_text("Hypothesis\tUpdate\tUpdateType\tquestion_davinci\tsituation\n"
                 "It's good.\tu\tweakener\tq?\ts\nIt's good.\tu\tsideways\tq?\ts\n")
    with pytest.raises(tables.DataError, match=r"s\.tsv:3.*update_type"):
        data.read_pairs(s, "answerer")
    j = tmp_path / "j.jsonl"
    j.write_text('{"text": "a", "class": 1}\n{"text": "b", "class": 7}\n')
    with pytest.raises(tables.DataError, match=r"j\.jsonl:2.*label"):
        data.read_pairs(j, "judge")
    j.write_text('{"text": "a", "class": 1}\n{"text": "b"\n')
    with pytest.raises(tables.DataError, match=r"j\.jsonl:2: malformed JSON"):
        data.read_pairs(j, "judge")


def test_relative_paths_and_no_example_fallback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths still find ../shared/data beside the repository
    shared_data("delta-clarify/dev.tsv")
    assert tables.resolve_data_path("../shared/data/delta-clarify/dev.tsv").is_file()
    fake = tmp_path / "elsewhere" / "delta-clarify"
    fake.mkdir(parents=True)
    (fake / "mini.tsv").write_text("id\tsource\tsituation\tquestion\n1\tx\tsit\twhy?\n")
    monkeypatch.setenv("CLARIFYJAX_DATA", str(tmp_path / "elsewhere"))
    assert tables.resolve_data_path("../shared/data/delta-clarify/mini.tsv") == fake / "mini.tsv"
    # a path that exists nowhere is an error, even where examples/delta-clarify holds a file of
    # that name (which the old fallback read instead); the fallback belongs to the demo alone.
    # One line naming the option and the path.
    assert (tables.REPO_ROOT / "examples" / "delta-clarify" / "train.tsv").is_file()
    with pytest.raises(tables.DataError) as info:
        tables.read_table(tables.resolve_data_path("typo/delta-clarify/train.tsv", "data.train_path"),
                     data.GOLD_COLUMNS)
    message = str(info.value)
    assert "\n" not in message and message.startswith(
        "data.train_path: data file not found: typo/delta-clarify/train.tsv (looked at "
        f"{tmp_path / 'typo/delta-clarify/train.tsv'}, {tmp_path / 'elsewhere/typo'}"), message
    assert "examples" not in message
    with pytest.raises(tables.DataError, match=r"^data file not found: typo/delta-clarify/dev\.tsv"):
        tables.read_table("typo/delta-clarify/dev.tsv", data.GOLD_COLUMNS)  # without an option name


# --------------------------------------------------------------------------- batches


@pytest.fixture(scope="module")
def dev_dataset():
    pairs = data.question_pairs(gold("dev.tsv"))
    return data.TokenizedDataset({"input": [p.input for p in pairs],
                               "target": [p.target for p in pairs]},
                              WordTokenizer(), {"input": 40, "target": 24}, buckets=(8, 16, 32))


def test_batches_are_padded_to_buckets(dev_dataset):
    it = data.BatchIterator(dev_dataset, 32, seed=0, process_index=0, process_count=1)
    widths = collections.Counter()
    for _ in range(30):
        b = next(it)
        for col, buckets in (("input", (8, 16, 32, 40)), ("target", (8, 16, 24))):
            ids, mask = b[f"{col}_ids"], b[f"{col}_mask"]
            assert ids.dtype == np.int32 and ids.shape == mask.shape == (32, ids.shape[1])
            assert ids.shape[1] in buckets
            lengths = dev_dataset.lengths[col][b["index"]]
            assert (mask.sum(1) == lengths).all()
            assert ids.shape[1] == min(x for x in buckets if x >= lengths.max())  # tightest
            assert (ids[mask == 0] == PAD).all() and (ids[np.arange(32), lengths - 1] == EOS).all()
            widths[(col, ids.shape[1])] += 1
        texts = [dev_dataset.texts["input"][i] for i in b["index"]]
        ref, _ = WordTokenizer().encode_batch(texts, 40)
        assert (ref[:, :b["input_ids"].shape[1]] == b["input_ids"]).all()
    assert len(widths) <= 7  # few distinct shapes: jitted steps compile a handful of times


def take(it, n):
    return [next(it) for _ in range(n)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_resumed_iterator_continues_identically(dev_dataset):
    it = data.BatchIterator(dev_dataset, 64, seed=7, process_index=0, process_count=1)
    assert it.steps_per_epoch == 2490 // 64 == 38
    take(it, 30)
    position = it.position
    assert position == {"epoch": 0, "index": 30, "seed": 7, "num_examples": 2490,
                        "global_batch_size": 64, "shuffle": True}
    expected = take(it, 20)  # crosses into epoch 1
    assert it.position["epoch"] == 1
    import json

    resumed = data.BatchIterator(dev_dataset, 64, seed=0, process_index=0, process_count=1,
                              position=json.loads(json.dumps(position)))
    assert_same_batches(take(resumed, 20), expected)
    # an epoch is a permutation: every row at most once, a new order in the next epoch
    fresh = data.BatchIterator(dev_dataset, 64, seed=7, process_index=0, process_count=1)
    epoch0 = np.concatenate([b["index"] for b in take(fresh, 38)])
    epoch1 = np.concatenate([b["index"] for b in take(fresh, 38)])
    assert len(set(epoch0)) == 38 * 64 and len(set(epoch1)) == 38 * 64
    assert (epoch0 != epoch1).any()


def test_resume_refuses_a_changed_dataset(dev_dataset):
    it = data.BatchIterator(dev_dataset, 64, seed=7, process_index=0, process_count=1)
    position = dict(it.position, num_examples=2000)
    with pytest.raises(tables.DataError, match="num_examples=2000"):
        data.BatchIterator(dev_dataset, 64, position=position, process_index=0, process_count=1)
    with pytest.raises(tables.DataError, match="global_batch_size=64"):
        data.BatchIterator(dev_dataset, 32, position=it.position, process_index=0, process_count=1)


@pytest.mark.parametrize("hosts", [2, 4])
def test_host_shards_are_disjoint_and_cover_the_global_batch(dev_dataset, hosts):
    single = take(data.BatchIterator(dev_dataset, 32, seed=3, process_index=0, process_count=1), 80)
    shards = [take(data.BatchIterator(dev_dataset, 32, seed=3, process_index=p, process_count=hosts),
                   80) for p in range(hosts)]
    seen = []
    for step, whole in enumerate(single):
        parts = [shards[p][step] for p in range(hosts)]
        assert all(part["input_ids"].shape == (32 // hosts, whole["input_ids"].shape[1])
                   for part in parts)  # every host pads alike
        for k in whole:
            np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), whole[k])
        index = [set(p["index"].tolist()) for p in parts]
        assert sum(map(len, index)) == 32 and len(set().union(*index)) == 32  # disjoint, cover
        seen.extend(whole["index"].tolist())
    assert len(set(seen[:77 * 32])) == 77 * 32  # the first epoch (77 batches) has no repeats


def test_eval_batches_cover_every_row_once(dev_dataset):
    for hosts in (1, 2):
        rows, shapes = [], set()
        for p in range(hosts):
            for b in data.eval_batches(dev_dataset, 100, process_index=p, process_count=hosts):
                assert b["input_ids"].shape[0] == 100 // hosts
                rows.extend(b["index"][b["example_mask"] == 1].tolist())
                shapes.add(b["input_ids"].shape[0])
        assert sorted(rows) == list(range(2490))


def test_bucket_rules():
    assert column_buckets((), 100) == (8, 16, 32, 64, 100)
    assert column_buckets((16, 48, 256), 64) == (16, 48, 64)


# --------------------------------------------------------------------------- the real tokenizer


@pytest.fixture(scope="module")
def spm_tokenizer(tmp_path_factory):
    spm = require("sentencepiece")
    from clarifyjax.text.tokenizer import Tokenizer

    lines = ["question: " + r["situation"] for r in gold("train.tsv").rows[:6000]]
    lines += [r["question"] for r in gold("train.tsv").rows[:6000]]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                   vocab_size=800, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   num_threads=2, minloglevel=2)
    folder = tmp_path_factory.mktemp("spm")
    (folder / "spiece.model").write_bytes(model.getvalue())
    return Tokenizer.from_pretrained(folder), folder


@pytest.mark.reference
def test_end_to_end_with_the_project_tokenizer(spm_tokenizer):
    tokenizer, folder = spm_tokenizer
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(folder / "spiece.model"))
    cfg = load_config(REPO_ROOT / "clarifyjax" / "presets" / "sft_question_tiny.yaml",
                      ["data.train_rows=512", "data.dev_rows=64"])
    train, dev = data.load_sft_pairs(cfg.data, cfg.task)
    ds = data.sft_dataset(train, tokenizer, cfg.model, cfg.data.length_buckets)
    batch = next(data.BatchIterator(ds, 16, seed=0, process_index=0, process_count=1))
    for row, i in enumerate(batch["index"]):
        pieces = sp.encode(train[i].input)[:cfg.model.max_input_length - 1] + [EOS]  # reference
        n = batch["input_mask"][row].sum()
        assert batch["input_ids"][row, :n].tolist() == pieces
    assert batch["input_ids"].shape[1] in (16, 32, 64)
    prompts = data.situation_dataset(["trying to forgive people", "lying to a friend"], tokenizer,
                                  32)
    b = next(data.eval_batches(prompts, 2, process_index=0, process_count=1))
    assert tokenizer.decode_batch(b["input_ids"]) == ["question: trying to forgive people",
                                                      "question: lying to a friend"]
    assert prompts.texts["situation"][1] == "lying to a friend"


def test_wh_question_pairs_leave_out_wordless_questions_with_a_warning():
    table = gold("train.tsv")
    with pytest.warns(UserWarning, match=r"train\.tsv: 3 row\(s\) whose question has no word .* "
                                         r"\(lines 14492, 14495, 17574\)"):
        pairs = data.wh_question_pairs(table)
    assert len(pairs) == len(table) - 3
    kept = [r for r in table.rows if re.search(r"\w", r["question"])]
    assert len(kept) == len(pairs)
    assert all(p.target == " ".join(r["question"].split()) for p, r in zip(pairs, kept))
