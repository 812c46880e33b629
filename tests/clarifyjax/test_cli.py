"""`clarifyjax` command-line reliability (issue 11): every class of bad input, not only examples.

Each bad invocation runs through `clarifyjax.cli.main([...])` and must return 2 with exactly one
stderr line that names the option or file, before any model is loaded (`load_pipeline` is replaced
by a function that fails the test) and without writing `--out`. The classes:

* numbers that make no sense (NaN, infinity, zero, negative, out of range, not a number);
* options that make no sense together, model folders that are missing or files;
* outputs: earlier results, a directory, a device, a folder that cannot be written, an input file;
* input files that are not what they claim: missing, a directory, not UTF-8, UTF-16, NUL bytes,
  empty, header only, missing column, empty or invisible cells, malformed JSON(L), a lone
  surrogate, mismatched lengths;
* `train`: config missing / a directory / not UTF-8 / YAML syntax, bad overrides, bad usage.

Inputs that are fine but were mishandled (a byte-order mark, ".CSV", U+2028 inside a line,
--overwrite over a longer earlier run) are scored with the tiny models of test_command.py (helpers/score_cli.py).
"""
from __future__ import annotations

import codecs
import csv
import errno
import io
import json

import pytest

from clarifyjax import cli
from clarifyjax.core import commands
from clarifyjax.reward import command
from clarifyjax.cli import main, parse_args
from helpers.env import REPO_ROOT
from helpers.score_cli import args_for, write_lines

SITUATIONS = ["lying to a friend", "helping a neighbour move", "skipping work"]
QUESTIONS = ["why did you lie?", "was it raining?", "were you sick?"]
CONFIG = REPO_ROOT / "clarifyjax" / "presets" / "sft_question_tiny.yaml"

# Bad values of every numeric option of score-questions: (extra arguments, option named).
BAD_NUMBERS = [
    (["--gain", "nan", "--bias", "0"], "--gain"),
    (["--gain", "inf", "--bias", "0"], "--gain"),
    (["--gain", "-1", "--bias", "0"], "--gain"),
    (["--gain", "0", "--bias", "0"], "--gain"),
    (["--gain", "1e999", "--bias", "0"], "--gain"),  # parses as infinity
    (["--gain", "one", "--bias", "0"], "--gain"),
    (["--gain", "1", "--bias", "nan"], "--bias"),
    (["--gain", "1", "--bias", "-inf"], "--bias"),
    (["--answer-temperature", "-0.5"], "--answer-temperature"),
    (["--answer-temperature", "NaN"], "--answer-temperature"),
    (["--answer-temperature", "Infinity"], "--answer-temperature"),
    (["--limit", "0"], "--limit"),
    (["--limit", "-3"], "--limit"),
    (["--limit", "2.5"], "--limit"),
    (["--batch-size", "0"], "--batch-size"),
    (["--batch-size", "-8"], "--batch-size"),
    (["--batch-size", "nan"], "--batch-size"),
    (["--nli-threshold", "0"], "--nli-threshold"),
    (["--nli-threshold", "1.5"], "--nli-threshold"),
    (["--nli-threshold", "nan"], "--nli-threshold"),
    (["--max-input-length", "2"], "--max-input-length"),
    (["--max-input-length", "100000000"], "--max-input-length"),
    (["--answer-max-length", "0"], "--answer-max-length"),
    (["--fusion-max-length", "-4"], "--fusion-max-length"),
    (["--judgment-max-length", "0"], "--judgment-max-length"),
    (["--class-step", "0"], "--class-step"),
    (["--resample-k", "0"], "--resample-k"),
    (["--max-question-words", "0"], "--max-question-words"),
    (["--seed", "-1"], "--seed"),
    (["--seed", "4294967296"], "--seed"),  # jax.random.key would wrap it to seed 0
    (["--seed", "1e3"], "--seed"),
]

