"""benchmarks/scaling.py on 1 and 2 fake devices: it runs, the data-parallel program has its
gradient all-reduces and the independent-replica program none, and it reports a step time and a
communication share for each device count (the figures come from the full run,
`python benchmarks/scaling.py`, recorded in benchmarks/results/scaling.json)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.env import REPO_ROOT
from helpers.children import fake_device_env

pytestmark = pytest.mark.child

NAME = "scaling_ci_check"


@pytest.mark.slow  # four compiles of the tiny PPO update in two child processes
def test_scaling_benchmark_reports_step_time_and_communication_share(tmp_path):
    out = tmp_path / f"{NAME}.json"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks/scaling.py"), "--devices", "1", "2", "--batch", "4",
         "--repeats", "1", "--name", NAME, "--out", str(out)],
        env=fake_device_env(1), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    one, two = results["runs"]
    assert (one["devices"], two["devices"]) == (1, 2)
    assert one["rows_per_device"] == 4 and two["rows_per_device"] == 2
    assert one["collectives"] == {} and two["collectives_without"] == {}
    assert two["collectives"].get("all-reduce", 0) > 0
    for run in (one, two):
        assert run["step_s"]["best_s"] > 0 and run["no_collectives_step_s"]["best_s"] > 0
        assert 0.0 <= run["communication_share"] < 1.0
    assert results["step_time_vs_first"]["1"] == 1.0
