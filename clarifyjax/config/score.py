"""The `RewardConfig` that `clarifyjax score-questions` scores with: a PPO run's ``rewards:`` section,
from a YAML file (``--config``), then the command's flags and ``key=value`` items.

Each flag is only a spelling of a `RewardConfig` key (`FLAG_KEYS`) with no default of its own; a
flag and an item that set the same key are refused. Without a judge ``kind``, ``--judge-kind`` or
the ``--judge`` folder's config.json decides. No JAX at import, so ``--help`` stays fast."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Mapping, Sequence

from clarifyjax.config.loader import ConfigError, build_root, parse_overrides, read_yaml
from clarifyjax.core.ranges import number_type
from clarifyjax import config
from clarifyjax.config import RewardConfig

# Token lengths beyond this do not fit attention memory on one device anyway; capping them turns a
# typo (--answer-max-length 320000) into an error instead of an out-of-memory crash.
MAX_TOKENS = 8192

if TYPE_CHECKING:
    from clarifyjax.config import RewardConfig

# flag (its argparse dest) -> the RewardConfig key it sets
FLAG_KEYS: dict[str, str] = {
    "answerer": "answerer.init", "fusion": "fusion.init", "judge": "judge.model.init",
    "nli": "nli.init", "dropped_answer": "dropped_answer", "resample_k": "resample_k",
    "nli_threshold": "nli_threshold", "answer_max_length": "answer_max_length",
    "answer_temperature": "answer_temperature", "fusion_max_length": "fusion_max_length",
    "max_question_words": "max_question_words", "no_judgment_text": "use_judgment_text",
    "judgment_max_length": "judgment_max_length",
    "judge_kind": "judge.kind", "class_prefix": "judge.class_prefix",
    "class_tokens": "judge.class_tokens", "encoder_labels": "judge.encoder_labels"}
# flag -> the key it sets in every model section
MODEL_WIDE: dict[str, str] = {"dtype": "dtype", "max_input_length": "max_input_length"}
MODELS = ("answerer", "fusion", "judge.model", "nli")
REQUIRED = ("answerer", "fusion", "judge")  # the models that some source must give
_ENCODER_TYPES = ("bert", "roberta")  # config.json model_type of a classifier judge


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _value(dest: str, value) -> str:
    if dest == "no_judgment_text":
        return "false"
    if value is ARGMAX:
        return "null"
    return str(value)


class _Argmax:
    """The value of ``--nli-threshold argmax``: the ``nli_threshold: null`` rule."""

    def __repr__(self) -> str:
        return "argmax"


ARGMAX = _Argmax()


def nli_threshold_type(text: str):
    """``--nli-threshold``: "argmax" (drop when the argmax label is entailment or
    contradiction: ``nli_threshold: null``) or a number in the field's range."""
    if text.strip().lower() in ("argmax", "null"):
        return ARGMAX
    return bounded("PipelineConfig", "nli_threshold", float)(text)


def read_rewards(path: Path | None) -> tuple[dict, str]:
    """The ``RewardConfig`` mapping of `path` and how errors name it: a file of that mapping, or a
    PPO run config (``kind: ppo``), whose ``rewards:`` section is read."""
    if path is None:
        return {}, "<command line>"
    raw = read_yaml(path)
    if "kind" not in raw:
        return raw, str(path)
    if raw["kind"] != "ppo":
        raise ConfigError(f"{path}: a kind {raw['kind']!r} config has no rewards: section; give a "
                          "PPO run config or the mapping that sits under rewards:")
    rewards = raw.get("rewards") or {}
    if not isinstance(rewards, Mapping):
        raise ConfigError(f"{path}: 'rewards' must be a mapping, got {rewards!r}")
    return dict(rewards), f"{path} (its rewards: section)"


