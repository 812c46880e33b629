"""The saved record of a run, and which settings may change when it resumes.

A resumed run may change only the settings in `RESUMABLE` (bookkeeping, logging, evaluation sizes,
the mesh); `check_resume` refuses any other difference from the record before anything is built
or written, in one error naming every differing key and both values. Where the record is kept is
written above `check_resume`."""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any
from collections.abc import Callable, Mapping

import jax
import yaml

from clarifyjax.config.loader import ConfigError, config_to_dict, save_config

CONFIG_FILE, HISTORY_FILE, CHECKPOINTS = "config.yaml", "config_history.jsonl", "checkpoints"

# Settings a resumed run may change, and why each one leaves steps 1..N and the meaning of the
# following steps alone. Everything not listed (model, tokenizer, optimizer, data files and their
# split, seed, PPO and reward settings, the normalizer) changes what is trained and is refused.
_COMMON = {
    "run.name": "a label; the folder is run.output_dir",
    "run.output_dir": "where the run lives: a moved or copied run folder resumes",
    "run.steps": "where training stops (a linear or cosine schedule is re-stretched: warned)",
    "run.eval_every": "evaluation only reads the state",
    "run.save_every": "when checkpoints are written",
    "run.log_every": "what is logged",
    "run.sample_every": "what is printed",
    "run.max_to_keep": "how many checkpoints are kept",
    "run.async_checkpointing": "how checkpoints are written",
    "mesh": "checkpoints restore into any topology; the data order does not depend on it",
    "data.eval_batch_size": "evaluation pads and masks its rows",
}
RESUMABLE: dict[str, dict[str, str]] = {
    "sft": {**_COMMON, "data.dev_rows": "how many dev pairs are evaluated (a prefix)"},
    # PPO's dev file is read for evaluation only; SFT's dev_path is refused because with
    # dev_path null the dev split is cut out of train_path, so it decides the training rows.
    "ppo": {**_COMMON, "data.dev_path": "the dev situations are only evaluated",
            "data.dev_situations": "how many dev situations are evaluated"},
}


def as_record(cfg) -> dict:
    """The config as plain JSON values (what checkpoints store and `check_resume` compares)."""
    return json.loads(json.dumps(config_to_dict(cfg)))


def allowed(kind: str, key: str) -> bool:
    """Whether `key` (dotted) may differ on resume: it or one of its parents is in `RESUMABLE`."""
    table = RESUMABLE.get(kind, _COMMON)
    parts = key.split(".")
    return any(".".join(parts[:i]) in table for i in range(1, len(parts) + 1))


def differences(recorded: Mapping, now: Mapping, at: str = ""
                ) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """([(key, recorded value, current value)], [keys present on one side only])."""
    changed, one_sided = [], []
    for key in list(recorded) + [k for k in now if k not in recorded]:
        where = f"{at}.{key}" if at else str(key)
        if key not in now or key not in recorded:
            one_sided.append(where)
        elif isinstance(recorded[key], Mapping) and isinstance(now[key], Mapping):
            sub_changed, sub_one_sided = differences(recorded[key], now[key], where)
            changed += sub_changed
            one_sided += sub_one_sided
        elif recorded[key] != now[key]:
            changed.append((where, recorded[key], now[key]))
    return changed, one_sided


