"""Dry run of clarifyjax/presets/ppo_t5_large.yaml (and, issue 38, rloo_t5_large.yaml and
grpo_qwen3_0_6b.yaml, a decoder-only policy: no value model) on 8 fake CPU devices
(issue 6): every parameter listed with a sharding, bytes per device reported, one PPO update
compiled (not run), and T5-large never materialized. And the dry run compiles the run's own
program (issue 10): for the tiny SFT and PPO configs, its lowered StableHLO is the text of the
first real training step's.

The step is compiled with ``dryrun.num_layers=2`` (2 + 2 layers at T5-large's width, 64 rows),
because the full 24 + 24-layer PPO update (policy + value, 4 epochs) takes minutes to compile on a
CPU. The listing and the bytes are those of the full T5-large.
"""
from __future__ import annotations

import pytest

from helpers.env import REPO_ROOT, shared_data
from helpers.children import run_with_fake_devices

CONFIGS = f"CONFIGS = {str(REPO_ROOT / 'clarifyjax' / 'presets')!r}\n"  # children run in the test's folder

MiB = 2 ** 20

CODE = r'''
import json
from clarifyjax.training import dryrun
from clarifyjax.files.child_result import write_result
lines = []
# the paper's models are not here: sized by name (its data files are read)
report = dryrun.main(f"{CONFIGS}/ppo_t5_large.yaml", ["dryrun.num_layers=2", "dryrun.check_models=false"],
                     say=lines.append)
report["printed"] = lines
# this process's own peak (getrusage's ru_maxrss would carry over the parent's, pytest's, peak)
report["peak_rss_bytes"] = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
                                if line.startswith("VmHWM:"))
import jax
report["live_array_bytes"] = sum(x.nbytes for x in jax.live_arrays())

# `clarifyjax train CONFIG --dry-run` in the same process (its own 8 fake devices), after the
# measures above
import contextlib, io
from clarifyjax.cli import main
printed = io.StringIO()  # what main says, away from native libraries' output
with contextlib.redirect_stdout(printed):
    status = main(["train", f"{CONFIGS}/ppo_t5_large.yaml", "dryrun.compile=none",
                   "dryrun.check_models=false", "--dry-run"])
report["cli"] = {"status": status, "printed": printed.getvalue()}
# the RLOO preset (no value model): its plan and its update, compiled small (1 + 1 layers, 8 rows)
rloo_lines = []
rloo = dryrun.main(f"{CONFIGS}/rloo_t5_large.yaml", ["dryrun.num_layers=1", "dryrun.rows=8",
                                                    "dryrun.check_models=false"], say=rloo_lines.append)
report["rloo"] = {"plan": rloo["plan"], "compiled": rloo["compiled"], "printed": rloo_lines,
                  "roles": sorted({p["name"].split("[")[0] for p in rloo["parameters"]})}
# the GRPO preset: a decoder-only policy (Qwen3-0.6B, sized by name), no value model either
grpo_lines = []
grpo = dryrun.main(f"{CONFIGS}/grpo_qwen3_0_6b.yaml", ["dryrun.num_layers=1", "dryrun.rows=8",
                                                       "dryrun.check_models=false"], say=grpo_lines.append)
report["grpo"] = {"plan": grpo["plan"], "compiled": grpo["compiled"], "printed": grpo_lines,
                  "roles": sorted({p["name"].split("[")[0] for p in grpo["parameters"]})}
write_result(json.loads(json.dumps(report, default=str)))
'''


@pytest.fixture(scope="module")
def report():
    return run_with_fake_devices(CONFIGS + CODE, 8, timeout=600)


@pytest.mark.slow
def test_every_parameter_listed_with_a_sharding(report):
    assert report["devices"] == 8
    assert report["mesh"] == {"data": 2, "fsdp": 4, "model": 1} and report["rules"] == "fsdp"
    params = report["parameters"]
    names = [p["name"] for p in params]
    assert len(names) == len(set(names))
    assert all(p["spec"].startswith("P(") for p in params)  # str(PartitionSpec)
    # complete: the counts match memory_plan's count (its flat state, not the dry run's table)
    models = {m["role"]: m for m in report["plan"]["models"]}
    for role in ("policy", "value"):
        mine = [p for p in params if p["name"].startswith(role + "[")]
        assert sum(p["bytes"] for p in mine) == models[role]["bytes_total"]
        assert sum(p["bytes_per_device"] for p in mine) == models[role]["bytes_per_device"]
    # T5-large: 737,668,096 parameters (Hugging Face's count for t5-large), + the value head
    assert models["policy"]["n_params"] == 737_668_096
    # every parameter is printed, with its spec
    printed = "\n".join(report["printed"])
    for p in params:
        assert p["name"] in printed and p["spec"] in printed


