#!/usr/bin/env python
"""Bytes per device of a PPO run: every model's parameters, Adam state, gradients, activations.

    python launch/memory_plan.py                                  # clarifyjax/presets/ppo_t5_large.yaml
    python launch/memory_plan.py clarifyjax/presets/ppo_t5_large.yaml mesh.fsdp=8 --markdown plan.md

For each hardware target (TPU v4-32, 8 H100s) and judge (the config's, T5-11B) it prints
`clarifyjax.training.memory_plan.plan`, whose docstring says what is counted; --json FILE too.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

# The plan itself is `clarifyjax.training.memory_plan`; this script prints it for a few scenarios.
from clarifyjax.config import config_from_dict, config_to_dict, load_config  # noqa: E402
from clarifyjax.training.memory_plan import (  # noqa: E402,F401  (the tests read these names here)
    GiB, KNOWN_ARCHITECTURES, Hardware, PlanError, plan)
from clarifyjax.files.textfiles import atomic_write_bytes  # noqa: E402

HARDWARE = {
    "v4-32": Hardware("TPU v4-32 (16 chips x 32 GiB)", 16, 32 * GiB, 4),  # 4 hosts of 4 chips
    "8xH100": Hardware("8 x H100 80GB", 8, 81559 * 2 ** 20, 8),  # what nvidia-smi reports
}
JUDGES = {"config": None, "t5-11b": "pretrained/t5-11b"}


def _gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def table(plans: list[tuple[str, dict]], markdown: bool = False) -> str:
    """Rows = components, columns = scenarios; GiB per device."""
    names = [name for name, _ in plans]
    rows = [["mesh data x fsdp x model"] + ["x".join(str(v) for v in p["mesh"].values())
                                            for _, p in plans],
            ["PPO minibatch rows per device"] + [str(p["minibatch_rows_per_device"])
                                                 for _, p in plans]]
    rows += [[key] + [_gib(p["components"][key]) for _, p in plans]
             for key in plans[0][1]["components"]]
    rows.append(["**total per device**" if markdown else "TOTAL per device"]
                + [(f"**{_gib(p['total_bytes'])}**" if markdown else _gib(p["total_bytes"]))
                   for _, p in plans])
    rows.append(["HBM per device"] + [_gib(p["hbm_bytes"]) for _, p in plans])
    rows.append(["share of HBM"] + [f"{100 * p['fraction_of_hbm']:.0f}%" for _, p in plans])
    header = ["GiB per device"] + names
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * len(names)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def scenarios(config_path: Path, overrides: list[str], hardware: list[str],
              judges: list[str]) -> list[tuple[str, dict]]:
    cfg = load_config(config_path, overrides)
    out = []
    for hw in hardware:
        if hw not in HARDWARE:
            raise PlanError(f"unknown hardware {hw!r}; known: {sorted(HARDWARE)}")
        for judge in judges:
            if judge not in JUDGES:
                raise PlanError(f"unknown judge {judge!r}; known: {sorted(JUDGES)}")
            run_cfg = cfg
            if JUDGES[judge] is not None:
                raw = config_to_dict(cfg)
                raw["rewards"]["judge"]["model"].update(init=JUDGES[judge], tiny=None)
                run_cfg = config_from_dict(raw, source=f"{config_path} (judge {judge})")
            p = plan(run_cfg, HARDWARE[hw], config_path.parent)
            judge_name = next(m["architecture"] for m in p["models"] if m["role"] == "judge")
            out.append((f"{hw}, judge {judge_name}", p))
    return out


def markdown_report(plans: list[tuple[str, dict]], command: str) -> str:
    first = plans[0][1]
    models = ", ".join(f"{m['role']} {m['architecture']} ({m['n_params'] / 1e6:,.0f}M)"
                       for m in first["models"])
    return "\n".join([
        f"Computed by `{command}` from the config, without devices (`nnx.eval_shape` and the "
        f"sharding rules on an abstract mesh; seconds on a CPU). Models: {models}; parameters "
        f"in their configured `param_dtype`, rules `{first['rules']}`. Activations: PPO "
        f"minibatch of {first['source_length']} source / {first['target_length']} target "
        "tokens, an upper bound that keeps every intermediate (XLA needed about 0.28x of it for "
        "the T5-large policy + value gradient compiled on an H100).",
        "",
        table(plans, markdown=True),
    ])


def _command(config: str, overrides: list[str], hardware: str, judges: str) -> str:
    """The command line that reproduces a table (for the Markdown)."""
    parts = ["python launch/memory_plan.py"]
    path = Path(config).resolve()
    default = (REPO_ROOT / DEFAULT_CONFIG).resolve()
    if path != default:
        parts.append(str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else config)
    parts += overrides
    if hardware != DEFAULT_HARDWARE:
        parts.append(f"--hardware {hardware}")
    if judges != DEFAULT_JUDGES:
        parts.append(f"--judges {judges}")
    return " ".join(parts)


DEFAULT_CONFIG = "clarifyjax/presets/ppo_t5_large.yaml"
DEFAULT_HARDWARE = "v4-32,8xH100"
DEFAULT_JUDGES = "config,t5-11b"


def main(argv: list[str] | None = None) -> list[tuple[str, dict]]:
    """Print the table (and write Markdown / JSON when asked); returns [(column name, plan)]."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default=str(REPO_ROOT / DEFAULT_CONFIG),
                        help=f"a PPO config (default {DEFAULT_CONFIG})")
    parser.add_argument("overrides", nargs="*", help="key=value, as for clarifyjax train")
    parser.add_argument("--hardware", default=DEFAULT_HARDWARE, help=f"of {sorted(HARDWARE)}")
    parser.add_argument("--judges", default=DEFAULT_JUDGES, help=f"of {sorted(JUDGES)}")
    parser.add_argument("--markdown", help="also write the table as Markdown to this file")
    parser.add_argument("--json", help="also write every number as JSON to this file")
    args = parser.parse_args(argv)
    if "=" in args.config and not Path(args.config).exists():  # only overrides were given
        args.overrides.insert(0, args.config)
        args.config = str(REPO_ROOT / DEFAULT_CONFIG)
    plans = scenarios(Path(args.config), args.overrides, args.hardware.split(","),
                      args.judges.split(","))
    print(table(plans))
    if args.markdown:
        command = _command(args.config, args.overrides, args.hardware, args.judges)
        atomic_write_bytes(Path(args.markdown), (markdown_report(plans, command) + "\n").encode())
    if args.json:
        atomic_write_bytes(Path(args.json), json.dumps(dict(plans), indent=1).encode())
    return plans


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:  # PlanError, ConfigError, CheckpointError: the message says it all
        sys.exit(f"memory_plan: {e}")
