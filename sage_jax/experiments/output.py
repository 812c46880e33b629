"""What an experiment writes: its table (`<name>.md` and `<name>.json`) and its figure (`<name>.png`
and `<name>.series.json`). The series file is read back from the drawn figure (each line's,
scatter's and error bar's data as matplotlib holds it), so that a test can check what the figure
shows against the table. Every file is written whole (a temporary file, then a rename).
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path
from collections.abc import Mapping, Sequence

from clarifyjax.files.textfiles import atomic_write_bytes


def _clean(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _clean(value.item())
    return value


def write_json(path: Path, value) -> Path:
    atomic_write_bytes(path, (json.dumps(_clean(value), indent=1, allow_nan=False) + "\n").encode())
    return path


def shown(value, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def with_interval(stat: Mapping | None) -> str:
    """"mean [low, high]" of a `stats.mean_interval` / `paired_difference` / `correlation` entry."""
    if not stat:
        return "n/a"
    centre = stat.get("mean", stat.get("r"))
    if centre is None:
        return "n/a"
    if stat.get("low") is None:
        return shown(centre)
    return f"{shown(centre)} [{shown(stat['low'])}, {shown(stat['high'])}]"


def write_table(folder: Path, name: str, header: Sequence[str], rows: Sequence[Sequence[str]], data: Mapping,
                notes: Sequence[str] = ()) -> None:
    """`<name>.md` (the rows as shown, then the notes) and `<name>.json` (`data`, the numbers)."""
    folder.mkdir(parents=True, exist_ok=True)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    if notes:
        md += ["", *notes]
    atomic_write_bytes(folder / f"{name}.md", ("\n".join(md) + "\n").encode())
    write_json(folder / f"{name}.json", data)


def _drawn(ax) -> list[dict]:
    """Every line, scatter and error bar of `ax`, as matplotlib holds it."""
    out = []
    for line in ax.get_lines():
        label = line.get_label()
        if label.startswith("_"):  # error-bar caps and stems
            continue
        out.append({"type": "line", "label": label, "linestyle": line.get_linestyle(),
                    "x": [float(v) for v in line.get_xdata()], "y": [float(v) for v in line.get_ydata()]})
    for container in ax.containers:
        if hasattr(container, "has_yerr") and container.has_yerr:
            data_line, _, bars = container.lines
            segments = bars[0].get_segments() if bars else []
            out.append({"type": "errorbar", "label": container.get_label(),
                        "x": [float(v) for v in data_line.get_xdata()], "y": [float(v) for v in data_line.get_ydata()],
                        "low": [float(s[0][1]) for s in segments], "high": [float(s[1][1]) for s in segments]})
    for collection in ax.collections:
        label = collection.get_label()
        if label.startswith("_"):
            continue
        offsets = collection.get_offsets()
        out.append({"type": "scatter", "label": label, "x": [float(p[0]) for p in offsets],
                    "y": [float(p[1]) for p in offsets]})
    return out


def save_figure(fig, folder: Path, name: str) -> None:
    """The PNG and the series read back from each of its axes (by title)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    series = {ax.get_title() or f"axes {i}": _drawn(ax) for i, ax in enumerate(fig.axes)}
    plt.close(fig)
    atomic_write_bytes(folder / f"{name}.png", buf.getvalue())
    write_json(folder / f"{name}.series.json", series)


def figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), dpi=110, squeeze=False)
    return fig, list(axes[0])


def interval_points(ax, labels: Sequence[str], stats: Sequence[Mapping | None], *, label: str, offset: float = 0.0):
    """Means with their intervals as error bars at x = 0, 1, ... (+ offset); undefined ones left out."""
    xs, ys, lo, hi = [], [], [], []
    for i, s in enumerate(stats):
        if s and s.get("mean") is not None and s.get("low") is not None:
            xs.append(i + offset)
            ys.append(s["mean"])
            lo.append(s["mean"] - s["low"])
            hi.append(s["high"] - s["mean"])
    if xs:
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=label)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