# Options that make no sense (together): (extra arguments, name in the message).
BAD_OPTIONS = [
    (["--gain", "2"], "--gain and --bias"),
    (["--bias", "0.5"], "--gain and --bias"),
    (["--nli-threshold", "0.5"], "--nli-threshold 0.5 (config <command line>): nli_threshold"),
    (["--class-tokens", "1,0"], "--class-tokens"),
    (["--encoder-labels", "bad,,good"], "--encoder-labels"),
    (["--situation-column", " "], "--situation-column"),
    (["--dtype", "float64"], "--dtype"),
    (["--no-such-option", "1"], "--no-such-option"),
]

# Input files that are not what they claim: (file name, bytes or None for "not there", message).
BAD_FILES = [
    ("missing.txt", None, "no such file"),
    ("latin1.txt", "lying to a friend\ncaf\xe9 au lait\n".encode("latin-1"), ":2: not UTF-8"),
    ("utf16.txt", "a\nb\n".encode("utf-16"), "UTF-16"),
    ("utf16be.csv", codecs.BOM_UTF16_BE + "situation\na\n".encode("utf-16-be"), "UTF-16"),
    ("utf32.jsonl", '{"situation": "a"}\n'.encode("utf-32"), "UTF-32"),
    ("nobom16.txt", "ab\ncd\n".encode("utf-16-le"), ":1: holds a NUL"),
    ("nul.csv", b"situation\nlying\x00 to a friend\n", ":2: holds a NUL"),
    ("empty.txt", b"", "no situations"),
    ("empty.csv", b"", "empty file"),
    ("bom_only.txt", codecs.BOM_UTF8, "no situations"),
    ("header_only.csv", b"situation,question\n", "no situations"),
    ("no_column.csv", b"text,question\nlying,why?\n", "missing column(s) ['situation']"),
    ("empty_cell.tsv", b"situation\tquestion\nlying\twhy?\n\twhy not?\n",
     ":3: column 'situation' is empty"),
    ("zero_width.csv", "situation\nlying\n\u200b\n".encode(), ":3: column 'situation' is empty"),
    ("bom_line.txt", "lying\n\ufeff\n".encode(), ":2: field 'situation' is empty"),
    ("blank_middle.txt", b"lying\n   \nskipping work\n", ":2: field 'situation' is empty"),
    ("bad_json.jsonl", b'{"situation": "a"}\n{"situation": "b"\n', ":2: malformed JSON"),
    ("list.jsonl", b'{"situation": "a"}\n["b"]\n', ":2: expected a JSON object"),
    ("surrogate.jsonl", b'{"situation": "a"}\n{"situation": "x \\ud800 y"}\n',
     ":2: field 'situation' holds '\\ud800' (a lone surrogate)"),
    ("whole.json", b'[{"situation": "a"}]', "a .json file"),
    ("ragged.csv", b"situation,question\na,b,c\n", ":2: malformed row"),
    ("short.txt", b"lying\nhelping\n", "has 2 situations but"),
]


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """Good inputs, empty model folders and an --out path; loading a model fails the test."""
    from clarifyjax.reward import pipeline

    def no_models(*args, **kwargs):
        raise AssertionError("models were loaded before the bad input was reported")

    monkeypatch.setattr(pipeline, "load_pipeline", no_models)
    models = {name: tmp_path / name for name in ("answerer", "fusion", "judge")}
    for folder in models.values():
        folder.mkdir()
    sit = write_lines(tmp_path / "situations.txt", SITUATIONS)
    qs = write_lines(tmp_path / "questions.txt", QUESTIONS)
    return dict(models=models, sit=sit, qs=qs, out=tmp_path / "out" / "scores.jsonl",
                tmp=tmp_path)


def fails_with_one_line(argv, capsys, *names):
    """main(argv) returns non-zero with one stderr line naming each of `names`."""
    capsys.readouterr()
    status = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("clarifyjax"), err
    assert "Traceback" not in err
    for name in names:
        assert str(name) in lines[0], lines[0]
    return lines[0]


def score_argv(s, *extra, situations=None, questions=None, out=None):
    return args_for(s["models"], situations or s["sit"], questions or s["qs"], out or s["out"],
                    *extra)