def _given(raw: Mapping, items: Sequence[str], key: str) -> bool:
    """Whether the file or an override sets `key` (a dotted path)."""
    if any(item.partition("=")[0].strip() == key for item in items):
        return True
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _judge_kind(folder) -> str | None:
    """"encoder" for a classifier folder, None otherwise (or when config.json is unreadable: the
    loader reports that, naming the file)."""
    try:
        model_type = json.loads((Path(folder) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return "encoder" if model_type in _ENCODER_TYPES else None


def add_reward_options(p: argparse.ArgumentParser) -> None:
    """The reward settings' flags (each one's range is its field's, `bounded`)."""
    reward = p.add_argument_group("reward")
    reward.add_argument("--dropped-answer", choices=("zero_reward", "resample", "blank"),
                        help="dropped_answer")
    reward.add_argument("--resample-k", type=bounded("PipelineConfig", "resample_k"),
                        help="resample_k")
    reward.add_argument("--nli-threshold", type=nli_threshold_type,
                        help="nli_threshold: drop when P(entailment) + P(contradiction) >= this, "
                             "or 'argmax' (null: drop when the argmax label is one of them; the "
                             "default)")
    reward.add_argument("--answer-max-length", help="answer_max_length",
                        type=bounded("PipelineConfig", "answer_max_length", high=MAX_TOKENS))
    reward.add_argument("--answer-temperature", help="answer_temperature (0: greedy)",
                        type=bounded("PipelineConfig", "answer_temperature", float))
    reward.add_argument("--fusion-max-length", help="fusion_max_length",
                        type=bounded("PipelineConfig", "fusion_max_length", high=MAX_TOKENS))
    reward.add_argument("--max-question-words", help="max_question_words: longer questions are "
                        "cut (and counted)", type=bounded("PipelineConfig", "max_question_words"))
    reward.add_argument("--no-judgment-text", action="store_true",
                        help="use_judgment_text=false: leave the judge's judgment out of the "
                             "answer generator's input")
    reward.add_argument("--gain", type=bounded("NormalizerConfig", "gain", float), default=None,
                        help="reward = gain * JSD + bias (gain > 0: a larger JSD stays better)")
    reward.add_argument("--bias", type=bounded("NormalizerConfig", "bias", float), default=None)


def bounded(section: str, name: str, kind: type = int, *, high: float | None = None
            ) -> Callable[[str], int | float]:
    """An argparse `type` for the option that sets field `name` of `clarifyjax.config.<section>`:
    the field's own range (its `_bounds`, declared once there; read when a value is parsed, so
    that `--help` imports no JAX), and at most `high`."""
    def bound() -> str:
        return getattr(config, section)._bounds[name]

    return number_type(kind, bound, high=high)


def reward_config(args: argparse.Namespace) -> RewardConfig:
    """The `RewardConfig` of a score-questions command line (`args.config`, the flags in
    `FLAG_KEYS` and `MODEL_WIDE` that were given, and `args.overrides`)."""
    raw, source = read_rewards(args.config)
    if args.config is None:  # a model that neither a flag nor an item gives
        missing = [_flag(d) for d in REQUIRED if getattr(args, d) is None and not any(
            item.partition("=")[0].strip().split(".")[0] == d for item in args.overrides)]
        if missing:
            raise ConfigError(f"the following arguments are required: {', '.join(missing)} "
                              "(or give the models in --config)")
    items = parse_overrides(args.overrides)  # a key given twice is refused
    flags = {}  # dest -> (the override it stands for, how messages name it)
    for dest, key in FLAG_KEYS.items():
        value = getattr(args, dest)
        if value is None or value is False or (dest == "judge_kind" and value == "auto"):
            continue  # not given
        _refuse_clash(dest, key, items)
        flags[dest] = (f"{key}={_value(dest, value)}", f"option {_flag(dest)}"
                       + ("" if value is True else f" {value}"))
    overrides = [item for item, _ in flags.values()] + items
    if not _given(raw, items, "judge.kind"):  # the flags' way to name the judge
        if "judge_kind" not in flags and args.judge is not None and _judge_kind(args.judge):
            flags["judge_kind"] = ("judge.kind=encoder",
                                   f"{Path(args.judge) / 'config.json'} (its model_type)")
            overrides.insert(0, "judge.kind=encoder")
        if "judge.kind=encoder" in overrides and not _given(raw, items, "judge.input_prefix"):
            overrides.insert(0, "judge.input_prefix=")  # a classifier read without a prefix
    cfg = _build(raw, overrides, source, flags)
    wide = [(dest, key, getattr(args, dest)) for dest, key in MODEL_WIDE.items()
            if getattr(args, dest) is not None]
    if not wide:
        return cfg
    models = [m for m in MODELS if m != "nli" or cfg.nli is not None]
    for dest, key, value in wide:
        for m in models:
            _refuse_clash(dest, f"{m}.{key}", items)
            flags[f"{dest}:{m}"] = (f"{m}.{key}={value}", f"option {_flag(dest)} {value}")
            overrides.append(f"{m}.{key}={value}")
    return _build(raw, overrides, source, flags)


def _refuse_clash(dest: str, key: str, items: Sequence[str]) -> None:
    """A flag and a KEY=VALUE item may not both set `key`: one of them would be dropped."""
    clash = [i for i in items if (lambda k: k == key or key.startswith(k + ".")
                                  or k.startswith(key + "."))(i.partition("=")[0].strip())]
    if clash:
        raise ConfigError(f"{_flag(dest)} and {clash[-1]!r} both set {key}; give one", key=key)


def _build(raw, overrides, source, flags) -> RewardConfig:
    """`build_root`, with errors naming the flag that set a key rather than its override."""
    try:
        return build_root(RewardConfig, raw, overrides, source=source)
    except ConfigError as e:
        message = str(e)
        for item, flag in flags.values():
            message = message.replace(f"override '{item}'", flag)
        raise ConfigError(message, key=e.key) from None


def reward_model_folders(cfg: RewardConfig) -> dict[str, str | None]:
    """key -> folder of each model (nli: None when there is no filter)."""
    return {"answerer.init": cfg.answerer.init, "fusion.init": cfg.fusion.init,
            "judge.model.init": cfg.judge.model.init,
            "nli.init": None if cfg.nli is None else cfg.nli.init}


def flag_of(key: str) -> str:
    """The flag that spells `key`, for messages ("--answerer"), else the key itself."""
    for dest, k in FLAG_KEYS.items():
        if k == key:
            return _flag(dest)
    return key
