"""Finished chunks of a long run (`score-questions`, `ask`), kept until the run completes.

The output is written once, at the end, by one rename; until then each finished chunk is saved
atomically (arrays in .npz, the rest as JSON) in ``.NAME.partial/`` beside it, and the same
command run again computes only the missing chunks. The folder carries a `fingerprint` of the
options, inputs and model files: chunks of another run are discarded, never mixed in."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

import numpy as np

from clarifyjax.files.textfiles import atomic_write_bytes

MARKER = "run.json"
# What this module writes there (atomic_write_bytes' temporary files start with "."), so that a
# folder of that name holding anything else is never deleted.
_OURS = re.compile(r"^(run\.json|chunk-\d+\.npz|\..*)$")


def fingerprint(options: Mapping[str, Any], texts: Sequence[Sequence[str]],
                folders: Sequence[str | os.PathLike | None]) -> str:
    """sha256 over the options (JSON), the texts, and each model file's path, size and mtime."""
    digest = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode())
    for column in texts:
        digest.update(json.dumps(list(column)).encode())
    for folder in folders:
        for path in sorted(Path(folder).rglob("*")) if folder is not None else ():
            if path.is_file():
                stat = path.stat()
                digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


class ChunkStore:
    """`load(i)` / `save(i, output)` of dataclass `cls` outputs in ``.NAME.partial/`` beside `out`.

    Raises (from `start`): `error` when that folder holds files this class did not write.
    """

    def __init__(self, out: str | os.PathLike, fingerprint: str, cls: type, *,
                 error: type[Exception] = ValueError):
        out = Path(out)
        self.folder = out.parent / f".{out.name}.partial"
        self.fingerprint, self.cls, self.error = fingerprint, cls, error

    def start(self, *, refuse_other_runs: bool = False) -> int:
        """Keep the chunks of an interrupted run with the same fingerprint (their number is
        returned), else start an empty folder. With `refuse_other_runs`, finished chunks of a run
        with another fingerprint are an `error` (the command says how to discard them) instead
        of being discarded."""
        if self.folder.is_dir():
            if self._fingerprint_on_disk() == self.fingerprint:
                return sum(1 for p in self.folder.glob("chunk-*.npz"))
            if refuse_other_runs and any(self.folder.glob("chunk-*.npz")):
                raise self.error(f"{self.folder}: holds finished chunks of an interrupted run "
                                 "with other settings, inputs or model; run that command again "
                                 "to resume it, or discard them (--overwrite)")
            strangers = [p.name for p in self.folder.iterdir() if not _OURS.match(p.name)]
            if strangers:
                raise self.error(f"{self.folder}: holds {strangers[:3]}, which score-questions did "
                                 "not write; move it away (it keeps unfinished runs)")
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        atomic_write_bytes(self.folder / MARKER,
                           json.dumps({"fingerprint": self.fingerprint}).encode())
        return 0

    def _fingerprint_on_disk(self) -> str | None:
        try:
            return json.loads((self.folder / MARKER).read_text())["fingerprint"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _path(self, i: int) -> Path:
        return self.folder / f"chunk-{i:06d}.npz"

    def load(self, i: int):
        """Chunk i's output, or None when it is missing or unreadable (then it is made again).
        An unreadable one (truncated by a crash, emptied by a full disk) is a one-line warning
        on stderr that names it; it is treated as unfinished."""
        path = self._path(i)
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as saved:
                values = json.loads(bytes(saved["__json__"]).decode())
                values.update({k: saved[k] for k in saved.files if k != "__json__"})
            return self.cls(**values)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
            print(f"warning: {path}: unreadable ({type(e).__name__}: {str(e)[:120]}), so "
                  "unfinished; it is made again", file=sys.stderr, flush=True)
            return None

    def save(self, i: int, output) -> None:
        arrays, rest = {}, {}
        for field in dataclasses.fields(output):
            value = getattr(output, field.name)
            (arrays if isinstance(value, np.ndarray) else rest)[field.name] = value
        buffer = io.BytesIO()
        np.savez(buffer, __json__=np.frombuffer(json.dumps(rest).encode(), np.uint8), **arrays)
        atomic_write_bytes(self._path(i), buffer.getvalue())

    def finish(self) -> None:
        """Remove the folder (the final file is written)."""
        shutil.rmtree(self.folder, ignore_errors=True)
