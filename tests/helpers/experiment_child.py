"""A child process that runs `sage-jax experiment` from a JSON config (paths relative to its working
folder) and kills itself with SIGKILL right after the `kill_after`-th file it writes under the
experiment's folder (each atomic rename counts). Its outcome is the folder; the parent reads that,
and the exit status (-9 when killed).

    python -m helpers.experiment_child CONFIG.json KILL_AFTER|none
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def main(config_path: str, kill_after: str) -> list[str]:
    """Run the experiment; the files it wrote under its folder, in order (uninterrupted: "none")."""
    from clarifyjax.config.loader import build_root
    from sage_jax.experiments import command
    from sage_jax.experiments.config import ExperimentConfig

    cfg = build_root(ExperimentConfig, json.loads(Path(config_path).read_text()), source=config_path)
    out = Path(cfg.out).absolute()
    limit = None if kill_after == "none" else int(kill_after)
    written: list[str] = []
    replace = os.replace

    def counting(src, dst, **kwargs):
        replace(src, dst, **kwargs)
        path = Path(dst).absolute()
        if path.is_relative_to(out):
            written.append(path.relative_to(out).as_posix())
            if limit is not None and len(written) >= limit:
                os.kill(os.getpid(), signal.SIGKILL)  # kill -9 after this file, before the next

    os.replace = counting
    try:
        command.run_experiment(cfg)
    finally:
        os.replace = replace
    return written


if __name__ == "__main__":
    main(*sys.argv[1:])