@pytest.mark.e2e
@pytest.mark.parametrize("extra,option", BAD_NUMBERS + BAD_OPTIONS,
                         ids=[" ".join(e) for e, _ in BAD_NUMBERS + BAD_OPTIONS])
def test_bad_option_values_name_the_option(setup, capsys, extra, option):
    fails_with_one_line(score_argv(setup, *extra), capsys, option)
    assert not setup["out"].exists()


@pytest.mark.e2e
@pytest.mark.parametrize("name,content,message", BAD_FILES, ids=[f[0] for f in BAD_FILES])
@pytest.mark.parametrize("role", ["--situations", "--questions"])
def test_bad_input_files_name_the_file_and_line(setup, capsys, name, content, message, role):
    path = setup["tmp"] / name
    if content is not None:
        path.write_bytes(content)
    argv = score_argv(setup, situations=path if role == "--situations" else None,
                      questions=path if role == "--questions" else None)
    if role == "--questions" and name.endswith((".csv", ".tsv", ".jsonl")):
        argv += ["--question-column", "situation"]  # the same tables serve both roles
    elif role == "--questions":
        message = message.replace("situation", "question")
        if name == "short.txt":
            message = "has 3 situations but"
    fails_with_one_line(argv, capsys, path.name, message)
    assert not setup["out"].exists()


@pytest.mark.e2e
def test_bad_model_folders_name_the_option(setup, capsys):
    fails_with_one_line(score_argv({**setup, "models": {**setup["models"], "fusion": setup["tmp"]
                                                        / "nope"}}), capsys, "--fusion", "nope")
    fails_with_one_line(score_argv({**setup, "models": {**setup["models"], "judge": setup["sit"]}}),
                        capsys, "--judge", "not a folder")


@pytest.mark.e2e
def test_outputs_that_cannot_or_must_not_be_written(setup, capsys):
    earlier = setup["tmp"] / "earlier.jsonl"
    earlier.write_text('{"reward": 1.0}\n' * 5)
    line = fails_with_one_line(score_argv(setup, out=earlier), capsys, earlier, "--overwrite")
    assert "already exists" in line and earlier.read_text() == '{"reward": 1.0}\n' * 5
    fails_with_one_line(score_argv(setup, out=setup["tmp"]), capsys, setup["tmp"], "directory")
    fails_with_one_line(score_argv(setup, out="/dev/null"), capsys, "/dev/null", "regular file")
    under_file = setup["sit"] / "sub" / "scores.jsonl"
    fails_with_one_line(score_argv(setup, out=under_file), capsys, under_file, "not a directory")
    fails_with_one_line(score_argv(setup, out="/proc/scores.jsonl"), capsys, "/proc/scores.jsonl",
                        "cannot write")
    # a folder by the name of the resume folder that score-questions did not make is not deleted
    stranger = setup["out"].parent / ".scores.jsonl.partial"
    stranger.mkdir(parents=True)
    (stranger / "notes.txt").write_text("mine")
    fails_with_one_line(score_argv(setup), capsys, stranger, "did not write")
    assert (stranger / "notes.txt").exists()
    # with --overwrite, the inputs themselves are still protected
    fails_with_one_line(score_argv(setup, "--overwrite", out=setup["qs"]), capsys,
                        "--questions", setup["qs"])
    assert setup["qs"].read_text().splitlines() == QUESTIONS


@pytest.mark.e2e
def test_read_only_folder_is_reported_before_any_work(setup, capsys, monkeypatch):
    """Tests run as root, whom permissions do not stop: the probe's failure is simulated."""
    import tempfile

    def read_only(*args, **kwargs):
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    fails_with_one_line(score_argv(setup), capsys, setup["out"], "Read-only file system")


