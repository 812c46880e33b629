"""Inputs that used to change meaning on the way or fail late (issue 26, items 6 and 8), each
refused in one line in this process: a `key=value` override given twice (every command that takes
them, and every config loader), `python -m clarifyjax.models.tiny` taking an option for a folder
name, the two shared checks behind the commands' texts and output folders
(`textfiles.text_problem`, `textfiles.check_output_folder`), and `sage-jax run`'s empty
paraphrases and `out=` naming a file."""
from __future__ import annotations

import os

import pytest

from clarifyjax import cli
from clarifyjax.config.loader import ConfigError
from helpers.env import REPO_ROOT, shared_data

TINY_SFT = REPO_ROOT / "clarifyjax" / "presets" / "sft_question_tiny.yaml"


@pytest.mark.e2e
@pytest.mark.parametrize("items", [
    ["run.steps=2", "run.steps=3"],
    ["run.steps=2", "run.steps=2"],            # even the same value: one was typed by mistake
    ["run.steps =2", " run.steps=3"],          # the same key, spelled with spaces
    ["optimizer.learning_rate=1e-4", "run.steps=2", "optimizer.learning_rate=1e-3"],
    ["dryrun.rows=2", "dryrun.rows=4"],        # the dry run's own options too
])
def test_train_refuses_an_override_given_twice(items, capsys):
    status = cli.main(["train", str(TINY_SFT), *items, "--dry-run"])
    err = capsys.readouterr().err
    key = items[-1].partition("=")[0].strip()
    assert status == 2 and f"override key {key!r} is given twice" in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.e2e
def test_in_code_overrides_compose_and_every_command_line_refuses_a_repeat(tmp_path, capsys):
    """Overrides composed in code apply in order (a helper's defaults, then the caller's: the
    later wins); a key typed twice on a command line is refused."""
    from clarifyjax.config import load_config
    from sage_jax import cli as sage_cli

    assert load_config(TINY_SFT, ["run.seed=1", "run.seed=2"]).run.seed == 2
    evaluate = tmp_path / "e.yaml"
    evaluate.write_text("kind: evaluate\nsystems:\n  - {name: a, kind: t5, model: m}\n"
                        "rewards: {answerer: x, fusion: y, judge: {model: z}}\n")
    models = tmp_path / "models.yaml"
    models.write_text("policy: {init: a}\nrewards: {answerer: b, fusion: c, judge: {model: d}}\n")
    run = tmp_path / "run.yaml"
    run.write_text(f"questions: {tmp_path / 'q.csv'}\nout: {tmp_path / 'out'}\n")
    # and on the command lines of evaluate, ask and sage-jax run: exit 2, one line
    for main, argv, prefix in (
            (cli.main, ["evaluate", str(evaluate), "out=a", "out=b"], "clarifyjax evaluate"),
            (cli.main, ["ask", str(models), "policy.dtype=float32", "policy.dtype=bfloat16",
                        "--situations", str(models), "--out", str(tmp_path / "o.jsonl")],
             "clarifyjax ask"),
            (sage_cli.main, ["run", str(run), "seed=1", "limit=2", "seed=1"], "sage-jax")):
        status = main(argv)
        err = capsys.readouterr().err
        assert status == 2 and err.startswith(prefix) and "is given twice" in err, err
        assert len(err.strip().splitlines()) == 1


def test_score_questions_refuses_an_item_given_twice(tmp_path):
    from clarifyjax.config.score import reward_config
    from clarifyjax.cli import parse_args

    args = parse_args(["score-questions", "--situations", "s.txt", "--questions", "q.txt",
                       "--out", str(tmp_path / "o.jsonl"), "--answerer", "a", "--fusion", "f",
                       "--judge", "j", "answer_temperature=0.5",
                       "answer_temperature=0.7"])
    with pytest.raises(ConfigError, match="'answer_temperature' is given twice"):
        reward_config(args)


@pytest.mark.e2e
@pytest.mark.parametrize("argv, message", [
    (["--help"], None),
    (["-h"], None),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["a", "b"], "unrecognized arguments: b"),
    (["FILE"], "is a file, not a folder"),
    (["FULL"], "which are not a tiny classifier's files"),
    ([""], "DIR: empty"),
])
def test_the_tiny_classifier_script_reads_options_as_options(tmp_path, monkeypatch, capsys,
                                                             argv, message):
    from clarifyjax.models import tiny

    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("not a folder")
    (tmp_path / "FULL").mkdir()
    (tmp_path / "FULL" / "notes.txt").write_text("someone's work")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(SystemExit) as e:
        tiny.main(argv)
    captured = capsys.readouterr()
    if message is None:  # help is printed, nothing is made
        assert e.value.code == 0 and "usage: python -m clarifyjax.models.tiny" in captured.out
    else:
        assert e.value.code == 2 and message in captured.err, captured.err
    assert sorted(os.listdir(tmp_path)) == before  # no folder named --help, nothing overwritten
    assert (tmp_path / "FULL" / "notes.txt").read_text() == "someone's work"