def checkpoint_steps(run_dir: str | os.PathLike) -> list[int]:
    """Step folders under ``run_dir/checkpoints``, newest first (damaged ones included)."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted((int(p.name) for p in folder.iterdir() if p.name.isdigit() and p.is_dir()),
                  reverse=True)


def _checkpoint_config(run_dir: Path, step: int) -> dict | None:
    try:
        extra = json.loads((run_dir / CHECKPOINTS / str(step) / "extra" / "metadata").read_text())
    except (OSError, ValueError):  # damaged: `Checkpointer.restore_latest` will say so
        return None
    config = extra.get("config") if isinstance(extra, dict) else None
    return config if isinstance(config, dict) else None


def recorded_config(run_dir: str | os.PathLike) -> tuple[dict | None, str]:
    """(the recorded config, where it was read) of a run folder with checkpoints.

    The newest checkpoint that carries a config wins (it is what the steps were made with); a
    folder of checkpoints saved before they carried one falls back to ``config.yaml``.
    """
    run_dir = Path(run_dir)
    for step in checkpoint_steps(run_dir):
        config = _checkpoint_config(run_dir, step)
        if config is not None:
            return config, f"checkpoint {run_dir / CHECKPOINTS / str(step)}"
    path = run_dir / CONFIG_FILE
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None, ""
    return (config, str(path)) if isinstance(config, dict) else (None, "")


def _shown_keys(kind: str) -> list[str]:
    return sorted(k if "." in k else f"{k}.*" for k in RESUMABLE.get(kind, _COMMON))


def _show(value) -> str:
    return json.dumps(value, ensure_ascii=False)  # one line whatever the value holds


def compare(cfg, recorded: Mapping, source: str, say: Callable[[str], None]
            ) -> list[tuple[str, Any, Any]]:
    """The allowed changes of `cfg` against `recorded`.

    Raises:
      ConfigError: one line naming every other differing key with both values.
    """
    changed, one_sided = differences(recorded, as_record(cfg))
    refused = [c for c in changed if not allowed(cfg.kind, c[0])]
    if refused:
        listed = "; ".join(f"{k}: {_show(a)} in the record, {_show(b)} now" for k, a, b in refused)
        raise ConfigError(
            f"{cfg.run.directory}: cannot resume with changed settings (recorded in {source}): "
            f"{listed}. Only {', '.join(_shown_keys(cfg.kind))} may change on resume; restore "
            "the recorded values, or give a new run.output_dir")
    if one_sided:
        say(f"[resume] warning: settings recorded on one side only (another version of the "
            f"code?), not compared: {', '.join(one_sided)}")
    return changed


# The record is in three places (docs/reliability.md): every checkpoint's extra JSON holds the
# config it was saved under (so a config.yaml deleted or edited by hand changes nothing), config.yaml
# is the latest start's, written only after a restore succeeded, and config_history.jsonl has one
# line per resume that changed an allowed setting, {"time", "step", "changes": {key: [recorded,
# now]}}. Keys on one side only (a setting added or removed by a newer version of the code) are a
# warning, not a refusal: their effect cannot be compared.
def check_resume(cfg, say: Callable[[str], None] = print) -> list[tuple[str, Any, Any]]:
    """Before anything is built or written: refuse a resume with changed settings.

    Returns the allowed changes ([] for a fresh run folder, which has no checkpoint).

    Raises:
      ConfigError: a setting outside `RESUMABLE` differs from the record (see `compare`).
    """
    if not checkpoint_steps(cfg.run.directory):
        return []
    recorded, source = recorded_config(cfg.run.directory)
    if recorded is None:
        say(f"[resume] warning: {cfg.run.directory} has checkpoints but no recorded config "
            f"(none in the checkpoints, no {CONFIG_FILE}): the settings cannot be checked")
        return []
    return compare(cfg, recorded, source, say)


def commit(cfg, step: int, extra: Mapping, say: Callable[[str], None] = print) -> None:
    """After a successful restore of `step` (0: a fresh start): write ``config.yaml`` and, when
    allowed settings changed since the restored checkpoint, append them to
    ``config_history.jsonl``. Only process 0 writes.

    Raises:
      ConfigError: the restored checkpoint's own record differs in a refused setting (it is
        older than the one `check_resume` read, when a newer one was damaged).
    """
    run_dir = Path(cfg.run.directory)
    changes = []
    if step:
        record = extra.get("config")
        source = f"checkpoint {run_dir / CHECKPOINTS / str(step)}"
        if not isinstance(record, Mapping):  # a checkpoint saved before checkpoints held it
            record, source = recorded_config(run_dir)
        changes = compare(cfg, record, source, lambda _: None) if record else []
    for key, before, after in changes:
        say(f"[resume] {key}: {_show(before)} -> {_show(after)} from step {step} (allowed; "
            f"recorded in {HISTORY_FILE})")
        if key == "run.steps" and cfg.optimizer.schedule != "constant":
            say(f"[resume] warning: the {cfg.optimizer.schedule} learning-rate schedule now ends "
                f"at step {after} instead of {before}: steps after {step} follow the new one")
    if jax.process_index() != 0:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / CONFIG_FILE)
    if changes:
        line = {"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "step": int(step), "changes": {k: [a, b] for k, a, b in changes}}
        with open(run_dir / HISTORY_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
