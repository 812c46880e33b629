"""A child process's result as a JSON file its parent names (tests, benchmark workers).

A parent cannot parse a child's stdout reliably (Gloo, XLA and gRPC write there too), so it puts a
path in ``$CLARIFYJAX_RESULT_FILE``; the child calls `write_result(dict)`, which replaces the file
atomically (any number of times), and the parent calls `read_result(path)`. One of several
processes (``$CLARIFYJAX_PROCESS_ID`` set) writes ``result.{process_id}.json`` (`result_path`)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from clarifyjax.files.textfiles import atomic_write_bytes

RESULT_FILE_ENV = "CLARIFYJAX_RESULT_FILE"
PROCESS_ID_ENV = "CLARIFYJAX_PROCESS_ID"  # clarifyjax.core.distributed.ENV_PROCESS_ID (no jax here)


def result_path(base: str | os.PathLike, process_id: int | None = None) -> Path:
    """`base`, or for process `process_id` of a multi-process job ``{stem}.{process_id}{suffix}``."""
    base = Path(base)
    if process_id is None:
        return base
    return base.with_name(f"{base.stem}.{int(process_id)}{base.suffix}")


def write_result(data: dict, *, process_id: int | None = None) -> Path:
    """Write `data` as JSON to the file named by ``$CLARIFYJAX_RESULT_FILE`` (per process when
    `process_id` is given or ``$CLARIFYJAX_PROCESS_ID`` is set); returns the path."""
    base = os.environ.get(RESULT_FILE_ENV)
    if not base:
        raise RuntimeError(f"${RESULT_FILE_ENV} is not set: the parent names the result file")
    if process_id is None and os.environ.get(PROCESS_ID_ENV, "").strip():
        process_id = int(os.environ[PROCESS_ID_ENV])
    path = result_path(base, process_id)
    atomic_write_bytes(path, json.dumps(data).encode("utf-8"))
    return path


def read_result(path: str | os.PathLike) -> dict:
    """The JSON object a child wrote; FileNotFoundError or ValueError when there is none."""
    value = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value
