"""Every model's input format (clarifyjax.text.formats), checked against the strings the original code
builds (allenai/clarifydelphi: reward.py, model/delphi.py) and against the released data files."""
import csv

import pytest

from clarifyjax.text import formats
from helpers.env import shared_data

SITUATION = "lying to a friend"


# ----------------------------------------------------------------------------- helpers


def test_normalize_whitespace():
    assert formats.normalize_whitespace("  a\tb \n\n c  ") == "a b c"
    assert formats.normalize_whitespace("") == ""


def test_ensure_period():
    assert formats.ensure_period("helping out") == "helping out."
    assert formats.ensure_period("helping out.") == "helping out."
    assert formats.ensure_period("helping out.  ") == "helping out."
    assert formats.ensure_period("is it ok?") == "is it ok?."  # the original checks for "." only
    assert formats.ensure_period("") == ""


def test_strip_policy_prefix():
    assert formats.strip_policy_prefix("question: lying to a friend") == SITUATION
    assert formats.strip_policy_prefix("question:   lying  to a friend ") == SITUATION
    assert formats.strip_policy_prefix("question: question: lying to a friend") == SITUATION
    assert formats.strip_policy_prefix(SITUATION) == SITUATION
    # only a prefix: the original's re.sub also removed it mid-sentence
    assert formats.strip_policy_prefix("asking the question: why me") == "asking the question: why me"
    assert formats.strip_policy_prefix("question:able acts") == "question:able acts"
    assert formats.strip_policy_prefix("question: ") == ""


# ----------------------------------------------------------------------------- formats


def test_policy_input():
    assert formats.policy_input(SITUATION) == "question: lying to a friend"
    assert formats.policy_input("question: " + SITUATION) == "question: lying to a friend"  # idempotent
    assert formats.question_sft_example(SITUATION, " Why? ") == ("question: lying to a friend", "Why?")
    with pytest.raises(formats.TextFormatError, match="situation"):
        formats.policy_input("   ")
    with pytest.raises(formats.TextFormatError, match="train.tsv:7.*situation"):
        formats.policy_input("question: ", where="train.tsv:7")


def test_answer_input_matches_original_and_strips_prefix():
    # The original: "answer: " + jud + ' ' + sit + ' TYPE: ' + ut + ' QUESTION: ' + q, with sit
    # ending in "." (its "question: " prefix removed).
    got = formats.answer_input("question: " + SITUATION, "Why are you lying?", "weakener", "It's wrong")
    assert got == ("answer: It's wrong lying to a friend. TYPE: weakener "
                   "QUESTION: Why are you lying?")
    assert "question: " not in got
    got = formats.answer_input(SITUATION + ".", "Why?", "strengthener", "It's wrong")
    assert got == "answer: It's wrong lying to a friend. TYPE: strengthener QUESTION: Why?"
    # no judgment text: no double space
    assert formats.answer_input(SITUATION, "Why?", "weakener") == \
        "answer: lying to a friend. TYPE: weakener QUESTION: Why?"
    with pytest.raises(formats.TextFormatError, match="update_type"):
        formats.answer_input(SITUATION, "Why?", "weaker")
    with pytest.raises(formats.TextFormatError, match="question"):
        formats.answer_input(SITUATION, "", "weakener")


def test_fusion_input_matches_original_and_strips_prefix():
    got = formats.fusion_input("question: refraining from doing something bad",
                         "When do you do something bad?", "when I'm angry")
    assert got == ("merge: SITUATION: refraining from doing something bad. "
                   "QUESTION: When do you do something bad? ANSWER: when I'm angry")
    assert "question: " not in got
    # a blanked answer (the original's behaviour for NLI-filtered answers) is still formatted
    assert formats.fusion_input(SITUATION, "Why?", " ").endswith("QUESTION: Why? ANSWER:")
    assert formats.fusion_fields(SITUATION, "Why?", "for fun") == \
        "SITUATION: lying to a friend. QUESTION: Why? ANSWER: for fun"


def test_judge_input_strips_prefix():
    assert formats.judge_input("question: lying to a friend.") == "[moral_single]: lying to a friend."
    assert formats.judge_input("lying to a friend to protect them") == \
        "[moral_single]: lying to a friend to protect them"


def test_delphi_target_and_prefix():
    assert formats.delphi_target(1, "it's good") == "<class>1</class> <text>it's good</text>"
    assert formats.delphi_target("bad") == "<class>-1</class> <text>it's bad</text>"
    assert formats.delphi_target("0", "it's okay") == "<class>0</class> <text>it's okay</text>"
    for label in (1, 0, -1):
        assert formats.delphi_target(label).startswith(formats.DELPHI_CLASS_PREFIX + str(label) + "</class>")
    assert formats.DELPHI_CLASS_TOKENS == ("1", "0", "-1")
    assert formats.JUDGE_CLASSES == ("bad", "ok", "good")
    assert [formats.LABEL_TO_CLASS[int(t)] for t in formats.DELPHI_CLASS_TOKENS] == ["good", "ok", "bad"]
    with pytest.raises(formats.TextFormatError, match="label"):
        formats.delphi_target(2)
    with pytest.raises(formats.TextFormatError, match="label"):
        formats.delphi_target("great")
    assert formats.judge_sft_example("question: lying", "good") == \
        ("[moral_single]: lying", "<class>1</class> <text>it's good</text>")


