"""The tiny discriminator run (clarifyjax/presets/sft_discriminator_tiny.yaml) of the discriminator training
tests, in the test process and in their 8-device child."""
from __future__ import annotations

from clarifyjax.config import load_config
from helpers.env import REPO_ROOT

CONFIG = str(REPO_ROOT / "clarifyjax" / "presets" / "sft_discriminator_tiny.yaml")
STEPS = 30


def tiny_config(folder, rows, run_dir, *extra):
    return load_config(CONFIG, [
        f"model.init={folder}", f"data.train_path={rows['train']}",
        f"data.dev_path={rows['dev']}", f"run.output_dir={run_dir}", f"run.steps={STEPS}",
        f"run.eval_every={STEPS}", f"run.save_every={STEPS}", "run.log_every=1",
        "run.async_checkpointing=false", "data.train_rows=64", "data.dev_rows=null",
        "data.batch_size=16", "data.eval_batch_size=32", "data.shuffle=true",
        "optimizer.lr=3e-3", "optimizer.warmup_steps=0", "optimizer.schedule=constant",
        *extra])
