"""Issue 5's bad input, through the real entry points (`clarifyjax train CONFIG key=value ...`, as
`clarifyjax.cli.main` and as a process, and `loops.train_ppo` / `loops.train_sft`): each must stop
with one clear error that names what is wrong and where.

* a config with an unknown key: the error names the key (its full dotted path) and the file;
* a data file with a missing column: the error names the file and the column;
* resuming from a checkpoint of another model shape: the error names the parameter, both shapes
  and the checkpoint.

Models are tiny random Hugging Face folders (d_model 32, then 48; loading one compiles nothing,
unlike a random `tiny:` model's jitted initialization); each run is one step.
"""
import ast
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from clarifyjax import cli

from clarifyjax.training import loops
from clarifyjax.config import ConfigError, load_config
from clarifyjax.files.tables import DataError
from clarifyjax.models.safetensors_io import CheckpointError
from helpers.env import REPO_ROOT, shared_data
from helpers.resume_runs import forget_record

CONFIGS = REPO_ROOT / "clarifyjax" / "presets"
SHAPE_ERROR = re.compile(r"checkpoint (?P<where>\S+): '(?P<name>[^']+)' has shape "
                         r"(?P<have>\([\d, ]*\)) in the checkpoint but the model expects "
                         r"(?P<want>\([\d, ]*\))")


def _cli(argv, capsys) -> tuple[int, str]:
    """Exit status and stderr of `clarifyjax ARGV` run in this process."""
    capsys.readouterr()
    rc = cli.main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def _one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("clarifyjax train: error: ")]
    assert len(lines) == 1, err
    print(lines[0])  # shown with pytest -rP
    return lines[0]


# --------------------------------------------------------------------------- unknown keys


@pytest.mark.e2e
def test_unknown_key_in_a_config_file_names_the_key_and_the_file(tmp_path, capsys):
    bad = tmp_path / "my_run.yaml"
    bad.write_text(f"base: {CONFIGS / 'ppo_tiny.yaml'}\n"
                   f"run:\n  output_dir: {tmp_path / 'run'}\n"
                   "ppo:\n  batch_size: 8\n  clip_range: 0.1\n")  # PPOHyperparams has `clip`
    rc, err = _cli(["train", bad, "--no-progress"], capsys)
    line = _one_line_error(err)
    assert rc == 2
    assert f"{bad}: unknown key 'ppo.clip_range'" in line, line
    assert "valid keys under 'ppo'" in line and "clip" in line  # says what would have been valid
    assert not (tmp_path / "run").exists()  # refused before anything was written

    # a nested key (and the SFT kind): the full dotted path is named
    sft = tmp_path / "sft.yaml"
    sft.write_text(f"base: {CONFIGS / 'sft_question_tiny.yaml'}\n"
                   "model:\n  tiny:\n    d_modle: 64\n")
    with pytest.raises(ConfigError, match=re.escape(f"{sft}: unknown key 'model.tiny.d_modle'")):
        load_config(sft)


@pytest.mark.e2e
def test_unknown_key_on_the_command_line_names_the_override_and_the_file(tmp_path, capsys):
    config = CONFIGS / "sft_question_tiny.yaml"
    rc, err = _cli(["train", config, f"run.output_dir={tmp_path / 'run'}",
                    "optimizer.learning_rate=1e-3"], capsys)
    line = _one_line_error(err)
    assert rc == 2
    assert "unknown key 'optimizer.learning_rate'" in line and str(config) in line, line
    assert "override 'optimizer.learning_rate=1e-3'" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
@pytest.mark.child
def test_the_clarifyjax_command_exits_2_with_one_line(tmp_path):
    """The installed entry point as a process: exit status 2, the error on one stderr line, no
    traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: sft\nrun:\n  stepz: 3\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "clarifyjax", "train", str(bad)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = _one_line_error(proc.stderr)
    assert f"{bad}: unknown key 'run.stepz'" in line, line


# --------------------------------------------------------------------------- data files


@pytest.mark.e2e
def test_sft_data_file_with_a_missing_column_names_the_file_and_column(tmp_path, capsys):
    bad = tmp_path / "questions.tsv"  # a question-generator file without its `question` column
    bad.write_text("situation\tanswer\nlying to a friend\tit's wrong\n")
    rc, err = _cli(["train", CONFIGS / "sft_question_tiny.yaml",
                    f"run.output_dir={tmp_path / 'run'}", f"data.train_path={bad}",
                    "data.dev_path=null",
                    f"model.tokenizer={tmp_path / 'no_tokenizer_needed'}", "--no-progress"], capsys)
    line = _one_line_error(err)
    assert rc == 2
    assert f"{bad}: missing column(s) ['question']" in line, line
    assert "the file has columns ['situation', 'answer']" in line, line


def _t5_folder(tmp_path_factory, d_model: int):
    """A random 1+1-layer T5 folder (v1.0, vocabulary 608) with its spiece.model."""
    from helpers.tiny_models import tiny_t5_folder

    return tiny_t5_folder(tmp_path_factory, family="v1.0", seed=0, d_model=d_model,
                          num_layers=1, num_decoder_layers=1)


def _ppo_overrides(out_dir, policy, steps=1):
    """The policy folder on the shared δ-CLARIFY situations, one PPO step, no evaluation."""
    return [f"run.output_dir={out_dir}", f"run.steps={steps}", "run.save_every=1",
            "run.eval_every=0", "run.sample_every=0", "run.log_every=1",
            "run.async_checkpointing=false", f"policy.init={policy}", "policy.tokenizer=null",
            "policy.max_input_length=32",
            f"data.train_path={shared_data('delta-clarify/dev.tsv')}",
            f"data.dev_path={shared_data('delta-clarify/test.tsv')}", "data.dev_situations=8",
            "data.length_buckets=[32]", "ppo.batch_size=4", "ppo.minibatches=1", "ppo.epochs=1",
            "ppo.sampling.max_new_tokens=4", "normalizer.fit=false",
            "normalizer.fit_batches=8"]  # ppo_tiny's 2 would be refused: nothing is fitted


def _zero_reward(situations, questions):
    return np.zeros(len(questions))


def test_ppo_dev_file_with_a_missing_column_names_the_file_and_column(tmp_path_factory, tmp_path):
    bad = tmp_path / "dev.jsonl"
    bad.write_text('{"question": "why?", "text": "lying"}\n')
    cfg = load_config(CONFIGS / "ppo_tiny.yaml", _ppo_overrides(
        tmp_path / "run", _t5_folder(tmp_path_factory, 32)) + [f"data.dev_path={bad}"])
    with pytest.raises(DataError, match=re.escape(f"{bad}: missing column(s) ['situation']")):
        loops.train_ppo(cfg, reward_fn=_zero_reward, tensorboard=False, progress=False,
                        export=False)


# --------------------------------------------------------------------------- resuming


def _parameter_paths(folder) -> set[str]:
    """'encoder/layers/0/attention/q', ... : the T5's parameters as orbax names their leaves."""
    import jax
    from flax import nnx

    from clarifyjax.models.hf import load_t5

    _, model = load_t5(folder)
    leaves = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model)))[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path) for path, _ in leaves}