@pytest.mark.slow
def test_no_large_parameter_fully_replicated_under_fsdp(report):
    offenders = [(p["name"], p["bytes"]) for p in report["parameters"]
                 if p["bytes"] > MiB and p["bytes_per_device"] == p["bytes"]]
    assert not offenders, offenders
    # and fsdp=4 really divides them: the big ones hold a quarter per device
    big = [p for p in report["parameters"] if p["bytes"] > MiB]
    assert big and all(p["bytes_per_device"] * 4 <= p["bytes"] for p in big)


@pytest.mark.slow
def test_bytes_per_device_and_compiled_step(report):
    plan = report["plan"]
    assert plan["total_bytes"] == sum(plan["components"].values()) > 0
    assert any("total per device" in line for line in report["printed"])
    compiled = report["compiled"]
    assert compiled["step"] == "ppo" and compiled["num_layers"] == 2 and compiled["rows"] == 64
    assert compiled["memory"]["argument_size_in_bytes"] > 0
    # T5-large was never materialized: policy + value would be 5.5 GiB in float32, one of them
    # alone 2.75 GiB. The process's peak stays below half of one model (what compiling the
    # 2-layer step needs is far less), and nothing large is kept.
    whole = sum(p["bytes"] for p in report["parameters"])
    assert whole > 5 * 2 ** 30
    assert report["peak_rss_bytes"] < whole / 4, report["peak_rss_bytes"]
    assert report["live_array_bytes"] < whole / 100, report["live_array_bytes"]


@pytest.mark.slow
def test_dry_run_through_the_cli(report):
    """`clarifyjax train CONFIG --dry-run` on 8 fake devices lists shardings and bytes per device
    (run by the fixture's process, after its own dry run)."""
    result = report["cli"]
    assert result["status"] == 0, result
    out = result["printed"]
    assert "bytes" in out.lower() or "GiB" in out
    assert "fsdp" in out


@pytest.mark.slow
def test_rloo_preset_dry_runs_without_a_value_model(report):
    """clarifyjax/presets/rloo_t5_large.yaml on the same 8 fake devices: bytes per device printed, its update
    compiled, and no value model anywhere: not listed, not planned, and the trained bytes (Adam
    moments, gradients) those of the policy alone, about half of the PPO preset's."""
    rloo, ppo_plan = report["rloo"], report["plan"]
    assert rloo["roles"] == ["policy"]
    assert any("total per device" in line for line in rloo["printed"])
    plan = rloo["plan"]
    assert [m["role"] for m in plan["models"] if m["trainable"]] == ["policy"]
    assert not any("value" in key for key in plan["components"]), plan["components"]
    moments = plan["components"]["Adam moments (policy)"]
    both = ppo_plan["components"]["Adam moments (policy + value)"]
    assert 0.99 * both < 2 * moments < both  # the value model: the policy's T5 and a scalar head
    assert plan["total_bytes"] < ppo_plan["total_bytes"]
    assert rloo["compiled"]["step"] == "ppo" and rloo["compiled"]["memory"]["argument_size_in_bytes"] > 0


@pytest.mark.slow
def test_grpo_decoder_preset_dry_runs_without_a_value_model(report):
    """clarifyjax/presets/grpo_qwen3_0_6b.yaml (a Qwen3-0.6B policy, GRPO) on the same 8 fake devices: bytes
    per device printed, its update compiled (1 layer, 8 rows), and no value model counted."""
    grpo = report["grpo"]
    assert grpo["roles"] == ["policy"]
    assert any("total per device" in line for line in grpo["printed"])
    plan = grpo["plan"]
    models = {m["role"]: m for m in plan["models"]}
    assert [r for r, m in models.items() if m["trainable"]] == ["policy"]
    assert "value" not in models and not any("value" in key for key in plan["components"])
    assert models["policy"]["n_params"] == 596_049_920  # Qwen3-0.6B's published size
    assert plan["components"]["Adam moments (policy)"] > 0
    assert grpo["compiled"]["step"] == "ppo" and grpo["compiled"]["memory"]["argument_size_in_bytes"] > 0


