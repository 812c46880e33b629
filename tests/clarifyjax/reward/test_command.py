"""`clarifyjax score-questions` on tiny random models: output, summary, and bad input.

The models are those of test_pipeline.py (same seeds, so the session builds them once).
The scores in the JSONL must equal `RewardPipeline` called directly on the same rows; every bad
input named in issue 4 must end in exit status 2 and one line naming the file, line or field.
"""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import numpy as np
import pytest

from clarifyjax.core.buckets import equal_chunks
from clarifyjax.cli import SUBCOMMANDS, main
from clarifyjax.reward.pipeline import PipelineConfig, RewardPipeline
from helpers.env import shared_data
from helpers.score_cli import N, args_for, write_lines
from helpers.tiny_models import tiny_nli_folder, tiny_t5_folder


def run_cli(argv, capsys):
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(scope="module")
def scored(folders, rows, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    sit = write_lines(folder / "situations.txt", rows[0])
    qs = write_lines(folder / "questions.txt", rows[1])
    out = folder / "scores.jsonl"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # capsys is function-scoped
        status = main(args_for(folders, sit, qs, out))
    return status, printed.getvalue(), out


@pytest.mark.reference
def test_scores_are_written_and_summarized(scored, rows):
    status, printed, out = scored
    assert status == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == N
    assert [r["question"] for r in records] == rows[1]
    assert records[2]["situation_at"].endswith("situations.txt:3")
    for r in records:
        assert set(r) >= {"reward", "jsd", "valid", "weak_answer", "strong_answer",
                          "weak_situation", "strong_situation", "p_weak", "p_strong"}
        assert abs(sum(r["p_weak"]) - 1) < 1e-5
    assert "Table 4: avg. JSD" in printed and "judgment flips" in printed
    valid = [r["jsd"] for r in records if r["valid"]]
    expected = f"avg. JSD {np.mean(valid):.4f} over {len(valid)} pairs"
    assert expected in printed
    assert not list(out.parent.glob("*.tmp*"))  # written atomically


@pytest.mark.reference
def test_scores_equal_the_pipeline_called_directly(scored, folders, rows):
    _, _, out = scored
    records = [json.loads(line) for line in out.read_text().splitlines()]
    pipeline = RewardPipeline.from_folders(
        **folders, nli_batch_size=16,
        config=PipelineConfig(answer_max_length=10, fusion_max_length=14,
                              judgment_max_length=6))
    first = equal_chunks(N, 8)[0]
    direct = pipeline(rows[0][first], rows[1][first], rng=0)  # greedy: the seed does not matter
    assert [r["weak_answer"] for r in records[first]] == direct.weak_answers
    assert [r["strong_situation"] for r in records[first]] == direct.strong_situations
    np.testing.assert_allclose([r["reward"] for r in records[first]], direct.reward, atol=1e-6)


@pytest.mark.reference
@pytest.mark.e2e
def test_tsv_input_with_columns_and_limit(folders, tmp_path, capsys):
    dev = shared_data("delta-clarify/dev.tsv")
    out = tmp_path / "out.jsonl"
    status, printed, err = run_cli(args_for(folders, dev, dev, out, "--limit", str(N),
                                            "--dropped-answer", "blank"), capsys)
    assert status == 0, err
    assert len(out.read_text().splitlines()) == N and "pairs" in printed


@pytest.mark.reference
@pytest.mark.e2e
def test_empty_question_names_file_and_line(folders, rows, tmp_path, capsys):
    questions = list(rows[1])
    questions[2] = "  "
    qs = write_lines(tmp_path / "q.txt", questions)
    sit = write_lines(tmp_path / "s.txt", rows[0])
    status, _, err = run_cli(args_for(folders, sit, qs, tmp_path / "o.jsonl"), capsys)
    assert status == 2
    assert f"{qs}:3: field 'question' is empty" in err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.reference
@pytest.mark.e2e
def test_empty_question_in_a_table_names_file_and_line(folders, tmp_path, capsys):
    table = tmp_path / "pairs.tsv"
    table.write_text("situation\tquestion\nlying to a friend\twhy?\nhelping out\t\n")
    status, _, err = run_cli(args_for(folders, table, table, tmp_path / "o.jsonl"), capsys)
    assert status == 2 and f"{table}:3: column 'question' is empty" in err


@pytest.mark.reference
@pytest.mark.e2e
def test_500_word_question_is_truncated_and_counted(folders, rows, tmp_path, capsys):
    questions = list(rows[1])
    questions[4] = " ".join(["why would you do that"] * 100)  # 500 words
    qs = write_lines(tmp_path / "q.txt", questions)
    sit = write_lines(tmp_path / "s.txt", rows[0])
    out = tmp_path / "o.jsonl"
    status, printed, err = run_cli(args_for(folders, sit, qs, out), capsys)
    assert status == 0, err
    assert "truncated_questions 1" in printed
    record = json.loads(out.read_text().splitlines()[4])
    assert record["question_truncated"] and len(record["question"].split()) == 64


@pytest.mark.reference
@pytest.mark.e2e
def test_judge_without_a_class_token(folders, rows, tmp_path_factory, tmp_path, capsys):
    bad_judge = tiny_t5_folder(tmp_path_factory, seed=5, minus_one=False)
    sit = write_lines(tmp_path / "s.txt", rows[0])
    qs = write_lines(tmp_path / "q.txt", rows[1])
    status, _, err = run_cli(args_for({**folders, "judge": bad_judge}, sit, qs,
                                      tmp_path / "o.jsonl"), capsys)
    assert status == 2
    assert str(bad_judge) in err and "class token '-1' is not one vocabulary id" in err


@pytest.mark.reference
@pytest.mark.e2e
def test_nli_with_unexpected_labels(folders, rows, tmp_path_factory, tmp_path, capsys):
    bad_nli = tiny_nli_folder(tmp_path_factory, ("positive", "negative", "neutral"))
    sit = write_lines(tmp_path / "s.txt", rows[0])
    qs = write_lines(tmp_path / "q.txt", rows[1])
    status, _, err = run_cli(args_for({**folders, "nli": bad_nli}, sit, qs,
                                      tmp_path / "o.jsonl"), capsys)
    assert status == 2
    assert "config.json" in err and "'positive'" in err and "entailment" in err


@pytest.mark.reference
@pytest.mark.e2e
def test_mismatched_files_and_missing_folder(folders, rows, tmp_path, capsys):
    sit = write_lines(tmp_path / "s.txt", rows[0])
    qs = write_lines(tmp_path / "q.txt", rows[1][:-1])
    status, _, err = run_cli(args_for(folders, sit, qs, tmp_path / "o.jsonl"), capsys)
    assert status == 2 and f"has {N} situations but {qs} has {N - 1} questions" in err
    qs = write_lines(tmp_path / "q.txt", rows[1])
    status, _, err = run_cli(args_for({**folders, "fusion": tmp_path / "nope"}, sit, qs,
                                      tmp_path / "o.jsonl"), capsys)
    assert status == 2 and "nope" in err


def test_equal_chunks():
    assert [s.stop - s.start for s in equal_chunks(100, 64)] == [50, 50]
    assert [s.stop - s.start for s in equal_chunks(130, 64)] == [43, 44, 43]
    assert equal_chunks(5, 64) == [slice(0, 5)]


@pytest.mark.e2e
@pytest.mark.child
def test_subcommands_and_python_dash_m():
    assert "score-questions" in SUBCOMMANDS
    proc = subprocess.run([sys.executable, "-m", "clarifyjax", "score-questions", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--situations" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "clarifyjax"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "SUBCOMMAND" in proc.stderr