def test_parse_delphi_output_both_spellings():
    # T5's vocabulary lacks "<", so Delphi's greedy output decodes with <unk> (delphi.py's sep_tokens)
    decoded = "<pad> <unk> class>-1<unk> /class> <unk> text>it's wrong<unk> /text></s>"
    assert formats.parse_delphi_output(decoded) == (-1, "it's wrong")
    assert formats.parse_delphi_output(formats.delphi_target(0, "it's fine")) == (0, "it's fine")
    assert formats.parse_delphi_output("<class>1</class> <text>it's good") == (1, "it's good")
    assert formats.parse_delphi_output("no class here") == (None, "")


def test_nli_pair():
    assert formats.nli_pair("question: lying to a friend", " to save their life ") == \
        ("lying to a friend", "to save their life")
    with pytest.raises(formats.TextFormatError, match="answer"):
        formats.nli_pair(SITUATION, "")


def test_period_rules_of_the_nli_premise_and_the_fusion_situation():
    """The original added "." to the NLI premise but not to the fusion model's situation
    (docs/fidelity.md); each rule is an argument."""
    assert formats.nli_pair("question: lying to a friend", "x", period=True)[0] == "lying to a friend."
    assert formats.nli_pair("lying to a friend.", "x", period=True)[0] == "lying to a friend."
    assert formats.fusion_input("question: lying to a friend", "Why?", "a", period=False) == \
        "merge: SITUATION: lying to a friend QUESTION: Why? ANSWER: a"
    assert formats.fusion_input("lying to a friend", "Why?", "a") == \
        "merge: SITUATION: lying to a friend. QUESTION: Why? ANSWER: a"


def test_judge_input_of_an_empty_text_only_when_allowed():
    assert formats.judge_input("", allow_empty=True) == "[moral_single]: "  # the original's input
    assert formats.judge_input("question: ", allow_empty=True) == "[moral_single]: "
    with pytest.raises(formats.TextFormatError, match="'situation' is empty"):
        formats.judge_input("")


def test_wh_conditioned_input():
    assert formats.wh_question_input(SITUATION, "why") == "lying to a friend Q.: why"
    assert formats.wh_word("Why would you lie?") == "why"
    assert formats.wh_word("What's the reason?") == "what's"
    assert formats.wh_word("How, exactly?") == "how"
    assert formats.wh_question_sft_example("question: " + SITUATION, "Who is the friend?") == \
        ("lying to a friend Q.: who", "Who is the friend?")


def test_answer_sft_example():
    src, tgt = formats.answer_sft_example("You should help your family with funeral expenses.",
                                    "weakener", "What is your current financial status",
                                    "You are not financially stable to help out")
    assert src == ("answer: You should help your family with funeral expenses. TYPE: weakener "
                   "QUESTION: What is your current financial status")
    assert tgt == "You are not financially stable to help out"
    with pytest.raises(formats.TextFormatError, match="sc.tsv:3.*missing column.*Update"):
        formats.answer_sft_from_row({"Hypothesis": "h", "UpdateType": "weakener",
                               "question_davinci": "q"}, where="sc.tsv:3")


def test_fusion_sft_example():
    src, tgt = formats.fusion_sft_example(
        "SITUATION: getting support. QUESTION: How? ANSWER: I asked them",
        "getting support by asking them")
    assert src == "merge: SITUATION: getting support. QUESTION: How? ANSWER: I asked them"
    assert tgt == "getting support by asking them"
    with pytest.raises(formats.TextFormatError, match="fusion.csv:9.*input"):
        formats.fusion_sft_example("getting support", "x", where="fusion.csv:9")


def test_type_errors_name_the_field():
    with pytest.raises(formats.TextFormatError, match="'question' must be a string"):
        formats.answer_input(SITUATION, None, "weakener")


# ----------------------------------------------------------------------------- real data


def test_formats_on_released_files():
    """Every row of the silver and fusion files formats; our fusion_input rebuilds the file's input."""
    path = shared_data("delta-clarify/sc_dev_questions_gpt.tsv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) > 1000
    for i, row in enumerate(rows, start=2):
        src, tgt = formats.answer_sft_from_row(row, where=f"{path.name}:{i}")
        assert src.startswith("answer: ") and " TYPE: " in src and " QUESTION: " in src
        assert tgt

    path = shared_data("delta-clarify/fusion_dev.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) > 9000
    for i, row in enumerate(rows, start=2):
        src, tgt = formats.fusion_sft_from_row(row, where=f"{path.name}:{i}")
        # the file's inputs differ from ours only by runs of spaces (34 rows have "  ")
        assert src == "merge: " + formats.normalize_whitespace(row["input"])
        head, answer = row["input"].split(" ANSWER: ", 1)
        situation, question = head[len("SITUATION: "):].split(" QUESTION: ", 1)
        # what the pipeline builds from (situation, question, answer) is the training input
        assert formats.fusion_input(situation, question, answer) == src, f"{path.name}:{i}"
