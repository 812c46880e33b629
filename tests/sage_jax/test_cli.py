"""Bad input to `sage-jax score` and the sage_jax API (tracker issue 11), by class.

Every case asserts the one-line message names what is wrong (the option, the file and line, the
folder) and that nothing was published. `sage-jax score` runs in-process here (no subprocess, no
model: every refusal happens before a model is loaded, which the `no_model` fixture enforces).
test_count_of_bad_inputs counts the distinct bad inputs; the Python API's are in
test_metric_inputs.py.
"""
from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from helpers.env import shared_data
from helpers.sage_files import PAIRS, pairs_file, write_csv
from sage_jax import cli, report
from sage_jax.data import DataError, DataWarning, pair_matrix, read_questions

LONG_HEADER = ["question_id", "question", "paraphrased", "model_output", "rot"]


def long_rows(n_questions=2, n=3):
    return [[str(q), f"question {q}?", f"paraphrase {q}.{i}", f"answer {q}.{i}", f"rule {q}.{i}"]
            for q in range(n_questions) for i in range(n)]


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a model is loaded."""
    from clarifyjax.models.embedder import SentenceEmbedder

    def refuse(*a, **k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(SentenceEmbedder, "from_pretrained", refuse)


def score(capsys, *argv):
    rc = cli.main(["score", *map(str, argv), "--quiet"])
    out, err = capsys.readouterr()
    return rc, out, err


def edge_args(out):  # scoring without a model: the pairs file's own cosines as edges
    return ["--edge-weights", "cosine_rot", "--no-bertscore", "--out", out]


def one_line_error(err, *needles):
    lines = [line for line in err.splitlines() if line.startswith("sage-jax: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- numeric options

BAD_OPTIONS = [
    ("--alpha", "nan"), ("--alpha", "inf"), ("--alpha", "-inf"), ("--alpha", "0"), ("--alpha", "-1"),
    ("--alpha", "1e7"), ("--alpha", "1e400"),
    ("--blend-weight", "nan"), ("--blend-weight", "-0.1"), ("--blend-weight", "1.5"), ("--blend-weight", "inf"),
    ("--batch-size", "0"), ("--batch-size", "-5"), ("--batch-size", "5000"),
    ("--chunk-size", "0"), ("--chunk-size", "-1"), ("--chunk-size", str(2 ** 21)),
    ("--out", ""), ("--edge-weights", " "), ("--answer-column", ""), ("--answer-column", "question_id"),
    ("--rot-column", "model_output"),
]


@pytest.mark.e2e
@pytest.mark.parametrize("option,value", BAD_OPTIONS)
def test_bad_option_values_are_refused_before_any_work(tmp_path, capsys, no_model, option, value):
    src = pairs_file(tmp_path / "v.csv")
    rc, _, err = score(capsys, src, *edge_args(tmp_path / "out"), f"{option}={value}")  # the last one counts
    assert rc == 2
    one_line_error(err, option)
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_non_numbers_for_integer_options_name_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        score(capsys, tmp_path / "v.csv", "--out", tmp_path / "o", "--batch-size", "nan")
    assert e.value.code == 2 and "--batch-size" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the output folder


@pytest.mark.e2e
def test_overwrite_replaces_the_whole_set_and_refuses_without_it(tmp_path, capsys):
    out = tmp_path / "out"
    first, second = pairs_file(tmp_path / "first.csv"), pairs_file(tmp_path / "second.csv", questions=2)
    assert score(capsys, first, *edge_args(out))[0] == 0
    assert (out / "first.per_question.csv").exists()
    rc, _, err = score(capsys, second, *edge_args(out))  # stale files of the earlier run
    assert rc == 2
    one_line_error(err, f"--out {out}", "not empty", "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == ["first.per_question.csv", "sage_distribution.png",
                                                      "summary.json"]
    os.chmod(out, 0o750)
    assert score(capsys, second, *edge_args(out), "--overwrite")[0] == 0
    # The whole set is replaced: no stale first.per_question.csv beside the new files.
    assert sorted(p.name for p in out.iterdir()) == ["sage_distribution.png", "second.per_question.csv",
                                                      "summary.json"]
    assert [m["model"] for m in json.loads((out / "summary.json").read_text())["models"]] == ["second"]
    assert os.stat(out).st_mode & 0o777 == 0o750  # the folder keeps its permissions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.csv", "out", "second.csv"]  # no temp folder


@pytest.mark.e2e
def test_an_existing_empty_folder_is_fine(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    assert score(capsys, pairs_file(tmp_path / "v.csv"), *edge_args(tmp_path / "out"))[0] == 0
    assert (tmp_path / "out" / "summary.json").exists()


def bad_out_file(tmp_path):
    (tmp_path / "taken").write_text("x")
    return tmp_path / "taken", "is a file"


def bad_out_under_file(tmp_path):
    (tmp_path / "taken").write_text("x")
    return tmp_path / "taken" / "sub" / "out", "is a file"


def bad_out_foreign(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "notes.txt").write_text("mine")
    return tmp_path / "results", "'notes.txt' was not written by sage-jax"


def bad_out_holds_input(tmp_path):
    return tmp_path, "holds the input file"


def bad_out_subfolder(tmp_path):
    (tmp_path / "results" / "keep").mkdir(parents=True)
    return tmp_path / "results", "'keep' was not written by sage-jax"


@pytest.mark.e2e
@pytest.mark.parametrize("make", [bad_out_file, bad_out_under_file, bad_out_foreign, bad_out_holds_input,
                                  bad_out_subfolder])
def test_bad_output_folders_are_refused_before_any_work(tmp_path, capsys, no_model, make):
    src = pairs_file(tmp_path / "v.csv")
    out, needle = make(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    rc, _, err = score(capsys, src, *edge_args(out), "--overwrite")
    assert rc == 2
    one_line_error(err, f"--out {out}", needle)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing deleted, nothing left


@pytest.mark.e2e
def test_an_unwritable_output_location_is_one_line(tmp_path, capsys, no_model, monkeypatch):
    """(Simulated: the tests may run as root, for whom chmod does not bite.)"""
    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path))
    monkeypatch.setattr(report.tempfile, "mkdtemp", denied)
    rc, _, err = score(capsys, pairs_file(tmp_path / "v.csv"), *edge_args(tmp_path / "ro" / "out"))
    assert rc == 2
    one_line_error(err, f"--out {tmp_path / 'ro' / 'out'}", "Permission denied")
    monkeypatch.undo()
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(exist_ok=True)
        os.chmod(tmp_path / "ro", 0o500)
        rc, _, err = score(capsys, tmp_path / "v.csv", *edge_args(tmp_path / "ro" / "out"))
        os.chmod(tmp_path / "ro", 0o700)
        assert rc == 2 and "--out" in one_line_error(err)


@pytest.mark.e2e
def test_a_failure_while_publishing_keeps_the_earlier_results(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert score(capsys, pairs_file(tmp_path / "old.csv"), *edge_args(out))[0] == 0
    real_replace = os.replace

    def full_disk(src, dst):
        if os.path.basename(src).startswith(".out.tmp-"):  # the swap itself
            raise OSError(28, "No space left on device", str(src), None, str(dst))
        return real_replace(src, dst)
    monkeypatch.setattr(report.os, "replace", full_disk)
    rc, _, err = score(capsys, pairs_file(tmp_path / "new.csv"), *edge_args(out), "--overwrite")
    assert rc == 1
    one_line_error(err, f"--out {out}: writing the results failed", "No space left on device")
    assert (out / "old.per_question.csv").exists() and not (out / "new.per_question.csv").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.csv", "old.csv", "out"]
    # A failing file write inside the staging folder: the same.
    monkeypatch.setattr(report.os, "replace", real_replace)
    monkeypatch.setattr(report, "atomic_write_bytes", lambda path, data: full_disk("/x/.out.tmp-1", path))
    rc, _, err = score(capsys, tmp_path / "new.csv", *edge_args(out), "--overwrite")
    assert rc == 1
    one_line_error(err, f"--out {out}: writing the results failed", "No space left on device")
    assert (out / "old.per_question.csv").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.csv", "old.csv", "out"]


# ----------------------------------------------------------------------------- several files


@pytest.mark.e2e
def test_a_bad_second_file_is_found_before_any_model_is_loaded(tmp_path, capsys, no_model):
    good = write_csv(tmp_path / "good.csv", LONG_HEADER, long_rows())
    bad = write_csv(tmp_path / "bad.csv", LONG_HEADER, long_rows() + [["9", "q", "p", "a"]])
    embedder = tmp_path / "embedder"
    embedder.mkdir()
    rc, _, err = score(capsys, good, bad, "--embedder", embedder, "--out", tmp_path / "out")
    assert rc == 2
    one_line_error(err, f"{bad}:8:", "malformed row")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "embedder", "good.csv"]


@pytest.mark.e2e
def test_a_second_file_failing_while_scored_publishes_nothing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    first, second = pairs_file(tmp_path / "first.csv"), pairs_file(tmp_path / "second.csv")
    real = cli.score_loaded

    def fail_on_second(item, *a):
        if item.name == "second":
            raise RuntimeError("out of memory\n  (pages of XLA detail)")
        return real(item, *a)
    monkeypatch.setattr(cli, "score_loaded", fail_on_second)
    rc, _, err = score(capsys, first, second, *edge_args(out))
    assert rc == 1
    one_line_error(err, str(second), "out of memory")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.csv", "second.csv"]


def bad_inputs_missing(tmp_path):
    return tmp_path / "missing.csv", "no such file"


def bad_inputs_folder(tmp_path):
    (tmp_path / "folder.csv").mkdir()
    return tmp_path / "folder.csv", "is a directory"


def bad_inputs_suffix(tmp_path):
    return write_csv(tmp_path / "table.xlsx", LONG_HEADER, long_rows()), "unknown file type"


def bad_inputs_twice(tmp_path):
    os.link(tmp_path / "first.csv", tmp_path / "alias.csv")
    return tmp_path / "alias.csv", "the same file as"


@pytest.mark.e2e
@pytest.mark.parametrize("make", [bad_inputs_missing, bad_inputs_folder, bad_inputs_suffix, bad_inputs_twice])
def test_bad_input_lists_name_the_file(tmp_path, capsys, no_model, make):
    first = pairs_file(tmp_path / "first.csv")
    bad, needle = make(tmp_path)
    rc, _, err = score(capsys, first, bad, *edge_args(tmp_path / "out"))
    assert rc == 2
    one_line_error(err, str(bad), needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_a_question_with_too_many_rows_names_the_option(tmp_path, capsys, no_model):
    rows = [["same", f"p{i}", f"a{i}"] for i in range(cli.MAX_TEXTS + 1)]
    src = write_csv(tmp_path / "wide.csv", ["question_id", "paraphrased", "model_output"], rows)
    (tmp_path / "e").mkdir()
    rc, _, err = score(capsys, src, "--embedder", tmp_path / "e", "--out", tmp_path / "out")
    assert rc == 2
    one_line_error(err, f"{src}:2:", "--question-id-column")


# ----------------------------------------------------------------------------- files that are not what they claim

HEADER_LINE = "question_id,paraphrased,model_output\n"
GOOD_CSV = HEADER_LINE + "1,p1,a1\n1,p2,a2\n"
GOOD_JSONL = '{"question_id": 1, "model_output": "a1"}\n{"question_id": 1, "model_output": "a2"}\n'

# (file name, bytes, text the error must hold; "{f}" is the file's path)
BAD_FILES = [
    ("latin1.csv", (HEADER_LINE + "1,p1,caf\xe9\n").encode("latin-1"), "{f}:2: not UTF-8"),
    ("utf16.csv", GOOD_CSV.encode("utf-16"), "{f}: UTF-16 text (byte-order mark fffe); save it as UTF-8"),
    ("image.csv", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "{f}:1: not UTF-8"),
    ("empty.csv", b"", "{f}: empty file"),
    ("blank.csv", b"\n  \n\r\n", "{f}: empty file"),
    ("header_only.csv", HEADER_LINE.encode(), "{f}: no data rows"),
    ("header_blank.tsv", b"question_id\tmodel_output\n\n\n", "{f}: no data rows"),
    ("no_answer.csv", b"question_id,paraphrased\n1,p\n", "{f}: missing column 'model_output'"),
    ("semicolons.csv", b"question_id;model_output\n1;a\n", "is it separated by another character"),
    ("long_row.csv", (GOOD_CSV + "1,p3,a3,extra\n").encode(), "{f}:4: malformed row: 4 fields"),
    ("short_row.csv", (GOOD_CSV + "1,p3\n").encode(), "{f}:4: malformed row: 2 fields"),
    ("open_quote.csv", (GOOD_CSV + '2,"p1,a1\n2,p2,a2\n').encode(), "{f}:4: malformed row"),
    ("stray_quote.csv", (GOOD_CSV + '2,"p1"x,a1\n').encode(), "{f}:4: malformed row"),
    ("twice.csv", b"question_id,model_output,model_output\n1,a,b\n", "{f}:1: column 'model_output' appears twice"),
    ("empty_id.csv", (GOOD_CSV + " ,p3,a3\n").encode(), "{f}:4: empty 'question_id'"),
    ("nan.jsonl", (GOOD_JSONL + '{"question_id": 1, "model_output": NaN}\n').encode(), "{f}:3: NaN is not valid JSON"),
    ("inf.jsonl", b'{"question_id": Infinity, "model_output": "a"}\n', "{f}:1: Infinity is not valid JSON"),
    ("dup_key.jsonl", b'{"question_id": 1, "model_output": "a", "model_output": "b"}\n',
     "{f}:1: key 'model_output' appears twice"),
    ("nested.jsonl", (GOOD_JSONL + '{"question_id": 1, "model_output": ["a", "b"]}\n').encode(),
     "{f}:3: field 'model_output' is a JSON array or object"),
    ("surrogate.jsonl", (GOOD_JSONL + '{"question_id": 1, "model_output": "x \\ud800 y"}\n').encode(),
     "{f}:3: field 'model_output' holds '\\ud800' (a lone surrogate)"),
    ("low_surrogate.jsonl",
     b'{"question_id": 2, "model_output": "ok"}\n{"question_id": "\\udfff", "model_output": "a"}\n',
     "{f}:2: field 'question_id' holds '\\udfff'"),
    ("array.jsonl", b'["question_id", "model_output"]\n', "{f}:1: expected a JSON object"),
    ("truncated.jsonl", (GOOD_JSONL + '{"question_id": 1, "model_output": \n').encode(), "{f}:3: malformed JSON"),
    ("no_field.jsonl", (GOOD_JSONL + '{"question_id": 1}\n').encode(), "{f}:3: missing field 'model_output'"),
    ("blank.jsonl", b"\n\n   \n", "{f}: empty file"),
    ("second_bom.jsonl", GOOD_JSONL.encode() + b"\xef\xbb\xbf" + GOOD_JSONL.encode(), "{f}:3: malformed JSON"),
    ("two_questions.csv", b"question_id,question,model_output\n1,Lie?,a\n1,Lie?,b\n1,Steal?,c\n",
     "{f}:4: question id '1' has a different 'question' than line 2"),
]


@pytest.mark.e2e
@pytest.mark.parametrize("name,content,needle", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_files_name_the_file_and_line(tmp_path, capsys, no_model, name, content, needle):
    bad = tmp_path / name
    bad.write_bytes(content)
    with pytest.raises(DataError) as e:
        read_questions(bad)
    assert needle.format(f=bad) in str(e.value) and "\n" not in str(e.value)
    assert "\ufeff" not in str(e.value)
    (tmp_path / "e").mkdir()
    rc, _, err = score(capsys, bad, "--embedder", tmp_path / "e", "--out", tmp_path / "out")
    assert rc == 2
    one_line_error(err, needle.format(f=bad))
    assert not (tmp_path / "out").exists()


def test_a_folder_named_like_an_input_file(tmp_path):
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(DataError, match=r"dir\.csv: is a directory"):
        read_questions(tmp_path / "dir.csv")


@pytest.mark.parametrize("name,delimiter", [("excel.csv", ","), ("excel.tsv", "\t"), ("excel.jsonl", None)])
def test_a_byte_order_mark_is_read_as_utf8(tmp_path, name, delimiter):
    path = tmp_path / name
    if delimiter:
        write_csv(path, LONG_HEADER, long_rows(), delimiter=delimiter, encoding="utf-8-sig")
    else:
        path.write_text("".join(json.dumps(dict(zip(LONG_HEADER, r))) + "\n" for r in long_rows()),
                        encoding="utf-8-sig")
    assert path.read_bytes()[:3] == b"\xef\xbb\xbf"
    questions = read_questions(path, need=("answer", "rot"))
    assert [q.question_id for q in questions] == ["0", "1"] and questions[0].answers[0] == "answer 0.0"


@pytest.mark.e2e
def test_an_excel_csv_utf8_pairs_file_scores(tmp_path, capsys):
    path = pairs_file(tmp_path / "excel.csv")
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    rc, out, err = score(capsys, path, *edge_args(tmp_path / "out"))
    assert rc == 0, err
    assert "excel" in out and (tmp_path / "out" / "excel.per_question.csv").exists()


# ----------------------------------------------------------------------------- duplicates


def test_a_repeated_row_is_warned_with_its_lines(tmp_path):
    rows = long_rows()
    path = write_csv(tmp_path / "rep.csv", LONG_HEADER, rows + [rows[1]])
    with pytest.warns(DataWarning, match=r"rep\.csv: 1 row repeat an earlier row .*lines 8 = 3"):
        questions = read_questions(path)
    assert questions[0].n == 4  # read, not dropped: the warning says it counts


class FakeEmbedder:
    """Deterministic vectors per text, so that the long format runs through the CLI without a model."""

    def embed(self, texts, batch_size=64, on_progress=None):
        return np.stack([np.random.default_rng(sum(map(ord, t))).normal(size=8) for t in texts]).astype(np.float32)


@pytest.mark.e2e
def test_the_cli_prints_data_warnings_as_one_line_each(tmp_path, capsys, monkeypatch):
    from clarifyjax.models.embedder import SentenceEmbedder

    monkeypatch.setattr(SentenceEmbedder, "from_pretrained", lambda *a, **k: FakeEmbedder())
    rows = long_rows()
    path = write_csv(tmp_path / "rep.csv", LONG_HEADER, rows + [rows[1]])
    (tmp_path / "e").mkdir()
    rc, out, err = score(capsys, path, "--embedder", tmp_path / "e", "--no-bertscore", "--out", tmp_path / "out")
    assert rc == 0, err
    warned = [line for line in err.splitlines() if line.startswith("sage-jax: warning:")]
    assert len(warned) == 1 and f"{path}: 1 row repeat" in warned[0] and "lines 8 = 3" in warned[0]
    assert "Traceback" not in err and (tmp_path / "out" / "summary.json").exists()


def test_a_question_with_twice_the_rows_is_warned(tmp_path):
    rows = long_rows(3) + [["0", "", f"other paraphrase {i}", f"other answer {i}", "r"] for i in range(3)]
    with pytest.warns(DataWarning, match=r"question 0 has 6 rows where the median question has 3 \(lines 2, 3, 4, 11"):
        read_questions(write_csv(tmp_path / "merged.csv", LONG_HEADER, rows))


def test_a_repeated_pair_row_breaks_the_pairs_structure(tmp_path):
    path = pairs_file(tmp_path / "p.csv", edit=lambda rows: rows.insert(3, rows[2]))
    with pytest.warns(DataWarning, match=r"lines 5 = 4"), pytest.raises(DataError, match=r"p\.csv:\d+: "):
        read_questions(path)


def test_the_release_files_read_without_warnings(recwarn):
    for name in (PAIRS, "sage-mcc/q100_gpt-3.5-turbo_rot.csv"):
        read_questions(shared_data(name), need=("answer", "rot"))
    assert not [w for w in recwarn if issubclass(w.category, DataWarning)]


# ----------------------------------------------------------------------------- edge weights

BAD_WEIGHTS = [("1.5", "is 1.5, outside [-1, 1]"), ("-2", "is -2.0, outside [-1, 1]"),
               ("nan", "is empty or NaN"), ("inf", "is inf, outside"), ("-Infinity", "is -inf, outside"),
               ("", "is empty or NaN"), ("high", "is not a number: 'high'")]


@pytest.mark.e2e
@pytest.mark.parametrize("value,needle", BAD_WEIGHTS)
def test_edge_weights_outside_minus_one_one_name_the_line(tmp_path, capsys, no_model, value, needle):
    def edit(rows):
        rows[13][12] = value  # question 2, pair (0, 4): line 15
    path = pairs_file(tmp_path / "w.csv", edit)
    with pytest.raises(DataError, match=r"w\.csv:15: column 'cosine_rot' "):
        read_questions(path, weight_columns=["cosine_rot"])
    rc, _, err = score(capsys, path, *edge_args(tmp_path / "out"))
    assert rc == 2
    one_line_error(err, f"{path}:15: column 'cosine_rot' {needle}")
    if value != "high":  # in auto mode the column is read, and checked when used
        with pytest.raises(DataError, match=r"w\.csv:15: "):
            pair_matrix(read_questions(path), "cosine_rot")


def test_float32_rounding_of_a_cosine_is_accepted():
    questions = read_questions(shared_data(PAIRS), weight_columns=["cosine_model_output"])
    weights = pair_matrix(questions, "cosine_model_output")  # holds 1.0000001192092896
    assert weights.max() == 1.0


# ----------------------------------------------------------------------------- JSON outputs


@pytest.mark.e2e
def test_json_outputs_never_hold_nan(tmp_path, capsys):
    def edit(rows):
        for r in rows[:10]:  # question 1: every answer empty -> no SaGE (NaN), a null in JSON
            r[2] = r[5] = ""
    out = tmp_path / "out"
    rc, _, err = score(capsys, pairs_file(tmp_path / "p.csv", edit), *edge_args(out), "--text", "answer")
    assert rc == 0, err

    def refuse(name):
        raise AssertionError(f"{name} in summary.json")
    summary = json.loads((out / "summary.json").read_text(), parse_constant=refuse)
    assert summary["models"][0]["sage"]["skipped"] == 1
    rows = list(csv.DictReader(open(out / "p.per_question.csv", encoding="utf-8")))
    assert rows[0]["sage"] == "" and all(-1 <= float(r["sage"]) <= 1 for r in rows[1:])
    assert report.statistics([np.inf, 0.5, np.nan]) == {"mean": 0.5, "std": 0.0, "count": 1, "skipped": 2}


@pytest.mark.e2e
@pytest.mark.parametrize("misspelt", ["--overwr", "--alph=10", "--qui"])
def test_a_prefix_of_an_option_is_not_taken_for_it(tmp_path, capsys, misspelt):
    with pytest.raises(SystemExit) as e:
        score(capsys, pairs_file(tmp_path / "v.csv"), "--out", tmp_path / "o", misspelt)
    assert e.value.code == 2 and misspelt.split("=")[0] in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
