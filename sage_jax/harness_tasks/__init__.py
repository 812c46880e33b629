"""lm-evaluation-harness tasks that the package ships (`sage_moral`, sage_moral.yaml), for
`lm_eval --include_path "$(python -c 'import sage_jax.harness_tasks as t; print(t.task_folder())')"`
or `TaskManager(include_path=str(task_folder()))`; docs/lm_eval.md, "The SaGE task"."""
from __future__ import annotations

from pathlib import Path


def task_folder() -> Path:
    """The folder of the task YAMLs, for lm-eval's include_path."""
    return Path(__file__).resolve().parent
