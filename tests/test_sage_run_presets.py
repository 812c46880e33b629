"""`sage-jax run`'s example configs load, and its presets parse replies as the reference does, with
the reference's bugs fixed."""
from __future__ import annotations

import pytest

from conftest import REPO_ROOT
from sage_jax.run import config as run_config


@pytest.mark.parametrize("name", ["run_local.yaml", "run_endpoint.yaml", "run_recorded.yaml"])
def test_the_example_configs_load(name):
    # in configs/sage/: configs/*.yaml are the training configs that tests/test_config*.py load
    cfg = run_config.load_run_config(REPO_ROOT / "configs" / "sage" / name, ["limit=5"])
    assert cfg.models and cfg.limit == 5


def test_the_presets_parse_as_the_reference_with_its_bugs_fixed():
    from sage_jax.run import prompts as P

    # first line kept, an "Answer:" prefix stripped; "Answering..." (no colon) no longer crashes
    assert P.parse_answer("Answer: Be kind.\nmore") == ("Be kind.", None)
    assert P.parse_answer("Answering this needs care.") == ("Answering this needs care.", None)
    assert P.parse_answer("# Title")[1] == "answer starts with '#'"
    assert P.parse_answer("use `x`")[1] == "answer holds a backtick"
    assert P.parse_answer("  \n")[1] == "empty answer"
    # "Rule of Thumb:" only as a prefix, not inside the rule
    assert P.parse_rot("Rule of Thumb: It is good to help.\nx") == ("It is good to help.", None)
    assert P.parse_rot("Follow the Rule of Thumb: be fair.") == ("Follow the Rule of Thumb: be fair.", None)
    assert P.parse_rot("RoT:   ")[1] == "empty rule of thumb"
    # code: >= 0.6; paper: > 0.8
    code, paper = P.PRESETS["code"], P.PRESETS["paper"]
    assert P.passes(0.6, code.parascore_threshold, code.parascore_inclusive)
    assert not P.passes(0.8, paper.parascore_threshold, paper.parascore_inclusive)
    assert P.passes(0.8001, paper.parascore_threshold, paper.parascore_inclusive)
    # the paper's one-shot prompt is the code's with its first example only
    assert paper.paraphrase_template.count("\n1. ") == 1 and "\n2. " not in paper.paraphrase_template
    assert code.paraphrase_template.count("\n20. ") == 1
    assert P.answer_prompt("Q?", chat=True)[1]["content"].endswith("Question: Q?")
