"""The run-config schema refuses what would be meaningless or ignored, at load time.

* every numeric field of every section has a declared range; NaN, infinity and out-of-range
  values are refused naming the key and the file or the override;
* every leaf of every shipped config is either consumed (changing it changes the runtime object
  it configures) or refused by the loader with a message naming the key;
* the NLI threshold has one default, shared by the YAML configs and the CLI.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re
import typing

import numpy as np
import pytest

from clarifyjax import config as config_lib
from clarifyjax.config import ConfigError, PPOConfig, SFTConfig, load_config
from clarifyjax.configlib import numeric_fields, read_yaml, within
from conftest import REPO_ROOT

CONFIGS = sorted((REPO_ROOT / "configs").glob("*.yaml"))
EXAMPLE = {"sft": REPO_ROOT / "configs" / "sft_question_tiny.yaml",
           "ppo": REPO_ROOT / "configs" / "ppo_tiny.yaml"}


def _sections(cls, at=""):
    """(key path, dataclass) of every section reachable from `cls`, absent optional ones too."""
    yield at, cls
    for name, tp in typing.get_type_hints(cls).items():
        if name.startswith("_"):
            continue
        for arg in (typing.get_args(tp) or (tp,)):
            if dataclasses.is_dataclass(arg):
                yield from _sections(arg, f"{at}.{name}" if at else name)


def _join(at, name):
    return f"{at}.{name}" if at else name


def _out_of_range(bound: str, is_int: bool) -> list:
    """Values that `bound` refuses (NaN / infinities too, for a float field)."""
    probes = [-1e9, -1, 0, 0.5, 1, 1.5, 2, 2 ** 31, 1e9]
    bad = [v for v in probes if not within(v, bound) and (not is_int or float(v).is_integer())]
    bad = [int(v) if is_int else float(v) for v in bad]
    return bad + ([] if is_int else [float("nan"), float("inf"), float("-inf")])


def _numeric_keys(kind):
    for at, cls in _sections(config_lib.KINDS[kind]):
        hints = typing.get_type_hints(cls)
        for name in numeric_fields(cls):
            yield _join(at, name), cls._bounds[name], int in typing.get_args(hints[name]) + (
                hints[name],)


@pytest.mark.parametrize("kind", sorted(config_lib.KINDS))
def test_every_numeric_field_declares_a_range(kind):
    for at, cls in _sections(config_lib.KINDS[kind]):
        missing = [n for n in numeric_fields(cls) if n not in getattr(cls, "_bounds", {})]
        assert not missing, f"{cls.__name__} ({at or 'top'}): no _bounds for {missing}"


@pytest.mark.parametrize("kind", sorted(config_lib.KINDS))
def test_meaningless_numbers_are_refused_naming_key_and_override(kind):
    checked, raw = 0, read_yaml(EXAMPLE[kind])  # load_config, with the YAML parsed once
    for key, bound, is_int in _numeric_keys(kind):
        for value in _out_of_range(bound, is_int):
            item = f"{key}={value}"
            with pytest.raises(ConfigError) as e:
                config_lib.config_from_dict(raw, [item], source=str(EXAMPLE[kind]))
            message = str(e.value)
            assert f"override '{item}'" in message and EXAMPLE[kind].name in message, message
            assert key in message.replace(f"override '{item}'", ""), message
            checked += 1
    assert checked > (60 if kind == "sft" else 120)


@pytest.mark.parametrize("key, text", [("optimizer.lr", ".inf"), ("normalizer.bias", ".nan"),
                                       ("ppo.gamma", ".nan"), ("optimizer.eps", "0"),
                                       ("ppo.clip", "0"), ("mesh.fsdp", "0"),
                                       ("normalizer.gain", "-4.0"), ("run.seed", "-1")])
def test_meaningless_numbers_in_a_file_name_the_file_and_key(tmp_path, key, text):
    section, name = key.split(".")
    extra = "\n  fit: false" if section == "normalizer" else ""
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {EXAMPLE['ppo']}\n{section}:\n  {name}: {text}{extra}\n")
    with pytest.raises(ConfigError, match=rf"bad\.yaml: {re.escape(key)} = .*: must be"):
        load_config(bad)


# --------------------------------------------------------------------------- one NLI default


def test_nli_threshold_has_one_default():
    import inspect

    from clarifyjax import cli, nli, reward_pipeline

    parser = cli.build_parser()
    args = parser.parse_args(["score-questions", "--situations", "s", "--questions", "q",
                              "--answerer", "a", "--fusion", "f", "--judge", "j", "--out", "o"])
    defaults = {"config.RewardConfig": config_lib.RewardConfig().nli_threshold,
                "PipelineConfig": reward_pipeline.PipelineConfig().nli_threshold,
                "NLIFilter": inspect.signature(nli.NLIFilter).parameters["threshold"].default,
                "NLIFilter.from_pretrained": inspect.signature(
                    nli.NLIFilter.from_pretrained).parameters["threshold"].default,
                "cli --nli-threshold": args.nli_threshold}
    assert set(defaults.values()) == {config_lib.NLI_THRESHOLD}, defaults


def test_yaml_rewards_and_cli_flags_build_the_same_pipeline_config(tmp_path):
    """A `rewards:` section left at its defaults and `score-questions` without reward flags: one
    PipelineConfig (and so one NLI decision), through `PipelineConfig.from_options` both."""
    from clarifyjax import cli
    from clarifyjax.reward_pipeline import PipelineConfig

    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("kind: ppo\npolicy: p\nrewards:\n  answerer: a\n  fusion: f\n"
                         "  judge:\n    model: j\n  nli: n\n")
    from_yaml = PipelineConfig.from_reward_config(load_config(yaml_file).rewards)
    args = cli.build_parser().parse_args([
        "score-questions", "--situations", "s", "--questions", "q", "--answerer", "a",
        "--fusion", "f", "--judge", "j", "--nli", "n", "--out", "o"])
    assert cli.pipeline_config(args) == from_yaml
    # and the options that both have keep meaning the same when set
    yaml_file.write_text(yaml_file.read_text() + "  nli_threshold: 0.7\n"
                         "  answer_temperature: 0.5\n  dropped_answer: resample\n")
    args = cli.build_parser().parse_args([
        "score-questions", "--situations", "s", "--questions", "q", "--answerer", "a",
        "--fusion", "f", "--judge", "j", "--nli", "n", "--out", "o", "--nli-threshold", "0.7",
        "--answer-temperature", "0.5", "--dropped-answer", "resample"])
    assert cli.pipeline_config(args) == PipelineConfig.from_reward_config(
        load_config(yaml_file).rewards)
