"""`clarifyjax ask` on tiny random models (issue 15): one complete row per situation of δ-CLARIFY
dev.tsv, a run killed with SIGKILL mid-file resumes into the very file an uninterrupted run
writes, ranked candidates and CSV, and bad MODELS.yaml files in one line."""
from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys

import pytest

from clarifyjax.cli import main
from helpers.env import shared_data
from helpers.children import clean_env, killed_on_second_call
from helpers.clarify_models import QUESTION_OPTIONS

N = 32
ROW_KEYS = ("situation_at", "situation", "question", "reward", "raw_reward", "jsd", "valid",
            "weak_answer", "strong_answer", "weak_dropped", "strong_dropped", "weak_situation",
            "strong_situation", "p_base", "p_weak", "p_strong", "judgment_text", "judgment")

# The child SIGKILLs itself when the second chunk starts: one chunk is saved, the file is not.
KILLED_CHILD = killed_on_second_call("clarifyjax.app.clarifier", "Clarifier.ask",
                                     "from clarifyjax.cli import main\nsys.exit(main(sys.argv[1:]))")


def ask_argv(models, out, *extra, limit=N):
    return ["ask", models, "--situations", str(shared_data("delta-clarify/dev.tsv")),
            "--limit", str(limit), "--out", str(out), "--batch-size", "16", "--seed", "7",
            "--no-progress", *QUESTION_OPTIONS, *extra]


@pytest.mark.child
@pytest.mark.slow  # a child interpreter loads and compiles the five models
def test_ask_writes_a_row_per_situation_and_a_killed_run_resumes_to_the_same_file(
        models_yaml, tmp_path, capsys):
    reference = tmp_path / "reference.jsonl"
    assert main(ask_argv(models_yaml, reference)) == 0
    # the tiny models read short inputs: the cuts are counted, per model, in one closing note
    note = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert len(note) == 1 and "cut to its max_input_length" in note[0], note
    rows = [json.loads(line) for line in reference.read_text(encoding="utf-8").splitlines()]
    with open(shared_data("delta-clarify/dev.tsv"), newline="", encoding="utf-8") as f:
        situations = [r["situation"] for r in csv.DictReader(f, delimiter="\t",
                                                             quoting=csv.QUOTE_NONE)][:N]
    assert len(rows) == N and [r["situation"] for r in rows] == situations
    for row in rows:
        assert set(ROW_KEYS) <= set(row), set(ROW_KEYS) - set(row)
        assert row["question"], row
        for key in ("p_base", "p_weak", "p_strong"):
            assert len(row[key]) == 3 and abs(sum(row[key]) - 1) < 1e-5
        assert row["judgment"] == ("bad", "ok", "good")[row["p_base"].index(max(row["p_base"]))]

    out = tmp_path / "killed.jsonl"
    proc = subprocess.run([sys.executable, "-c", KILLED_CHILD, *ask_argv(models_yaml, out)],
                          env=clean_env(JAX_PLATFORMS="cpu"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    partial = tmp_path / ".killed.jsonl.partial"
    assert not out.exists() and len(list(partial.glob("chunk-*.npz"))) == 1
    capsys.readouterr()
    assert main(ask_argv(models_yaml, out)) == 0
    out_text = capsys.readouterr().out
    assert "resumed: 1 of 2 chunks" in out_text
    assert note[0] in out_text.splitlines()  # the resumed chunk's cuts are counted too
    assert out.read_bytes() == reference.read_bytes()  # as if it had never been killed
    assert not partial.exists()


def test_candidates_are_ranked_by_the_reward_and_csv_is_written(models_yaml, tmp_path):
    out = tmp_path / "ranked.csv"
    # 8 situations x 2 candidates: the 16 rows of the other test's chunks
    assert main(ask_argv(models_yaml, out, "--candidates", "2", "--no-answers", limit=8)) == 0
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8
    assert set(rows[0]) == {"situation_at", "situation", "question", "p_base_bad", "p_base_ok",
                            "p_base_good", "judgment", "candidates"}
    for row in rows:
        candidates = json.loads(row["candidates"])
        assert len(candidates) == 2
        best = max(candidates, key=lambda c: c["raw_reward"])
        assert row["question"] == best["question"]


@pytest.mark.parametrize("content, message", [
    ("kind: sft\nmodel: /tmp\n", "names no question generator"),
    ("policy: {init: /no/such/folder}\nrewards: {answerer: /no/a, fusion: /no/f, "
     "judge: {model: /no/j}}\n", "policy.init /no/such/folder: no such folder"),
    ("policy: {tiny: {d_model: 8}}\nrewards: {answerer: /a, fusion: /f, judge: {model: /j}}\n",
     "policy.init: the question generator must be a trained"),
    ("policy: {init: /tmp, colour: red}\n", "colour"),
])
def test_bad_models_files_are_one_line(tmp_path, capsys, content, message):
    models = tmp_path / "models.yaml"
    models.write_text(content)
    status = main(["ask", str(models), "--situations", str(models), "--out",
                   str(tmp_path / "out.jsonl")])
    err = capsys.readouterr().err
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out.jsonl").exists()


def test_the_output_format_is_checked_first(models_yaml, tmp_path, capsys):
    assert main(ask_argv(models_yaml, tmp_path / "out.txt")) == 2
    assert "--out" in capsys.readouterr().err and not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("line, message", [
    ('{"situation": 5}', "field 'situation' must be text, got a number (5)"),
    ('{"situation": 1.5}', "field 'situation' must be text, got a number (1.5)"),
    ('{"situation": true}', "field 'situation' must be text, got true/false"),
    ('{"situation": {"text": "a"}}', "holds a JSON array or object, not text"),
    ('{"situation": "\\u200b\\u2060"}', "only invisible characters (U+200B, U+2060)"),
    ('{"situation": "a \\ud800 b"}', "lone surrogate"),
    ('{"situation": null}', "is empty"),
])
def test_a_situation_that_is_not_text_is_named_by_file_and_line(tmp_path, capsys, line, message):
    folders = {k: tmp_path / k for k in ("p", "a", "f", "j")}
    for folder in folders.values():
        folder.mkdir()  # checked to exist; nothing is loaded before the situations are read
    models = tmp_path / "models.yaml"
    models.write_text(f"policy: {{init: {folders['p']}}}\nrewards: {{answerer: {folders['a']}, "
                      f"fusion: {folders['f']}, judge: {{model: {folders['j']}}}}}\n")
    situations = tmp_path / "s.jsonl"
    situations.write_text('{"situation": "lying to a friend"}\n' + line + "\n")
    status = main(["ask", str(models), "--situations", str(situations), "--out",
                   str(tmp_path / "out.jsonl")])
    err = capsys.readouterr().err
    assert status == 2 and f"{situations}:2" in err and message in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out.jsonl").exists()
