"""The run-config schema refuses what would be meaningless or ignored, at load time.

* every numeric field of every section has a declared range; NaN, infinity and out-of-range
  values are refused naming the key and the file or the override;
* every leaf of every shipped config is either consumed (changing it changes the runtime object
  it configures) or refused by the loader with a message naming the key;
* the NLI threshold has one default, shared by the YAML configs and the CLI.
"""
from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from clarifyjax import config
from clarifyjax.config import ConfigError, load_config
from clarifyjax.config.loader import numeric_fields, read_yaml, within
from helpers.env import REPO_ROOT

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
    for at, cls in _sections(config.KINDS[kind]):
        hints = typing.get_type_hints(cls)
        for name in numeric_fields(cls):
            yield _join(at, name), cls._bounds[name], int in typing.get_args(hints[name]) + (
                hints[name],)


@pytest.mark.parametrize("kind", sorted(config.KINDS))
def test_every_numeric_field_declares_a_range(kind):
    for at, cls in _sections(config.KINDS[kind]):
        missing = [n for n in numeric_fields(cls) if n not in getattr(cls, "_bounds", {})]
        assert not missing, f"{cls.__name__} ({at or 'top'}): no _bounds for {missing}"


@pytest.mark.parametrize("kind", sorted(config.KINDS))
def test_meaningless_numbers_are_refused_naming_key_and_override(kind):
    checked, raw = 0, read_yaml(EXAMPLE[kind])  # load_config, with the YAML parsed once
    for key, bound, is_int in _numeric_keys(kind):
        for value in _out_of_range(bound, is_int):
            item = f"{key}={value}"
            with pytest.raises(ConfigError) as e:
                config.config_from_dict(raw, [item], source=str(EXAMPLE[kind]))
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


@pytest.mark.parametrize("kind", sorted(config.KINDS))
def test_a_warmup_longer_than_the_run_is_refused_naming_both_keys(kind):
    item = "run.steps=4"
    with pytest.raises(ConfigError, match=r"override 'optimizer.warmup_steps=5'.*: "
                                          r"optimizer.warmup_steps: 5 is more than run.steps 4; "
                                          r"the learning rate would never reach optimizer.lr"):
        load_config(EXAMPLE[kind], ["optimizer.warmup_steps=5", item])
    assert load_config(EXAMPLE[kind], ["optimizer.warmup_steps=4", item]).run.steps == 4


