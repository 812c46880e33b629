"""A child process that runs `sage-jax run`'s generating stages with the fake generator, and kills
itself with SIGKILL after `kill_after` generator calls (counted over every generator of the run).
Its outcome is the run's folder; the parent reads that, and the exit status (-9 when killed).

    python -m helpers.pipeline_child CONFIG.json KILL_AFTER|none
"""
from __future__ import annotations

import json
import os
import signal
import sys

from helpers.fake_llm import FakeGenerator, fake_screen


def main(config_path: str, kill_after: str) -> None:
    from clarifyjax.config.loader import build_root
    from sage_jax.run import pipeline

    from sage_jax.run.config import SageRunConfig
    cfg = build_root(SageRunConfig, json.loads(open(config_path).read()), source=config_path)
    limit = None if kill_after == "none" else int(kill_after)
    calls = [0]

    class Counting(FakeGenerator):
        def complete(self, *args, **kwargs):
            calls[0] += 1
            if limit is not None and calls[0] > limit:
                os.kill(os.getpid(), signal.SIGKILL)  # kill -9 before this batch is saved
            return super().complete(*args, **kwargs)

    generators = pipeline.Generators(lambda c, batch_size, prompt_of: Counting(name=c.model))
    pipeline.Run(cfg, generators=generators, screen=fake_screen()).run(("paraphrase", "answer", "rot"))


if __name__ == "__main__":
    main(*sys.argv[1:])
