"""Small helpers shared by the benchmarks: timing, machine facts, atomic JSON results."""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from collections.abc import Callable

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def timeit(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1) -> dict:
    """Run fn warmup times (untimed), then `repeats` times; return best/median seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"best_s": times[0], "median_s": times[len(times) // 2], "repeats": repeats}


def machine_info() -> dict:
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpu_count": os.cpu_count()}
    try:
        import jax

        info["jax"] = jax.__version__
        info["jax_devices"] = [str(d) for d in jax.devices()]
    except Exception:  # pragma: no cover
        pass
    return info


def write_results(name: str, results: dict, path: Path | None = None) -> Path:
    """Write `path` (default benchmarks/results/<name>.json) atomically and print it."""
    path = Path(path or RESULTS_DIR / f"{name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    results = {"benchmark": name, "machine": machine_info(), **results}
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(tmp, path)
    print(json.dumps(results, indent=2))
    print(f"wrote {path}")
    return path
