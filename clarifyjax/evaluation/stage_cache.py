"""The outputs of every stage of `clarifyjax evaluate`, kept per system and chunk of situations
(`StageCache`), so that a run killed at any point (kill -9 included), or run again with one more
system, computes only what is new."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

from clarifyjax.files.chunkstore import fingerprint
from clarifyjax.files.textfiles import atomic_write_bytes


def model_fingerprint(folders: Sequence[str | os.PathLike | None], options: dict | None = None
                      ) -> str:
    """What a stage's outputs depend on besides its inputs: `options` and the model files."""
    return fingerprint(options or {}, (), folders)


class StageCache:
    """`chunk(stage, label, depends_on, index, inputs, compute)`: the chunk's records, read back
    or computed (`compute() -> list of JSON-ready records`, one per input) and saved.

    `computed` / `reused` count chunks per stage, for the run's summary.

    Layout: ``CACHE/{stage}/{label}/{key}.json``, one file per chunk written whole by a rename, one
    JSON record per situation (with its text). ``label`` is the system (or what several share, such
    as the wh-conditioned candidates); ``key`` is a sha256 over the stage, everything the outputs
    depend on (settings, model files' paths, sizes and times), the chunk's index and its input
    texts: a changed setting, model or input is a new key, never a stale hit.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.computed: dict[str, int] = {}
        self.reused: dict[str, int] = {}

    def path(self, stage: str, label: str, depends_on: str, index: int,
             inputs: Sequence[Any]) -> Path:
        digest = hashlib.sha256(json.dumps([stage, depends_on, index, list(inputs)],
                                           sort_keys=True).encode()).hexdigest()
        return self.folder / stage / label / f"{digest[:32]}.json"

    def chunk(self, stage: str, label: str, depends_on: str, index: int, inputs: Sequence[Any],
              compute: Callable[[], list]) -> list:
        path = self.path(stage, label, depends_on, index, inputs)
        try:
            records = json.loads(path.read_text(encoding="utf-8"))["records"]
            if isinstance(records, list) and len(records) == len(inputs):
                self.reused[stage] = self.reused.get(stage, 0) + 1
                return records
        except (OSError, ValueError, KeyError, TypeError):
            pass
        records = list(compute())
        if len(records) != len(inputs):
            raise ValueError(f"stage {stage!r}: {len(records)} records for {len(inputs)} inputs")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps({"stage": stage, "label": label, "chunk": index,
                                             "records": records},
                                            ensure_ascii=False).encode("utf-8"))
        self.computed[stage] = self.computed.get(stage, 0) + 1
        return records
