"""`clarifyjax interact` through a pipe (issue 15), and the session logic that `interact` and
`web` share (`clarify.Session`), on a fake clarifier."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from clarifyjax.app.clarifier import MAX_TURNS, Session, SessionError, run_steps
from helpers.children import clean_env
from helpers.clarify_models import QUESTION_OPTIONS, FakeClarifier

SITUATION = "ignoring a phone call from my mother"
# What interact refuses, one error line each (and the words of each line)
BAD_SITUATION_LINES = [b"/skip", b"/another", b"/frobnicate", "\u200b\u200b".encode(),
                       b"caf\xe9 au lait", b"a nul \x00 here", b"\xff\xfe", "\u2060".encode()]
BAD_ANSWER_LINES = [b"/bogus", "\u200b".encode(), b"\xc3(", b"yes \x00"]
BAD_MESSAGES = ["/skip acts on a question", "/another acts on a question", "unknown command",
                "only invisible characters", "lone surrogate", "NUL character", "lone surrogate",
                "only invisible characters", "unknown command", "answer is empty",
                "lone surrogate", "NUL character"]
ANSWERS = ["she was in the hospital", "I was driving on the highway", "I called her back later"]


@pytest.mark.e2e
@pytest.mark.child
@pytest.mark.slow  # a child interpreter loads and compiles the five models
def test_three_turns_through_a_pipe_judged_as_the_judge_judges_directly(models_yaml, tmp_path):
    import yaml

    from clarifyjax.reward.judge import load_judge

    transcript = tmp_path / "transcript.jsonl"
    # Lines that are not situations first: each is one error line, and the prompt asks again.
    # After three turns the session stops; a 100,000-character situation is cut (and counted),
    # /quit ends its session; the empty line then ends the program.
    lines = [*BAD_SITUATION_LINES, SITUATION.encode(), *BAD_ANSWER_LINES,
             *(a.encode() for a in ANSWERS), b"worse " * 20000, b"/quit", b"", b"never read"]
    proc = subprocess.run([sys.executable, "-m", "clarifyjax", "interact", models_yaml,
                           "--transcript", str(transcript), *QUESTION_OPTIONS],
                          input=b"\n".join(lines) + b"\n",
                          env=clean_env(JAX_PLATFORMS="cpu"), capture_output=True, timeout=300)
    stdout, stderr = proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stdout.splitlines() if line.startswith("error: ")]
    assert len(errors) == len(BAD_SITUATION_LINES) + len(BAD_ANSWER_LINES), errors
    for error, expected in zip(errors, BAD_MESSAGES):
        assert expected in error, (error, expected)
    assert stdout.count("question: ") == MAX_TURNS + 1 and stdout.count("summary: ") == 2
    out_lines = stdout.splitlines()
    long_at = next(i for i, line in enumerate(out_lines) if line.startswith("situation: worse"))
    note = out_lines[long_at - 1]  # the step's note comes before its judgment is shown
    assert note.startswith("note: ") and "question generator 1" in note and "judge 1" in note
    turns = [json.loads(line) for line in transcript.read_text(encoding="utf-8").splitlines()]
    assert [t["turn"] for t in turns] == [0, 1, 2, 3, 0]
    assert len({t["session"] for t in turns[:4]}) == 1
    turns = turns[:4]
    assert turns[0]["situation"] == SITUATION
    assert [t["answer"] for t in turns] == [*ANSWERS, None]
    assert all(t["question"] for t in turns[:3]) and turns[3]["question"] == ""

    judge_folder = yaml.safe_load(open(models_yaml))["rewards"]["judge"]["model"]["init"]
    judge = load_judge(judge_folder, max_input_length=64)
    for turn in turns:  # each turn's judgment is the judge's own, computed here directly
        direct = judge.class_probabilities([turn["situation"]])[0]
        np.testing.assert_allclose(turn["probabilities"], direct, rtol=0, atol=1e-6)
        assert turn["judgment"] == ("bad", "ok", "good")[int(np.argmax(direct))]
    assert len({t["situation"] for t in turns}) > 1  # the answers changed the situation


def test_session_turns_skips_other_questions_and_the_end():
    fake, a, b = FakeClarifier(), Session.start("  a  situation "), Session.start("another one")
    run_steps(fake, [a, b], rng=None)  # two sessions, one batch
    assert len(fake.batches) == 1 and a.situation == "a situation"
    assert [t.situation for t in a.turns] == ["a situation"] and a.turns[0].question
    a.another_question()
    run_steps(fake, [a], None)
    assert len(a.turns) == 1 and len(a.turns[0].questions_asked) == 2
    a.answer("yes")
    run_steps(fake, [a], None)
    assert a.turns[0].answer == "yes" and a.turns[1].situation == "a situation + yes"
    a.skip()
    run_steps(fake, [a], None)
    assert a.turns[1].skipped and a.turns[2].situation == a.turns[1].situation
    assert not a.turns[2].fused
    a.answer("no")
    run_steps(fake, [a], None)
    assert a.done and a.turns[-1].question == ""  # the last turn asks nothing
    assert fake.batches[-1][0].ask is False
    with pytest.raises(SessionError, match="over"):
        a.answer("more")
    assert [t.situation for t in b.turns] == ["another one"]  # b untouched by a's turns
    assert " -> " in a.summary()


def test_session_refuses_what_its_state_does_not_allow():
    with pytest.raises(SessionError, match="empty"):
        Session.start("   ")
    s = Session.start("x")
    with pytest.raises(SessionError, match="still working"):
        s.answer("y")  # the start step has not run
    run_steps(FakeClarifier(), [s], None)
    with pytest.raises(SessionError, match="empty"):
        s.answer(" ")
    s.answer("y")
    s.fail()  # a failed step leaves the session as it was
    assert s.pending is None and len(s.turns) == 1


def test_commands_and_texts_at_each_prompt(capsys):
    from clarifyjax.app.interact import command_of

    cases = [("situation", "/quit", "quit"), ("situation", " /quit ", "quit"),
             ("situation", "/skip", None), ("situation", "/another", None),
             ("situation", "/help", None), ("situation", "/r/AITA lying to a friend", "situation"),
             ("situation", "lying /skip", "situation"), ("answer", "", "skip"),
             ("answer", "/skip", "skip"), ("answer", " /another", "another"),
             ("answer", "/quit", "quit"), ("answer", "/stop", None),
             ("answer", "she was ill", "answer"), ("answer", "/ yes", "answer")]
    for prompt, line, expected in cases:
        assert command_of(line, prompt) == expected, (prompt, line)
    assert capsys.readouterr().out.count("error: ") == 4


@pytest.mark.parametrize("text, message", [
    ("   ", "is empty"), ("\u200b \u200b", "only invisible characters (U+200B)"),
    ("\ufeff", "only invisible"), ("a \x00 b", "NUL character"), ("a \udcff", "lone surrogate"),
    (5, "must be text, got a number"), (None, "must be text, got null"),
    (["a"], "must be text, got a list")])
def test_sessions_refuse_what_ask_and_web_refuse(text, message):
    with pytest.raises(SessionError, match=re.escape(message)):
        Session.start(text)
    s = Session.start("x")
    run_steps(FakeClarifier(), [s], None)
    with pytest.raises(SessionError, match="empty" if isinstance(text, str) and (
            text.isspace() or "\u200b" in text or "\ufeff" in text) else re.escape(message)):
        s.answer(text)
    assert s.pending is None  # still waiting for a usable answer
