"""What `sage-jax score` writes: per-question CSV, summary JSON, a side-by-side table, a PNG.

Every file is written atomically (a temporary file beside it, then a rename), so a reader never
sees half a report; `OutputFolder` does the same for the whole set: the files go to a temporary
sibling folder that replaces the output folder in one rename once every file is written, so a run
that fails leaves the earlier results (or nothing) and never a mix. JSON never holds NaN/Infinity:
a value that is not finite is a missing one (null in the summary, "" in the CSV).
"""
from __future__ import annotations

import csv
import fnmatch
import io
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from collections.abc import Mapping, Sequence

import numpy as np

from clarifyjax.files.textfiles import atomic_write_bytes

# Metric key -> label in the printed table, in display order.
METRICS = {"sage": "SaGE", "bleu": "BLEU", "rouge_l": "ROUGE-L", "bertscore": "BERTScore"}
# The files a run writes: with --overwrite, a folder holding anything else is not replaced.
OUTPUT_NAMES = ("*.per_question.csv", "summary.json", "sage_distribution.png")


def statistics(values: Sequence[float]) -> dict:
    """mean, std (population, ddof=0), count of finite values and number skipped (NaN, inf)."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
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
        return repr(float(value)) if math.isfinite(value) else ""
    return str(value)


def write_per_question_csv(path: str | Path, columns: Mapping[str, Sequence]) -> Path:
    """One row per question; `columns` maps a header to a column of equal length. NaN -> ""."""
    lengths = {name: len(col) for name, col in columns.items()}  # NaN / inf -> "" (missing)
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
    finite = [v for vals in scores.values() for v in np.asarray(vals, np.float64) if math.isfinite(v)]
    low = max(-1.0, math.floor(min(finite + [0.0]) * 10) / 10)  # SaGE is in [-1, 1]; show what is used
    bins = np.linspace(-1.0, 1.0, 81)
    for name, values in scores.items():
        values = np.asarray(values, np.float64)
        values = values[np.isfinite(values)]
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


class OutputError(ValueError):
    """An --out folder that cannot take this run's files; the message names it."""


def _check_out(path: Path, shown: str, overwrite: bool, inputs: Sequence[Path]) -> None:
    if path.exists() and not path.is_dir():
        raise OutputError(f"--out {shown}: is a file, not a folder")
    ancestor = next((p for p in path.parents if p.exists()), None)
    if ancestor is not None and not ancestor.is_dir():
        raise OutputError(f"--out {shown}: {ancestor} is a file, not a folder")
    for f in inputs:  # a replaced folder would take its inputs with it
        if path in Path(os.path.realpath(f)).parents:
            raise OutputError(f"--out {shown}: holds the input file {f}; choose another output folder")
    if not path.is_dir():
        return
    try:
        entries = sorted(p.name for p in path.iterdir())
    except OSError as e:
        raise OutputError(f"--out {shown}: cannot list the folder: {e.strerror}") from None
    if entries and not overwrite:
        raise OutputError(f"--out {shown}: folder is not empty ({len(entries)} entries, e.g. "
                          f"{entries[0]!r}); pass --overwrite to replace an earlier run's results")
    foreign = [e for e in entries if not any(fnmatch.fnmatchcase(e, n) for n in OUTPUT_NAMES)]
    if foreign:
        raise OutputError(f"--out {shown}: --overwrite replaces the whole folder, but {foreign[0]!r} "
                          "was not written by sage-jax score; refusing to delete it")
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"--out {shown}: folder is not writable")


class OutputFolder:
    """A run's output folder, written as a whole: files go to `staging` (a temporary sibling);
    `publish` swaps it in, `discard` (always call it, e.g. in `finally`) removes what is left.

    Checked when made, before any work: an existing file, a folder that is not empty (unless
    `overwrite`; even then only an earlier run's files may be in it), one holding an input file, a
    folder or parent that cannot be created or written. Each is an `OutputError` naming --out.
    """

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False, inputs: Sequence = ()):
        self.shown = str(path)
        self.path = Path(os.path.realpath(path))  # a symlinked --out is replaced where it points
        _check_out(self.path, self.shown, overwrite, [Path(f) for f in inputs])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.staging = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=f".{self.path.name}.tmp-"))
        except OSError as e:
            raise OutputError(f"--out {self.shown}: cannot create a folder in {e.filename or self.path.parent}: "
                              f"{e.strerror or e}") from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.staging, 0o777 & ~umask)  # mkdtemp makes it 0700
        self.published = False

    def __truediv__(self, name: str) -> Path:
        return self.staging / name

    def publish(self) -> Path:
        """Put the staged files in place of the output folder (one rename each way)."""
        old = None
        if self.path.exists():
            shutil.copymode(self.path, self.staging)
            old = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=f".{self.path.name}.old-"))
            try:
                os.replace(self.path, old / "out")
            except BaseException:
                old.rmdir()
                raise
        try:
            os.replace(self.staging, self.path)
        except BaseException:
            if old is not None:  # the earlier results go back where they were
                os.replace(old / "out", self.path)
                old.rmdir()
            raise
        self.published = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.path

    def discard(self) -> None:
        if not self.published:
            shutil.rmtree(self.staging, ignore_errors=True)
