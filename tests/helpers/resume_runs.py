"""Tiny SFT runs to resume (tests/clarifyjax/training/test_run_record.py and
test_checkpointing_damaged.py), and `forget_record` (training/test_command.py,
multiprocess/test_resume.py).

The model is a random 1+1-layer T5 Hugging Face folder (d_model 32; loading one compiles nothing),
trained for 2 steps of 8 rows of the shared dev.tsv, with a synchronous checkpoint after each step
and ``max_to_keep: 2`` (so the folder holds checkpoints 1 and 2).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from clarifyjax.config import load_config
from helpers.env import REPO_ROOT, shared_data

CONFIG = REPO_ROOT / "clarifyjax" / "presets" / "sft_question_tiny.yaml"


def t5_folder(root, seed: int = 0, d_model: int = 32) -> Path:
    from helpers.tiny_models import tiny_t5_folder

    return tiny_t5_folder(root, family="v1.0", seed=seed, d_model=d_model, num_layers=1,
                          num_decoder_layers=1)


def sft_overrides(run_dir, model, *overrides) -> list[str]:
    return [
        f"run.output_dir={run_dir}", "run.steps=2", "run.save_every=1", "run.eval_every=0",
        "run.log_every=1", "run.max_to_keep=2", "run.async_checkpointing=false",
        f"model.init={model}", "model.tiny=null", "model.tokenizer=null",
        "model.max_input_length=16", "model.max_target_length=8",
        f"data.train_path={shared_data('delta-clarify/dev.tsv')}",
        f"data.dev_path={shared_data('delta-clarify/test.tsv')}", "data.train_rows=64",
        "data.dev_rows=8", "data.batch_size=8", "data.length_buckets=[16]",
        "optimizer.warmup_steps=0", *overrides]  # (the config's 20 would outlast the run)


def sft_config(run_dir, model, *overrides):
    return load_config(CONFIG, sft_overrides(run_dir, model, *overrides))


def train(cfg):
    from clarifyjax.training import loops

    return loops.train_sft(cfg, tensorboard=False, progress=False, export=False)


def base_run(tmp_path_factory) -> tuple[Path, Path]:
    """(run folder with checkpoints 1 and 2, model folder): copy the run folder before use."""
    model = t5_folder(tmp_path_factory)
    run_dir = tmp_path_factory.mktemp("base") / "run"
    result = train(sft_config(run_dir, model))
    assert result["step"] == 2
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["1", "2"]
    return run_dir, model


def copy_run(base: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(base, run_dir)
    return run_dir


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` -> its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


def committed_steps(run_dir: Path) -> list[int]:
    """The steps whose checkpoint orbax finished writing (none before the first)."""
    folder = run_dir / "checkpoints"
    if not folder.exists():
        return []
    return sorted(int(p.name) for p in folder.iterdir()
                  if p.name.isdigit() and (p / "commit_success.txt").exists())


def forget_record(run_dir, *, keep_config_yaml: bool = False) -> None:
    """Make the run look like one saved before checkpoints recorded their config (and, unless
    `keep_config_yaml`, before config.yaml): the settings check (`run_record`,
    tests/clarifyjax/training/test_run_record.py) would refuse another model by its key first; without a record,
    the shape check is what stops the resume."""
    if not keep_config_yaml:
        (run_dir / "config.yaml").unlink()
    for metadata in (run_dir / "checkpoints").glob("*/extra/metadata"):
        extra = json.loads(metadata.read_text())
        extra.pop("config")
        metadata.write_text(json.dumps(extra))