def test_os_errors_and_non_finite_scores_are_one_line(capsys):
    assert cli.describe_os_error(PermissionError(13, "Permission denied", "/x/y")) == \
        "/x/y: Permission denied"
    assert cli.describe_os_error(OSError(18, "Invalid cross-device link", "/a", None, "/b")) == \
        "/a -> /b: Invalid cross-device link"
    with pytest.raises(cli.CLIError, match=r"q.txt:4: score\(s\) \['jsd', 'p_weak'\] are not"):
        commands.json_line({"jsd": float("nan"), "p_weak": [0.5, float("inf")], "ok": 1.0}, "q.txt:4")
    assert cli.one_line("a\n  b\n\nc") == "a; b; c"


# --------------------------------------------------------------------------- train


def test_train_arguments_may_be_intermixed():
    for argv in (["train", "c.yaml", "--no-progress", "a.b=1"],
                 ["train", "--no-progress", "c.yaml", "a.b=1"],
                 ["train", "c.yaml", "a.b=1", "--no-progress", "--dry-run"],
                 ["train", "c.yaml", "--no-tensorboard", "a.b=1", "--no-progress", "c.d=2"]):
        args = parse_args(argv)
        assert str(args.config) == "c.yaml" and args.overrides[0] == "a.b=1", argv
        assert args.no_progress or args.dry_run
    assert parse_args(["train", "c.yaml"]).overrides == []


@pytest.mark.e2e
@pytest.mark.parametrize("argv", [
    ["train", CONFIG, "--no-progress", "optimizer.bogus=1"],
    ["train", "--no-progress", CONFIG, "optimizer.bogus=1"],
    ["train", CONFIG, "optimizer.bogus=1", "--no-tensorboard"],
])
def test_intermixed_train_reaches_the_config_check(argv, capsys):
    """The option between config and override no longer ends parsing: the override is read and
    its unknown key reported (nothing is trained)."""
    fails_with_one_line(argv, capsys, "unknown key 'optimizer.bogus'")


@pytest.mark.e2e
def test_a_config_with_a_byte_order_mark_is_read(tmp_path, capsys):
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(codecs.BOM_UTF8 + f"base: {CONFIG}\n".encode())
    fails_with_one_line(["train", bom, "optimizer.bogus=1"], capsys, "unknown key 'optimizer.bogus'")


def _train_bad_cases(tmp):
    (tmp / "syntax.yaml").write_text("kind: sft\nrun:\n\tsteps: 3\n")  # a tab
    (tmp / "latin1.yaml").write_bytes("kind: sft\n# caf\xe9\n".encode("latin-1"))
    (tmp / "folder.yaml").mkdir()
    (tmp / "list.yaml").write_text("- kind\n- sft\n")
    return [
        (["train", tmp / "nope.yaml"], ["nope.yaml", "not found"]),
        (["train", tmp / "folder.yaml"], ["folder.yaml", "directory"]),
        (["train", tmp / "syntax.yaml", "--no-progress"], ["syntax.yaml", "line 3"]),
        (["train", tmp / "latin1.yaml"], ["latin1.yaml:2", "not UTF-8"]),
        (["train", tmp / "list.yaml"], ["list.yaml", "mapping"]),
        (["train", tmp / "nope.yaml", "--dry-run"], ["nope.yaml"]),
        (["train", CONFIG, "steps"], ["key=value", "steps"]),
        (["train", CONFIG, "=3"], ["key=value"]),
        (["train"], ["config"]),
        (["train", "--no-progress"], ["config"]),
        (["train", CONFIG, "--resume-from", "x"], ["--resume-from"]),
        (["trian", CONFIG], ["trian"]),
        ([], ["SUBCOMMAND"]),
        (["--verbose"], ["--verbose"]),  # (--version is an option: it prints the version)
        (["train", CONFIG, "--no-progres"], ["--no-progres"]),  # no prefix matching
        (["train", CONFIG, "--dry"], ["--dry"]),
    ]


@pytest.mark.e2e
def test_bad_train_invocations(tmp_path, capsys):
    cases = _train_bad_cases(tmp_path)
    for argv, names in cases:
        fails_with_one_line(argv, capsys, *names)
    assert len(cases) == 16


# --------------------------------------------------------------------------- good inputs


def run_ok(argv, capsys):
    capsys.readouterr()
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return captured.out


