"""`clarifyjax interact` through a pipe (issue 15), and the session logic that `interact` and
`web` share (`clarify.Session`), on a fake clarifier."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from clarifyjax.app.clarifier import MAX_TURNS, Session, SessionError, run_steps
from conftest import REPO_ROOT
from helpers.children import clean_env
from helpers.clarify_models import QUESTION_OPTIONS, FakeClarifier, models_yaml  # noqa: F401

SITUATION = "ignoring a phone call from my mother"
ANSWERS = ["she was in the hospital", "I was driving on the highway", "I called her back later"]


@pytest.mark.slow  # a child interpreter loads and compiles the five models
def test_three_turns_through_a_pipe_judged_as_the_judge_judges_directly(models_yaml, tmp_path):
    import yaml

    from clarifyjax.reward import judge as delphi

    transcript = tmp_path / "transcript.jsonl"
    # After three turns the session stops; the empty line then ends the program.
    stdin = "\n".join([SITUATION, *ANSWERS, "", "never read"]) + "\n"
    proc = subprocess.run([sys.executable, "-m", "clarifyjax", "interact", models_yaml,
                           "--transcript", str(transcript), *QUESTION_OPTIONS],
                          input=stdin, cwd=REPO_ROOT, env=clean_env(JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("question: ") == MAX_TURNS and "summary: " in proc.stdout
    turns = [json.loads(line) for line in transcript.read_text(encoding="utf-8").splitlines()]
    assert [t["turn"] for t in turns] == [0, 1, 2, 3]
    assert len({t["session"] for t in turns}) == 1
    assert turns[0]["situation"] == SITUATION
    assert [t["answer"] for t in turns] == [*ANSWERS, None]
    assert all(t["question"] for t in turns[:3]) and turns[3]["question"] == ""

    judge_folder = yaml.safe_load(open(models_yaml))["rewards"]["judge"]["model"]["init"]
    judge = delphi.load_judge(judge_folder, max_input_length=64)
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