def _check_shape_error(message: str, run_dir, model_folder, *, narrow: int, wide: int
                       ) -> re.Match:
    """The message names the checkpoint, a leaf of the train state that is a model parameter
    (or its optimizer moment), and both shapes (one with `narrow`, the other with `wide`)."""
    match = SHAPE_ERROR.search(message)
    assert match, message
    assert str(run_dir / "checkpoints") in match["where"], message
    assert any(match["name"].endswith("/" + p) for p in _parameter_paths(model_folder)), message
    have, want = ast.literal_eval(match["have"]), ast.literal_eval(match["want"])
    assert narrow in have and wide in want and len(have) == len(want), message
    assert "another model shape" in message
    return match


@pytest.mark.e2e
def test_resuming_ppo_with_another_model_shape_names_the_parameter_and_shapes(
        tmp_path_factory, tmp_path, capsys):
    """One PPO step of a d_model 32 policy (checkpointed), then `clarifyjax train` on the same
    folder with d_model 48: refused, naming a parameter of the train state and both shapes."""
    narrow = _t5_folder(tmp_path_factory, 32)
    run_dir = tmp_path / "run"
    cfg = load_config(CONFIGS / "ppo_tiny.yaml", _ppo_overrides(run_dir, narrow))
    result = loops.train_ppo(cfg, reward_fn=_zero_reward, tensorboard=False, progress=False,
                             export=False)
    assert result["step"] == 1 and (run_dir / "checkpoints" / "1").is_dir()
    forget_record(run_dir)

    # The CLI builds the configured reward pipeline (here tiny random T5s) before restoring.
    rewards = [f"rewards.{m}.init={narrow}" for m in ("answerer", "fusion", "judge.model")]
    rewards += [f"rewards.{m}.tokenizer=null" for m in ("answerer", "fusion", "judge.model")]
    rc, err = _cli(["train", CONFIGS / "ppo_tiny.yaml",
                    *_ppo_overrides(run_dir, _t5_folder(tmp_path_factory, 48), steps=2), *rewards,
                    "--no-progress", "--no-tensorboard"], capsys)
    line = _one_line_error(err)
    assert rc == 2
    match = _check_shape_error(line, run_dir, narrow, narrow=32, wide=48)
    assert match["name"].startswith("ppo/"), line
    assert not (run_dir / "checkpoints" / "2").exists()


def test_resuming_sft_with_another_model_shape_names_the_parameter_and_shapes(
        tmp_path_factory, tmp_path):
    run_dir = tmp_path / "run"

    def config(d_model, steps):
        return load_config(CONFIGS / "sft_question_tiny.yaml", [
            f"run.output_dir={run_dir}", f"run.steps={steps}", "run.save_every=1",
            "run.eval_every=0", "run.log_every=1", "run.async_checkpointing=false",
            f"model.init={_t5_folder(tmp_path_factory, d_model)}", "model.tiny=null",
            "model.tokenizer=null", "model.max_input_length=16", "model.max_target_length=8",
            f"data.train_path={shared_data('delta-clarify/dev.tsv')}",
            f"data.dev_path={shared_data('delta-clarify/test.tsv')}",
            "data.train_rows=64", "data.dev_rows=8", "data.batch_size=8",
            "data.length_buckets=[16]", "optimizer.warmup_steps=0"])

    result = loops.train_sft(config(32, 1), tensorboard=False, progress=False, export=False)
    assert result["step"] == 1
    forget_record(run_dir)
    with pytest.raises(CheckpointError) as info:
        loops.train_sft(config(48, 2), tensorboard=False, progress=False, export=False)
    print(info.value)
    _check_shape_error(str(info.value), run_dir, _t5_folder(tmp_path_factory, 32), narrow=32,
                       wide=48)