SAME_PROGRAM = r'''
import hashlib, json, sys
import numpy as np
from clarifyjax.training import dryrun
from clarifyjax.training import loops
from clarifyjax.config import load_config

spm, out, train_tsv, dev_tsv = sys.argv[1:5]
data = [f"data.train_path={train_tsv}", f"data.dev_path={dev_tsv}", "data.length_buckets=[512]"]
run = ["run.steps=1", "run.eval_every=0", "run.log_every=1", "run.sample_every=0"]
sha = lambda text: hashlib.sha256(text.encode()).hexdigest()
hashes = {}

# SFT: 2 micro-batches of 8 rows, label smoothing and dropout on (the old dry run had neither)
model = ["model.tiny.vocab_size=608", "model.tiny.d_model=32", "model.tiny.d_ff=64",
         "model.tiny.num_layers=1", "model.max_input_length=32", "model.max_target_length=16",
         "model.dropout_rate=0.1"]
sft = model + data + ["data.batch_size=8", "data.train_rows=64", "data.dev_rows=8",
                      "optimizer.grad_accum=2", "optimizer.label_smoothing=0.1",
                      "optimizer.warmup_steps=0"] + run
dry = dryrun.main(f"{CONFIGS}/sft_question_tiny.yaml", sft + ["dryrun.check_models=false",
                  f"run.output_dir={out}/sft"], say=lambda _: None)
real = loops.train_sft(load_config(f"{CONFIGS}/sft_question_tiny.yaml", sft + [
    f"model.tokenizer={spm}", f"run.output_dir={out}/sft"]),
    tensorboard=False, progress=False, export=False)
hashes["sft"] = (dry["compiled"]["lowered_sha256"], sha(real["program"].lowered_text()))

# PPO: a random tiny policy, 8 rows in 2 minibatches, an adaptive KL controller
policy = ["policy.init=null", "policy.tiny.vocab_size=608", "policy.tiny.d_model=32",
          "policy.tiny.d_ff=64", "policy.tiny.num_layers=1", "policy.max_input_length=32"]
ppo = policy + data + ["ppo.batch_size=8", "ppo.minibatches=2", "ppo.sampling.max_new_tokens=10",
                       "ppo.adaptive_kl=true", "data.dev_situations=8", "normalizer.fit=false",
                       "normalizer.fit_batches=8"] + run
dry = dryrun.main(f"{CONFIGS}/ppo_tiny.yaml", ppo + ["dryrun.check_models=false", f"run.output_dir={out}/ppo"],
                  say=lambda _: None)
real = loops.train_ppo(load_config(f"{CONFIGS}/ppo_tiny.yaml", ppo + [
    f"policy.tokenizer={spm}", f"run.output_dir={out}/ppo"]),
    reward_fn=lambda s, q: np.zeros(len(q)), tensorboard=False, progress=False, export=False)
hashes["ppo"] = (dry["compiled"]["lowered_sha256"], sha(real["program"].lowered_text()))
from clarifyjax.files.child_result import write_result
write_result(hashes)
'''


@pytest.mark.slow
def test_dry_run_lowers_the_program_of_the_first_real_step(tmp_path_factory, tmp_path):
    """On 2 fake devices (mesh data=2) with batches padded to the full lengths (one length
    bucket), the dry run of clarifyjax/presets/sft_question_tiny.yaml and clarifyjax/presets/ppo_tiny.yaml lowers the
    same StableHLO text as the first step `loops.train_sft` / `loops.train_ppo` runs: the same
    state, shardings, batch layout, loss options (label smoothing, dropout, KL controller) and
    jitted function. (Tiny 1 + 1-layer models: the comparison does not depend on the depth.)"""
    from helpers.tiny_models import tiny_spm_folder

    spm = tiny_spm_folder(tmp_path_factory, vocab_size=600)
    code = "import sys; sys.argv[1:] = " + repr([
        str(spm), str(tmp_path), str(shared_data("delta-clarify/train.tsv")),
        str(shared_data("delta-clarify/dev.tsv"))]) + "\n" + CONFIGS + SAME_PROGRAM
    hashes = run_with_fake_devices(code, 2, timeout=900)
    for kind, (dry, real) in hashes.items():
        assert dry == real, f"{kind}: the dry run lowered another program than the run's"