@pytest.mark.parametrize("kind", sorted(config.KINDS))
def test_a_dev_file_that_is_the_train_file_is_refused(kind, tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("id\tsituation\n")
    with pytest.raises(ConfigError, match=rf"data.dev_path: {tmp_path}/./train.tsv is the same file as "
                                          rf"data.train_path \({train}\); the run would be evaluated on its "
                                          "training data"):
        load_config(EXAMPLE[kind], [f"data.train_path={train}", f"data.dev_path={tmp_path}/./train.tsv"])


# --------------------------------------------------------------------------- one NLI default


def test_nli_threshold_has_one_default():
    import inspect

    from clarifyjax import cli


    from clarifyjax.reward import nli

    from clarifyjax.reward import pipeline

    from clarifyjax.config import score
    args = cli.parse_args(["score-questions", "--situations", "s", "--questions", "q",
                           "--answerer", "a", "--fusion", "f", "--judge", "j", "--nli", "n",
                           "--out", "o"])
    defaults = {"config.RewardConfig": config.RewardConfig().nli_threshold,
                "PipelineConfig": pipeline.PipelineConfig().nli_threshold,
                "NLIFilter": inspect.signature(nli.NLIFilter).parameters["threshold"].default,
                "NLIFilter.from_pretrained": inspect.signature(
                    nli.NLIFilter.from_pretrained).parameters["threshold"].default,
                "cli --nli-threshold": score.reward_config(args).nli_threshold}
    assert set(defaults.values()) == {config.NLI_THRESHOLD}, defaults


def _score_args(*extra):
    from clarifyjax import cli

    return cli.parse_args(["score-questions", "--situations", "s", "--questions", "q",
                           "--out", "o", *map(str, extra)])


def test_yaml_rewards_and_cli_flags_build_the_same_reward_config(tmp_path):
    """A `rewards:` section left at its defaults and `score-questions` without reward flags: one
    RewardConfig (so one pipeline and one NLI decision); and the flags, a --config file (the
    section alone or a whole PPO config) and KEY=VALUE items mean the same keys."""
    from clarifyjax.config.score import reward_config

    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("kind: ppo\npolicy: p\nrewards:\n  answerer: a\n  fusion: f\n"
                         "  judge:\n    model: j\n  nli: n\n")
    from_yaml = load_config(yaml_file).rewards
    models = ["--answerer", "a", "--fusion", "f", "--judge", "j", "--nli", "n"]
    assert reward_config(_score_args(*models)) == from_yaml
    assert reward_config(_score_args(*models)).pipeline == from_yaml.pipeline == config.PipelineConfig()
    assert reward_config(_score_args("--config", yaml_file)) == from_yaml
    section = tmp_path / "rewards.yaml"
    section.write_text("answerer: a\nfusion: f\njudge: {model: j}\nnli: n\n")
    assert reward_config(_score_args("--config", section)) == from_yaml
    # the options that set keys keep meaning the same when set
    yaml_file.write_text(yaml_file.read_text() + "  nli_threshold: 0.7\n"
                         "  answer_temperature: 0.5\n  dropped_answer: resample\n"
                         "  max_question_words: 9\n  use_judgment_text: false\n  answerer:\n"
                         "    init: a\n    dtype: bfloat16\n")
    from_yaml = load_config(yaml_file).rewards
    flags = reward_config(_score_args(
        *models, "--nli-threshold", "0.7", "--answer-temperature", "0.5", "--dropped-answer",
        "resample", "--max-question-words", "9", "--no-judgment-text", "answerer.dtype=bfloat16"))
    assert flags == from_yaml
    items = reward_config(_score_args(
        "answerer=a", "fusion=f", "judge.model=j", "nli=n", "nli_threshold=0.7",
        "answer_temperature=0.5", "dropped_answer=resample", "max_question_words=9",
        "use_judgment_text=false", "answerer.dtype=bfloat16"))
    assert items == from_yaml


@pytest.mark.e2e
def test_score_questions_config_and_overrides_reach_the_pipeline(tmp_path, monkeypatch, capsys):
    """``score-questions --config x.yaml KEY=VALUE``: the pipeline is built from that RewardConfig;
    a bad key, or a flag and an item on one key, is one line naming it, before any model loads."""
    from clarifyjax import cli

    from clarifyjax.reward import pipeline
    built = []

    def load_pipeline(rewards, **kwargs):
        built.append(rewards)
        raise cli.CLIError("stop before the models")

    monkeypatch.setattr(pipeline, "load_pipeline", load_pipeline)
    for name in ("a", "f", "j"):
        (tmp_path / name).mkdir()
    (tmp_path / "s.txt").write_text("lying to a friend\n")
    (tmp_path / "q.txt").write_text("why?\n")
    config = tmp_path / "rewards.yaml"
    config.write_text(f"answerer: {tmp_path / 'a'}\nfusion: {tmp_path / 'f'}\n"
                      f"judge: {{model: {tmp_path / 'j'}}}\nfusion_max_length: 20\n")
    argv = ["score-questions", "--situations", tmp_path / "s.txt", "--questions",
            tmp_path / "q.txt", "--out", tmp_path / "o.jsonl", "--config", config]

    def run(*extra):
        status = cli.main([str(a) for a in argv + list(extra)])
        return status, capsys.readouterr().err.strip()

    status, err = run("answer_temperature=0.5", "answer_top_p=0.9", "--resample-k", "3",
                      "--dropped-answer", "resample")
    assert status == 2 and "stop before the models" in err
    settings = built[-1].pipeline
    assert (settings.answer_temperature, settings.answer_top_p, settings.fusion_max_length,
            settings.resample_k, settings.resampling_temperature) == (0.5, 0.9, 20, 3, 0.5)
    assert built[-1].answerer.init == str(tmp_path / "a")
    n = len(built)
    for extra, names in [
            (["answer_temprature=0.5"], ["unknown key 'answer_temprature'", str(config)]),
            (["answer_top_p=0.9"], ["answer_top_p", "answer_temperature is 0"]),
            (["--answer-temperature", "0.5", "answer_temperature=0.7"],
             ["--answer-temperature", "answer_temperature=0.7", "give one"]),
            (["--resample-k", "3"], ["--resample-k 3", "dropped_answer is not resample"])]:
        status, err = run(*extra)
        assert status == 2 and len(err.splitlines()) == 1, err
        assert all(name in err for name in names), (names, err)
    assert len(built) == n  # refused before any model was asked for


def test_each_setting_is_declared_once():
    """The YAML sections that lower modules consume are those modules' own dataclasses (or extend
    them): one default and one range per setting, no copy to keep in step."""
    from clarifyjax.rl import ppo

    from clarifyjax.training import programs
    from clarifyjax.reward import pipeline
    from clarifyjax.core import sharding
    assert issubclass(config.PPOHyperparams, ppo.PPOUpdateConfig)
    h = config.PPOHyperparams()
    for f in dataclasses.fields(ppo.PPOUpdateConfig):
        assert getattr(h, f.name) == f.default, f.name
    assert set(ppo.PPOUpdateConfig._bounds.items()) <= set(config.PPOHyperparams._bounds.items())
    assert not hasattr(programs, "ppo_hyperparams")  # the update takes the section itself
    assert config.MeshLayout is sharding.MeshConfig
    assert pipeline.PipelineConfig is config.PipelineConfig
    assert issubclass(config.RewardConfig, config.PipelineConfig)
    assert not hasattr(config.PipelineConfig, "from_reward_config")
    # every pipeline setting is a rewards: key, with its range
    pipeline_fields = {f.name for f in dataclasses.fields(config.PipelineConfig)}
    assert pipeline_fields <= {f.name for f in dataclasses.fields(config.RewardConfig)}
    assert {"answer_top_p", "fusion_temperature", "resample_temperature", "dropped_reward",
            "max_question_words", "use_judgment_text"} <= pipeline_fields




def test_score_questions_judge_kind_as_the_flags_always_gave_it(tmp_path):
    """With no file or item naming the judge's kind, a --judge classifier folder (config.json
    model_type roberta) is an encoder judge read without the T5 prefix, as the flags always
    meant; a kind the config gives wins."""
    from clarifyjax.config.score import reward_config

    judge = tmp_path / "judge"
    judge.mkdir()
    (judge / "config.json").write_text('{"model_type": "roberta"}')
    models = ["--answerer", "a", "--fusion", "f", "--judge", judge]
    cfg = reward_config(_score_args(*models, "--encoder-labels", "neg,neu,pos"))
    assert (cfg.judge.kind, cfg.judge.input_prefix, cfg.judge.encoder_labels) == (
        "encoder", "", ("neg", "neu", "pos"))
    cfg = reward_config(_score_args(*models, "judge.kind=t5"))
    assert (cfg.judge.kind, cfg.judge.input_prefix) == ("t5", config.JudgeConfig().input_prefix)
