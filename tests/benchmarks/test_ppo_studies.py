"""benchmarks/ppo_seeds.py and ppo_ablation.py's reports on hand-made seeds: the raw gain's mean
and 95% t interval (scipy's), each measure's change, the collapse bar of issue 35 (the most
common question at most 5% and distinct questions within 10% of the SFT policy's on every seed),
and the ablation's table; no PPO is run."""
from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from helpers.env import REPO_ROOT


def load(name: str):
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seed_row(seed, gain, top_after, distinct_after):
    before = {"raw": 0.07, "flip_rate": 0.36, "distinct_share": 0.6, "top_share": 0.03,
              "top5_share": 0.1, "distinct_2": 0.15}
    after = {**before, "raw": 0.07 + gain, "top_share": top_after, "distinct_share": distinct_after}
    return {"seed": seed, "gain": gain, "gain_se": 0.01, "seconds": 60.0, "before": before,
            "after": after}


def test_summary_intervals_and_the_collapse_bar():
    from scipy import stats

    seeds = load("ppo_seeds")
    gains = [0.02, 0.018, 0.022]
    rows = [seed_row(i, g, 0.04, 0.58) for i, g in enumerate(gains)]
    s = seeds.summarize(rows)
    low, high = stats.t.interval(0.95, len(gains) - 1, loc=np.mean(gains), scale=stats.sem(gains))
    assert s["gain"]["mean"] == pytest.approx(0.02)
    assert s["gain"]["ci95"] == pytest.approx([low, high], rel=1e-5)
    assert s["distinct_share"]["change"]["mean"] == pytest.approx(-0.02)
    assert s["no_collapse"] and s["meets_bar"]
    # one seed over 5% on its most common question, or distinct questions down by more than 10%
    assert not seeds.summarize(rows[:2] + [seed_row(2, 0.03, 0.06, 0.58)])["no_collapse"]
    assert not seeds.summarize(rows[:2] + [seed_row(2, 0.03, 0.04, 0.53)])["no_collapse"]
    # a gain whose interval reaches 0 misses the bar though nothing collapsed
    assert not seeds.summarize([seed_row(0, 0.02, 0.04, 0.6), seed_row(1, -0.01, 0.04, 0.6)]
                               )["meets_bar"]


def test_ablation_table_gives_each_arm_with_intervals():
    seeds, ablation = load("ppo_seeds"), load("ppo_ablation")
    rows = [seed_row(i, g, 0.2, 0.3) for i, g in enumerate([0.02, 0.01, 0.03])]
    md = ablation.table({"demo": {"what": "the demo", "summary": seeds.summarize(rows)}})
    line = md.splitlines()[2]
    assert line.startswith("| demo: the demo | 3 | +0.0200 [")
    assert "| 0.30 [0.30, 0.30] (0.60) | 0.200 [0.200, 0.200] |" in line


def test_algorithm_study_step_time_and_table(tmp_path):
    """benchmarks/rl_algorithms.py: the median step time leaves out the first (compiling) step and
    sums sampling, reward and update; the table gives each arm's policy, algorithm and figures."""
    study = load("rl_algorithms")
    rows = [{"step": s, "time/sample": t, "time/reward": 0.1, "time/update": 0.2}
            for s, t in ((1, 30.0), (2, 0.2), (3, 0.4), (4, 0.3))]
    rows.append({"step": 4, "eval/reward_raw": 0.1})  # an evaluation row holds no timings
    (tmp_path / "metrics.jsonl").write_text("".join(f"{json.dumps(r)}\n" for r in rows))
    assert study.step_seconds(tmp_path) == pytest.approx(0.6)
    assert set(study.ARMS) == {f"{p}_{a}" for p in ("t5", "llama") for a in ("ppo", "rloo", "grpo")}
    seeds = load("ppo_seeds")
    summary = seeds.summarize([seed_row(i, g, 0.04, 0.58) for i, g in enumerate([0.02, 0.01, 0.03])])
    md = study.table({"t5_grpo": {"policy": "t5", "algorithm": "grpo", "summary": summary,
                                  "step_seconds": study.stat([0.5, 0.7])}})
    assert md.splitlines()[2].startswith("| t5 | grpo | 3 | +0.0200 [")
    assert md.splitlines()[2].endswith("| 0.60 [-0.67, 1.87] |")
