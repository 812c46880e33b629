"""sage_jax.data: the long and pairs formats, CSV / TSV / JSONL, batching, and bad input."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from helpers.env import shared_data
from sage_jax.data import (Columns, DataError, gather, pair_matrix, read_questions, shared_texts, text_batch)
from sage_jax.metric import mean_sage, sage

LONG = "sage-mcc/q100_gpt-3.5-turbo_rot.csv"
PAIRS = "sage-mcc/vicuna-7b-v1.5_pairs_0.csv"


def dict_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def write_csv(path, header, rows, delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_long_csv_of_the_sage_release():
    path = shared_data(LONG)
    questions = read_questions(path, need=("answer", "rot"))
    rows = dict_rows(path)
    assert len(questions) == len({r["question_id"] for r in rows}) == 100
    assert all(q.n == 5 for q in questions)
    flat = [(q.question_id, p, a, r) for q in questions for p, a, r in zip(q.paraphrases, q.answers, q.rots)]
    assert flat == [(r["question_id"], r["paraphrased"], r["model_output"], r["rot"]) for r in rows]
    assert questions[0].lines[0] == 2  # the header is line 1


def test_tsv_and_jsonl_with_configured_columns(tmp_path):
    rows = dict_rows(shared_data(LONG))[:23]
    want = read_questions(shared_data(LONG), need=("answer", "rot"))
    cols = Columns(question_id="qid", paraphrase="para", answer="response", rot="rule")
    # Interleave the questions: rows of one question need not be contiguous.
    rows = rows[::2] + rows[1::2]
    tsv = write_csv(tmp_path / "x.tsv", ["qid", "para", "response", "rule"],
                    [[r["question_id"], r["paraphrased"], r["model_output"].replace("\t", " "), r["rot"]]
                     for r in rows], delimiter="\t")
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text("".join(json.dumps({"qid": int(r["question_id"]), "para": r["paraphrased"],
                                         "response": r["model_output"], "rule": r["rot"]}) + "\n"
                             for r in rows))
    for path in (tsv, jsonl):
        got = read_questions(path, columns=cols, need=("answer", "rot"))
        assert [q.question_id for q in got] == [q.question_id for q in want[:len(got)]]
        assert len(got) == 5 and [q.n for q in got] == [5, 5, 5, 5, 3]
        for g, w in zip(got, want):
            assert sorted(g.rots) == sorted(w.rots[:g.n])
            assert len(set(g.lines)) == g.n


def test_pairs_file_rebuilds_each_questions_texts():
    path = shared_data(PAIRS)
    questions = read_questions(path, need=("paraphrase", "answer", "rot"))
    rows = dict_rows(path)
    assert len(questions) == 250 and all(q.n == 5 for q in questions)
    for q in questions[:50]:
        q_rows = [r for r in rows if r["question_id"] == q.question_id]
        # combinations order: row 0 = (0, 1), rows 0..3 = (0, 1..4)
        want = [q_rows[0]["model_output_1"]] + [r["model_output_2"] for r in q_rows[:4]]
        assert q.answers == want
        assert q.rots == [q_rows[0]["rot_1"]] + [r["rot_2"] for r in q_rows[:4]]
        m = q.pair_values["cosine_rot"]
        assert np.allclose(m, m.T, equal_nan=True) and np.isnan(np.diag(m)).all()
        assert m[3, 4] == float(q_rows[9]["cosine_rot"])
        assert m[0, 2] == float(q_rows[1]["cosine_rot"])
    assert set(questions[0].pair_values) == {"bleu_model_output", "rouge_model_output", "cosine_model_output",
                                             "bleu_rot", "rouge_rot", "cosine_rot"}
    weights = pair_matrix(questions, "cosine_model_output")
    assert weights.shape == (250, 5, 5)


def test_missing_columns_name_the_file_and_column(tmp_path):
    path = write_csv(tmp_path / "a.csv", ["question_id", "paraphrased", "model_output"], [["1", "p", "a"]])
    with pytest.raises(DataError, match=r"a\.csv.*'rot'"):
        read_questions(path, need=("answer", "rot"))
    assert read_questions(path, need=("answer",))[0].rots is None
    with pytest.raises(DataError, match=r"a\.csv.*no rot column"):
        text_batch(read_questions(path), "rot")
    with pytest.raises(DataError, match=r"'qid'"):
        read_questions(path, columns=Columns(question_id="qid"))
    pairs = write_csv(tmp_path / "p.csv", ["question_id", "model_output_1", "model_output_2"], [["1", "a", "b"]])
    with pytest.raises(DataError, match=r"p\.csv.*'rot_1', 'rot_2'"):
        read_questions(pairs, need=("answer", "rot"))
    with pytest.raises(DataError, match=r"p\.csv.*'cosine_rot'"):
        read_questions(pairs, weight_columns=["cosine_rot"])
    with pytest.raises(DataError, match="no numeric pair column 'cosine_rot'"):
        pair_matrix(read_questions(pairs), "cosine_rot")


def test_malformed_rows_name_the_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text('question_id,model_output\n1,"fine"\n1,"a, b",extra\n')
    with pytest.raises(DataError, match=r"bad\.csv:3: malformed row"):
        read_questions(path)
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"question_id": 1, "model_output": "a"}\n\n{"question_id": 1, "model_output": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl:3: malformed JSON"):
        read_questions(jsonl)
    jsonl.write_text('{"question_id": 1, "model_output": "a"}\n{"question_id": 1}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: missing field 'model_output'"):
        read_questions(jsonl)
    jsonl.write_text('[1, 2]\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1: expected a JSON object"):
        read_questions(jsonl)
    empty_id = write_csv(tmp_path / "e.csv", ["question_id", "model_output"], [["1", "a"], [" ", "b"]])
    with pytest.raises(DataError, match=r"e\.csv:3: empty 'question_id'"):
        read_questions(empty_id)
    with pytest.raises(DataError, match="unknown file type"):
        read_questions(write_csv(tmp_path / "x.xlsx", ["a"], []))
    with pytest.raises(DataError, match="no such file"):
        read_questions(tmp_path / "nope.csv")
    with pytest.raises(DataError, match=r"h\.csv: no data rows"):
        read_questions(write_csv(tmp_path / "h.csv", ["question_id", "model_output"], []))
    (tmp_path / "z.csv").write_text("")
    with pytest.raises(DataError, match=r"z\.csv: empty file"):
        read_questions(tmp_path / "z.csv")


def test_pairs_file_whose_rows_disagree(tmp_path):
    header = ["question_id", "model_output_1", "model_output_2", "cosine_model_output"]
    good = [["7", "a", "b", "0.5"], ["7", "a", "c", "0.1"], ["7", "b", "c", "0.2"]]
    ok = read_questions(write_csv(tmp_path / "ok.csv", header, good))
    assert ok[0].answers == ["a", "b", "c"]
    bad = [good[0], good[1], ["7", "B", "c", "0.2"]]
    with pytest.raises(DataError, match=r"bad\.csv:4: pairs rows disagree.*paraphrase 1 of question 7.*line 2"):
        read_questions(write_csv(tmp_path / "bad.csv", header, bad))
    with pytest.raises(DataError, match=r"two\.csv:2: question 7 has 2 pair rows"):
        read_questions(write_csv(tmp_path / "two.csv", header, good[:2]))
    nan_weight = [good[0], good[1], ["7", "b", "c", ""]]
    with pytest.raises(DataError, match="column 'cosine_model_output' is empty or NaN"):
        pair_matrix(read_questions(write_csv(tmp_path / "n.csv", header, nan_weight)), "cosine_model_output")
    not_number = [good[0], good[1], ["7", "b", "c", "high"]]
    with pytest.raises(DataError, match=r"nn\.csv:4: column 'cosine_model_output' is not a number"):
        read_questions(write_csv(tmp_path / "nn.csv", header, not_number), weight_columns=["cosine_model_output"])
    # In auto mode a non-numeric extra column is simply not an edge weight.
    assert read_questions(write_csv(tmp_path / "nn2.csv", header, not_number))[0].pair_values == {}


def test_batching_empty_texts_single_paraphrase_and_groups(tmp_path):
    rows = [["1", "p1", "same answer"], ["1", "p2", "same answer"], ["1", "p3", "other"],
            ["2", "p1", "lonely"],
            ["3", "p1", ""], ["3", "p2", "  "], ["3", "p3", "x"],
            ["4", "p1", "other"], ["4", "p2", "same answer"]]
    questions = read_questions(write_csv(tmp_path / "b.csv", ["question_id", "paraphrased", "model_output"], rows))
    batch = text_batch(questions, "answer")
    assert batch.question_ids == ["1", "2", "3", "4"]
    assert batch.n_empty == 2
    assert batch.texts == ["same answer", "other", "lonely", "x"]
    np.testing.assert_array_equal(batch.index, [[0, 0, 1], [2, -1, -1], [-1, -1, 3], [1, 0, -1]])
    np.testing.assert_array_equal(batch.mask, batch.index >= 0)
    np.testing.assert_array_equal(batch.n_texts, [3, 1, 3, 2])
    assert batch.groups[0, 0] == batch.groups[0, 1] != batch.groups[0, 2]
    vectors = np.array([[1, 0], [0, 1], [1, 1], [2, 3]], np.float32)
    emb = gather(vectors, batch.index)
    assert emb.shape == (4, 3, 2) and (emb[1, 1:] == 0).all() and (emb[0, 2] == [0, 1]).all()
    scores = np.asarray(sage(emb, batch.mask))
    # question 2 (one paraphrase) and 3 (one non-empty text) are counted skips
    assert np.isnan(scores[[1, 2]]).all() and not np.isnan(scores[[0, 3]]).any()
    assert int(mean_sage(scores)[1]) == 2
    with pytest.raises(DataError, match="more than n_max=2"):
        text_batch(questions, "answer", n_max=2)


def test_shared_texts_embeds_answers_and_rots_once(tmp_path):
    rows = [["1", "p1", "yes", "be kind"], ["1", "p2", "be kind", ""], ["2", "p1", "no", "yes"]]
    questions = read_questions(write_csv(tmp_path / "s.csv", ["question_id", "paraphrased", "model_output", "rot"],
                                         rows), need=("answer", "rot"))
    answers, rots = text_batch(questions, "answer"), text_batch(questions, "rot")
    texts, (ia, ir) = shared_texts(answers, rots)
    assert texts == ["yes", "be kind", "no"]  # a string that is an answer and a RoT appears once
    np.testing.assert_array_equal(ia, [[0, 1], [2, -1]])
    np.testing.assert_array_equal(ir, [[1, -1], [0, -1]])  # the empty RoT stays masked
    # Gathering through the shared table equals gathering each batch through its own table.
    vectors = np.arange(len(texts) * 2, dtype=np.float32).reshape(-1, 2)
    own = {t: v for t, v in zip(texts, vectors)}
    for batch, index in ((answers, ia), (rots, ir)):
        alone = gather(np.stack([own[t] for t in batch.texts]), batch.index)
        np.testing.assert_array_equal(gather(vectors, index), alone)
