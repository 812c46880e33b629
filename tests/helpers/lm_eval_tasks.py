"""lm-evaluation-harness 0.4.13's `hf` model run offline on the task folders of
`clarifyjax.harness.local_tasks` (DESIGN §7): `simple_evaluate(..., log_samples=True)` gives each
choice's log-likelihood; and HellaSwag documents in its official fields."""
from __future__ import annotations

from pathlib import Path


def loglikelihoods(folder: Path, model: Path, tasks: list[str], max_length: int) -> dict:
    """task -> per document (in file order): [each choice's log-likelihood], and the task's metrics."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    result = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={model},max_length={max_length},dtype=float32",
        tasks=tasks, batch_size=1, device="cpu", log_samples=True,
        task_manager=TaskManager(include_path=str(folder), include_defaults=False))
    out = {}
    for task in tasks:
        samples = sorted(result["samples"][task], key=lambda s: s["doc_id"])
        out[task] = {"lls": [[float(r[0][0]) for r in s["resps"]] for s in samples],
                     "docs": samples, "metrics": result["results"][task]}
    return out


def hellaswag_rows(n: int, offset: int = 0) -> list[dict]:
    """HellaSwag's official fields, with its WikiHow brackets and a lower-case ctx_b to capitalize."""
    return [{"ind": offset + i, "activity_label": "Baking cookies",
             "ctx_a": f"A woman puts dough number {offset + i} on a tray [title] then waits.",
             "ctx_b": "she PUTS it in the oven", "split": "val", "source_id": f"w{i}",
             "endings": [f"and waits {i} minutes.", "and eats [step] it raw.", "then she sings  loudly.",
                         "and leaves."],
             "label": str(i % 4)} for i in range(n)]