@pytest.mark.parametrize("value, problem", [
    ("a fine text", None), ("", "is empty"), (" \t\n", "is empty"),
    ("\u200b", "only invisible characters (U+200B)"),
    ("\u200b\u200c\u200d\u2060\ufeff", "(U+200B, U+200C, U+200D, ...)"),
    ("\x01\x02", "only invisible characters (U+0001, U+0002)"),
    ("nul \x00", "NUL character (at character 5)"), ("\udcff text", "lone surrogate"),
    (5, "must be text, got a number (5)"), (0.5, "a number (0.5)"),
    (False, "got true/false"), (None, "got null"), ({"a": 1}, "got an object"),
    (b"bytes", "got bytes"),
])
def test_one_rule_for_a_users_text(value, problem):
    from clarifyjax.files.textfiles import text_problem

    got = text_problem(value)
    assert (got is None) if problem is None else (problem in got), got


def test_an_output_folder_is_checked_before_any_work(tmp_path):
    from clarifyjax.files.textfiles import check_output_folder

    (tmp_path / "file").write_text("x")
    assert check_output_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checked, not made
    assert check_output_folder(tmp_path) == tmp_path
    for out, message in ((tmp_path / "file", "is a file"), ("/dev/null", "is not a folder"),
                         (tmp_path / "file" / "sub", "is a file, not a folder"), ("", "empty")):
        with pytest.raises(ValueError, match=message) as e:
            check_output_folder(out, option="out")
        assert str(e.value).startswith("out")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="cannot write"):
            check_output_folder(locked / "run")


def sage_run_config(tmp_path, **over) -> dict:
    """A `sage-jax run` config whose generators are never reached (the checks come first)."""
    local = {"kind": "local", "model": str(tmp_path / "no-model")}
    return {"questions": str(shared_data("sage-mcc/q100_gpt-3.5-turbo_rot.csv")),
            "out": str(tmp_path / "out"), "quiet": True, "paraphrase": {"generator": local},
            "models": [{"name": "m1", "generator": local}], **over}


@pytest.mark.e2e
@pytest.mark.parametrize("cell, message", [
    ("", "'paraphrased' is empty"),
    ("   ", "'paraphrased' is empty"),
    ("\u200b\u200b", "'paraphrased' is empty: it holds only invisible characters (U+200B)"),
    ("\ufeff", "'paraphrased' is empty: it holds only invisible characters (U+FEFF)"),
])
def test_a_paraphrase_file_with_an_empty_paraphrase_is_refused_before_any_work(tmp_path, capsys,
                                                                               cell, message):
    """`sage-jax run` with paraphrase.source: file sent an empty paraphrase to the models."""
    import csv
    import json

    from sage_jax import cli

    questions = tmp_path / "q.csv"
    with open(questions, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["question_id", "question", "paraphrased"])
        writer.writerows([["q1", "Is lying wrong?", "Is it wrong to lie?"],
                          ["q1", "Is lying wrong?", cell],
                          ["q2", "Is theft wrong?", "Is stealing wrong?"]])
    raw = sage_run_config(tmp_path, questions=str(questions), paraphrase={"source": "file"})
    (tmp_path / "run.yaml").write_text(json.dumps(raw))
    assert cli.main(["run", str(tmp_path / "run.yaml"), "--stages", "paraphrase,answer"]) == 2
    err = capsys.readouterr().err
    assert f"{questions}:3: {message}" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("out, message", [("FILE", "is a file; give a folder"),
                                          ("FILE/run", "is a file, not a folder"),
                                          ("/dev/null", "is not a folder")])
def test_out_naming_a_file_is_a_bad_option_named_out(tmp_path, capsys, out, message):
    """`sage-jax run out=<a file>` ended with exit 1 and "File exists"; a bad option is 2."""
    import json

    from sage_jax import cli

    taken = tmp_path / "taken.txt"
    taken.write_text("keep me\n")
    raw = sage_run_config(tmp_path, out=out.replace("FILE", str(taken)))
    (tmp_path / "run.yaml").write_text(json.dumps(raw))
    assert cli.main(["run", str(tmp_path / "run.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sage-jax: error: out ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and taken.read_text() == "keep me\n"