@pytest.fixture
def tiny(folders, rows):  # noqa: F811 (the fixtures of test_cli_score)
    return {k: v for k, v in folders.items() if k != "nli"}, rows[0][:6], rows[1][:6]


@pytest.mark.e2e
def test_byte_order_marks_and_upper_case_suffixes_are_read(tiny, tmp_path, capsys):
    models, situations, questions = tiny
    table = tmp_path / "PAIRS.CSV"  # Excel: "CSV UTF-8", upper-case suffix, CRLF
    body = io.StringIO()
    csv.writer(body).writerows([("situation", "question"), *zip(situations, questions)])
    table.write_bytes(codecs.BOM_UTF8 + body.getvalue().encode())
    txt = tmp_path / "situations.txt"
    txt.write_bytes(codecs.BOM_UTF8 + ("\n".join(situations) + "\n").encode())
    out = tmp_path / "a.jsonl"
    run_ok(args_for(models, txt, table, out), capsys)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["situation"] for r in records] == situations  # no BOM inside the first one
    assert [r["question_as_given"] for r in records] == questions
    assert records[0]["question_at"].endswith("PAIRS.CSV:2")


@pytest.mark.e2e
def test_line_separators_inside_a_line_do_not_shift_rows(tiny, tmp_path, capsys):
    models, situations, questions = tiny
    odd = list(situations)
    odd[1] = odd[1].replace(" ", "\u2028", 1) + "\x0c"  # str.splitlines would split this line
    sit = write_lines(tmp_path / "s.txt", odd)
    qs = write_lines(tmp_path / "q.txt", questions)
    out = tmp_path / "a.jsonl"
    run_ok(args_for(models, sit, qs, out), capsys)
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(questions)


@pytest.mark.e2e
def test_a_very_long_line_is_truncated_and_counted(tiny, tmp_path, capsys):
    """A 300,000-character situation is cut to --max-input-length tokens, counted, not refused."""
    models, situations, questions = tiny
    long = list(situations)
    long[2] = "I told my friend a lie " * 12_500
    out = tmp_path / "a.jsonl"
    printed = run_ok(args_for(models, write_lines(tmp_path / "s.txt", long),
                              write_lines(tmp_path / "q.txt", questions), out), capsys)
    counts = dict(item.rsplit(" ", 1) for item in
                  printed.split("counts: ")[1].splitlines()[0].split(", "))
    assert int(counts["truncated_judge_inputs"]) >= 1
    assert len(out.read_text().splitlines()) == len(questions)


@pytest.mark.e2e
def test_overwrite_replaces_an_earlier_longer_run_whole(tiny, tmp_path, capsys):
    models, situations, questions = tiny
    sit = write_lines(tmp_path / "s.txt", situations)
    qs = write_lines(tmp_path / "q.txt", questions)
    out = tmp_path / "scores.jsonl"
    out.write_text('{"stale": true}\n' * 50)
    fails_with_one_line(args_for(models, sit, qs, out), capsys, out, "--overwrite")
    run_ok(args_for(models, sit, qs, out, "--overwrite"), capsys)
    lines = out.read_text().splitlines()
    assert len(lines) == len(questions) and "stale" not in out.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".scores.jsonl")]
    empty = tmp_path / "empty.jsonl"
    empty.touch()  # an empty file (mktemp) holds no results: no --overwrite needed
    run_ok(args_for(models, sit, qs, empty), capsys)


@pytest.mark.e2e
def test_a_failed_write_is_one_line_and_leaves_the_earlier_file(tiny, tmp_path, capsys,
                                                                monkeypatch):

    models, situations, questions = tiny
    sit = write_lines(tmp_path / "s.txt", situations)
    qs = write_lines(tmp_path / "q.txt", questions)
    out = tmp_path / "scores.jsonl"
    out.write_text("earlier\n")

    def disk_full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(command, "atomic_write_bytes", disk_full)  # the writer of --out
    fails_with_one_line(args_for(models, sit, qs, out, "--overwrite"), capsys, out,
                        "No space left on device")
    assert out.read_text() == "earlier\n"


