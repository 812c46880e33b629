"""Summarize a `jax.profiler.trace(..., create_perfetto_trace=True)` folder: device time per op.

    python benchmarks/trace_summary.py TRACE_DIR [--top 40] [--json OUT.json]

Sums the duration of every complete event by name (XLA ops: fusions, custom calls, copies),
groups names by their prefix before the numeric suffix (`loop_fusion.12` -> `loop_fusion`), and
prints both tables with each entry's share of the total. Python-side events ($...) and runtime
bookkeeping (ThunkExecutor, thread-pool waits) are left out.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
from pathlib import Path

SKIP = re.compile(r"^\$|ThunkExecutor|SlinkyThreadPool|^end: |PjitFunction|^Thunk")


def summarize(trace_dir: str | Path) -> dict:
    files = sorted(Path(trace_dir).rglob("perfetto_trace.json.gz"))
    if not files:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
    with gzip.open(files[-1]) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    by_name: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and not SKIP.search(e.get("name", "")):
            by_name[e["name"]] += e.get("dur", 0)
            count[e["name"]] += 1
    by_kind: collections.Counter = collections.Counter()
    for name, us in by_name.items():
        by_kind[re.sub(r"[._]\d+$", "", name)] += us
    total = sum(by_name.values())
    return {"file": str(files[-1]), "total_ms": total / 1e3,
            "by_kind": [(k, v / 1e3) for k, v in by_kind.most_common()],
            "by_name": [(k, v / 1e3, count[k]) for k, v in by_name.most_common()]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace_dir")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--json", default="")
    args = p.parse_args()
    s = summarize(args.trace_dir)
    print(f"{s['file']}: {s['total_ms']:.1f} ms of op time")
    for title, rows in (("by kind", s["by_kind"]), ("by op", s["by_name"])):
        print(f"--- {title}")
        for row in rows[:args.top]:
            extra = f" x{row[2]}" if len(row) > 2 else ""
            print(f"{row[1]:10.2f} ms {100 * row[1] / s['total_ms']:5.1f}%  {row[0]}{extra}")
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=1))


if __name__ == "__main__":
    main()
