"""`clarifyjax evaluate`'s report on hand-made judgments (two systems, five situations): the
standard errors, the paired gain and the question statistics against numpy written here."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from clarifyjax.config.evaluate import EvalConfig, SystemConfig, Table4Config
from clarifyjax.evaluation.evaluate import SystemOutput
from clarifyjax.evaluation.report import SYSTEMS_COLUMNS, markdown, system_rows, write_report

P = {"bad": [0.8, 0.15, 0.05], "ok": [0.1, 0.7, 0.2], "good": [0.05, 0.15, 0.8],
     "mixed": [0.3, 0.3, 0.4], "lean": [0.5, 0.2, 0.3]}
# Per situation: (p_base, p_weak, p_strong, valid, answered)
JUDGED = {
    "t5": [("ok", "bad", "good", True, [True, True]), ("ok", "ok", "mixed", True, [True, True]),
           ("good", "good", "good", False, [False, True]), ("bad", "lean", "mixed", True,
                                                            [True, False]),
           ("ok", "ok", "ok", False, [False, False])],
    "ppo": [("ok", "bad", "good", True, [True, True]), ("ok", "bad", "mixed", True, [True, True]),
            ("good", "lean", "good", True, [True, True]), ("bad", "lean", "good", True,
                                                           [True, True]),
            ("ok", "mixed", "good", True, [True, True])]}
QUESTIONS = {"t5": ["Why did you?", "Who is she?", "What is it?", "When was that?",
                    "Where did you go?"],
             "ppo": ["What are you?", "What are you?", "What are you?", "Why did you?",
                     "What are you for?"]}
# The texts questions.jsonl copies (the numbers here do not read them)
TEXTS = dict.fromkeys(("weak_answer", "strong_answer", "weak_situation", "strong_situation"), "")


def _outputs():
    outputs = []
    for name in ("t5", "ppo"):
        judgments = [{"p_base": P[b], "p_weak": P[w], "p_strong": P[s], "valid": v,
                      "answered": a, "jsd": None, **TEXTS} for b, w, s, v, a in JUDGED[name]]
        outputs.append(SystemOutput(SystemConfig(name=name, kind=name, model="m"),
                                    QUESTIONS[name], judgments))
    return outputs


def _jsd2(p, q):
    m = (p + q) / 2
    kl = lambda a: (a * np.log2(a / m)).sum(-1)  # noqa: E731 (no zero entry in P)
    return (kl(p) + kl(q)) / 2


def _sem(x):
    x = np.asarray(x, np.float64)
    return np.std(x, ddof=1) / math.sqrt(len(x))


def _expected(name: str) -> dict:
    rows = JUDGED[name]
    base, weak, strong = (np.array([P[r[k]] for r in rows]) for k in range(3))
    valid = np.array([r[3] for r in rows])
    answered = np.array([r[4] for r in rows]) & valid[:, None]
    div = _jsd2(weak, strong)
    raw = np.where(valid, div, 0.0)
    base_flips = (np.stack([weak.argmax(1), strong.argmax(1)], 1)
                  != base.argmax(1)[:, None])[answered]
    pair_flips = (weak.argmax(1) != strong.argmax(1))[valid]
    questions = QUESTIONS[name]
    top = max(questions.count(q) for q in questions) / len(questions)
    bigrams = [tuple(w[i:i + 2]) for w in (q.split() for q in questions) for i in range(len(w) - 1)]
    return {"avg_jsd": div[valid].mean(), "avg_jsd_se": _sem(div[valid]), "raw": raw,
            "reward_raw": raw.mean(), "reward_raw_se": _sem(raw),
            "flips_base": 100 * base_flips.mean(), "flips_base_se": 100 * _sem(base_flips),
            "flips_pair": 100 * pair_flips.mean(), "flips_pair_se": 100 * _sem(pair_flips),
            "distinct_share": 100 * len(set(questions)) / len(questions),
            "top_question_share": 100 * top,
            "top_question_share_se": 100 * math.sqrt(top * (1 - top) / len(questions)),
            "top5_share": 100.0, "top5_share_se": 0.0,
            "distinct_2": len(set(bigrams)) / len(bigrams)}


@pytest.mark.parametrize("flip", ["base", "pair"])
def test_table4_standard_errors_and_paired_gain_match_numpy(flip):
    rows = {r["system"]: r for r in system_rows(_outputs(), flip)}
    t5, ppo = _expected("t5"), _expected("ppo")
    for name, want in (("t5", t5), ("ppo", ppo)):
        row = rows[name]
        for key in ("avg_jsd", "avg_jsd_se", "reward_raw", "reward_raw_se", "flips_base",
                    "flips_base_se", "flips_pair", "flips_pair_se", "distinct_share",
                    "top_question_share", "top_question_share_se", "top5_share",
                    "top5_share_se", "distinct_2"):
            assert row[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (name, key)
        assert row["flips"] == row[f"flips_{flip}"] and row["flips_se"] == row[f"flips_{flip}_se"]
        assert row["gain_over"] == "t5"  # the first system listed
    diff = ppo["raw"] - t5["raw"]
    assert rows["ppo"]["raw_gain"] == pytest.approx(diff.mean(), rel=1e-5)
    assert rows["ppo"]["raw_gain_se"] == pytest.approx(_sem(diff), rel=1e-5)
    assert rows["t5"]["raw_gain"] == 0.0 and rows["t5"]["raw_gain_se"] == 0.0
    assert rows["ppo"]["top_question"] == "What are you?"
    assert rows["ppo"]["distinct_questions"] == 3 and rows["t5"]["distinct_questions"] == 5
    # the numbers differ between the systems, so the comparison above is not between equals
    assert ppo["reward_raw"] > t5["reward_raw"] and ppo["top_question_share"] == 60.0


def test_markdown_shows_each_number_with_its_standard_error():
    rows = system_rows(_outputs(), "base")
    text = markdown(rows, [], "base", 5)
    t5, ppo = _expected("t5"), _expected("ppo")
    diff = ppo["raw"] - t5["raw"]
    assert f"{diff.mean():+.4f} +- {_sem(diff):.4f}" in text
    assert f"{ppo['avg_jsd']:.4f} +- {ppo['avg_jsd_se']:.4f}" in text
    assert f"{ppo['reward_raw']:.4f} +- {ppo['reward_raw_se']:.4f}" in text
    assert f"{ppo['flips_base']:.1f} +- {ppo['flips_base_se']:.1f}" in text
    assert f"{ppo['top_question_share']:.1f} +- {ppo['top_question_share_se']:.1f}" in text
    assert f"| {ppo['distinct_2']:.3f} |" in text and "gain over `t5`" in text


def test_csv_and_json_carry_the_new_fields_beside_the_old(tmp_path):
    cfg = EvalConfig(out=str(tmp_path / "out"), table4=Table4Config(flip="pair"),
                     systems=tuple(o.system for o in _outputs()))
    summary = write_report(cfg, {"outputs": _outputs(), "updates": []})
    with open(tmp_path / "out" / "systems.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == list(SYSTEMS_COLUMNS)
    old = ("system", "kind", "situations", "avg_jsd", "flips", "flips_base", "flips_pair",
           "unanswerable_pct", "bertscore_f1", "data_fraction")
    new = ("avg_jsd_se", "reward_raw", "reward_raw_se", "gain_over", "raw_gain", "raw_gain_se",
           "flips_se", "flips_base_se", "flips_pair_se", "distinct_questions", "distinct_share",
           "top_question_share", "top_question_share_se", "top5_share", "top5_share_se",
           "distinct_2")
    assert set(old + new) <= set(SYSTEMS_COLUMNS)
    ppo = _expected("ppo")
    assert float(table[1]["flips_se"]) == pytest.approx(ppo["flips_pair_se"], rel=1e-5)
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["systems"][1]["raw_gain_se"] == pytest.approx(
        _sem(ppo["raw"] - _expected("t5")["raw"]), rel=1e-5)
    assert saved["gain_over"] == summary["gain_over"] == "t5"