def _kill_on_call(monkeypatch, kill_at: int | None) -> list:
    """Count RewardPipeline calls; raise KeyboardInterrupt (the job is killed) on call `kill_at`."""
    from clarifyjax.reward.pipeline import RewardPipeline

    calls, real = [], RewardPipeline.__call__

    def call(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == kill_at:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RewardPipeline, "__call__", call)
    return calls


@pytest.mark.e2e
def test_a_killed_run_resumes_at_its_first_unfinished_chunk(folders, rows, tmp_path, capsys,
                                                            monkeypatch):
    models = {k: v for k, v in folders.items() if k != "nli"}
    sit = write_lines(tmp_path / "s.txt", rows[0])  # 12 rows, --batch-size 8: 2 chunks of 6
    qs = write_lines(tmp_path / "q.txt", rows[1])
    reference, out = tmp_path / "reference.jsonl", tmp_path / "scores.jsonl"
    run_ok(args_for(models, sit, qs, reference), capsys)
    partial = tmp_path / ".scores.jsonl.partial"

    _kill_on_call(monkeypatch, kill_at=2)
    with pytest.raises(KeyboardInterrupt):
        main([str(a) for a in args_for(models, sit, qs, out)])
    assert not out.exists()  # nothing under the final name
    assert sorted(p.name for p in partial.iterdir()) == ["chunk-000000.npz", "run.json"]

    calls = _kill_on_call(monkeypatch, kill_at=None)
    printed = run_ok(args_for(models, sit, qs, out), capsys)
    assert len(calls) == 1 and "resumed: 1 of 2 chunks" in printed
    assert out.read_text() == reference.read_text()  # as if it had never been killed
    assert not partial.exists()


@pytest.mark.e2e
def test_chunks_of_other_inputs_are_not_reused(folders, rows, tmp_path, capsys, monkeypatch):
    models = {k: v for k, v in folders.items() if k != "nli"}
    sit = write_lines(tmp_path / "s.txt", rows[0])
    qs = write_lines(tmp_path / "q.txt", rows[1])
    out = tmp_path / "scores.jsonl"
    _kill_on_call(monkeypatch, kill_at=2)
    with pytest.raises(KeyboardInterrupt):
        main([str(a) for a in args_for(models, sit, qs, out)])
    write_lines(qs, [rows[1][1]] + rows[1][1:])  # the first question changed
    calls = _kill_on_call(monkeypatch, kill_at=None)
    printed = run_ok(args_for(models, sit, qs, out), capsys)
    assert len(calls) == 2 and "resumed" not in printed
    assert json.loads(out.read_text().splitlines()[0])["question"] == rows[1][1]


# --------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from helpers.tiny_models import tiny_spm_folder
    from clarifyjax.text.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(tiny_spm_folder(tmp_path_factory))


@pytest.mark.parametrize("text,what", [
    ("lying \ud800 to a friend", "a lone surrogate"),
    ("\udcff", "a lone surrogate"),
    ("lying\x00 to a friend", "a NUL character"),
    ("\x00", "a NUL character"),
])
def test_unencodable_text_names_its_index(tokenizer, text, what):
    from clarifyjax.text.tokenizer import TextEncodingError

    with pytest.raises(TextEncodingError, match=f"text 1 of the batch cannot be encoded: {what}"
                       ) as info:
        tokenizer.encode_batch(["fine", text, "fine"], 16)
    assert info.value.index == 1 and isinstance(info.value, ValueError)
    assert repr(text)[1:-1][:20] in str(info.value)


def test_long_text_is_truncated_and_counted(tokenizer):
    """A 200,000-character line is cut to max_length tokens (EOS last) and counted, not refused."""
    ids, mask, stats = tokenizer.encode_batch_with_stats(["why " * 50_000, "fine"], 16)
    assert ids.shape == (2, 16) and mask[0].all() and ids[0, -1] == tokenizer.eos_id
    assert stats.truncated_rows == (0,)
