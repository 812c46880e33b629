"""What `sage-jax score` writes: per-question CSV, summary JSON, a side-by-side table, a PNG.

Every file is written atomically (a temporary file beside it, then a rename), so a reader never
sees half a report.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from clarifyjax.models.checkpoint_io import atomic_write_bytes

# Metric key -> label in the printed table, in display order.
METRICS = {"sage": "SaGE", "bleu": "BLEU", "rouge_l": "ROUGE-L", "bertscore": "BERTScore"}


def statistics(values: Sequence[float]) -> dict:
    """mean, std (population, ddof=0), count of finite values and number skipped (NaN)."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[~np.isnan(values)]
    if finite.size == 0:
        return {"mean": None, "std": None, "count": 0, "skipped": int(values.size)}
    return {"mean": float(finite.mean()), "std": float(finite.std()), "count": int(finite.size),
            "skipped": int(values.size - finite.size)}


def _write(path: Path, data: bytes) -> Path:
    atomic_write_bytes(path, data)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return _write(Path(path), text.encode("utf-8"))


def _cell(value) -> str:
    if isinstance(value, (float, np.floating)):
        return "" if math.isnan(value) else repr(float(value))
    return str(value)


def write_per_question_csv(path: str | Path, columns: Mapping[str, Sequence]) -> Path:
    """One row per question; `columns` maps a header to a column of equal length. NaN -> ""."""
    lengths = {name: len(col) for name, col in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"columns of different lengths: {lengths}")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(list(columns))
    for row in zip(*columns.values()):
        writer.writerow([_cell(v) for v in row])
    return atomic_write_text(path, buf.getvalue())


def write_summary_json(path: str | Path, summary) -> Path:
    return atomic_write_text(path, json.dumps(summary, indent=2, allow_nan=False) + "\n")


def unique_names(paths: Sequence[str | Path]) -> list[str]:
    """A short, distinct name per input file (its stem; parent folders added on collisions)."""
    paths = [Path(p) for p in paths]
    for depth in range(1, max((len(p.parts) for p in paths), default=1) + 1):
        names = ["__".join(p.with_suffix("").parts[-depth:]) for p in paths]
        if len(set(names)) == len(names):
            return names
    return [f"{i}_{p.stem}" for i, p in enumerate(paths)]


def format_table(summaries: Sequence[Mapping]) -> str:
    """The models side by side: mean ± std per metric, then count / skipped of SaGE."""
    names = [s["model"] for s in summaries]
    rows = [["metric"] + names]
    for key, label in METRICS.items():
        if not any(key in s for s in summaries):
            continue
        row = [label]
        for s in summaries:
            st = s.get(key)
            row.append("-" if not st or st["mean"] is None else f"{st['mean']:.4f} ± {st['std']:.4f}")
        rows.append(row)
    rows.append(["questions (scored/skipped)"] + [f"{s['sage']['count']}/{s['sage']['skipped']}"
                                                  for s in summaries])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot_distributions(path: str | Path, scores: Mapping[str, Sequence[float]], *,
                       title: str = "SaGE per question") -> Path:
    """A PNG with one histogram (step outline) per model of its per-question scores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    finite = [v for vals in scores.values() for v in np.asarray(vals, np.float64) if not math.isnan(v)]
    low = max(-1.0, math.floor(min(finite + [0.0]) * 10) / 10)  # SaGE is in [-1, 1]; show what is used
    bins = np.linspace(-1.0, 1.0, 81)
    for name, values in scores.items():
        values = np.asarray(values, np.float64)
        values = values[~np.isnan(values)]
        mean = f"{values.mean():.3f}" if values.size else "n/a"
        ax.hist(values, bins=bins, histtype="step", linewidth=1.6, label=f"{name} (mean {mean}, n={values.size})")
    ax.set_xlabel("SaGE")
    ax.set_ylabel("questions")
    ax.set_title(title)
    ax.set_xlim(low, 1.0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return _write(Path(path), buf.getvalue())
