"""Run configs: every file in configs/ loads, overrides coerce types, bad keys/values are clear errors."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from clarifyjax.config import (ConfigError, ModelConfig, PPOConfig, SFTConfig, config_from_dict,
                               config_to_dict, dump_config, load_config, save_config)
from helpers.env import REPO_ROOT

CONFIGS = sorted((REPO_ROOT / "configs").glob("*.yaml"))
SFT_TASKS = {"question", "wh_question", "answerer", "fusion", "judge", "discriminator"}


def test_config_folder_is_complete():
    names = {p.stem for p in CONFIGS}
    for task in ("question", "wh_question", "answerer", "fusion", "judge"):
        assert f"sft_{task}" in names and f"sft_{task}_tiny" in names
    assert {"ppo_t5_large", "ppo_tiny"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads_and_round_trips(path, tmp_path):
    cfg = load_config(path)
    assert isinstance(cfg, (SFTConfig, PPOConfig))
    assert cfg.run.name == path.stem  # one run folder per config
    # dict -> config, YAML text -> config, and a saved file -> config are all the same config
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert config_from_dict(yaml.safe_load(dump_config(cfg))) == cfg
    assert load_config(save_config(cfg, tmp_path / "copy.yaml")) == cfg
    if isinstance(cfg, SFTConfig):
        assert cfg.task in SFT_TASKS
    if path.stem.endswith("_tiny"):  # CPU runs: small random models or the tiny SFT outputs
        models = [cfg.model] if isinstance(cfg, SFTConfig) else [cfg.policy]
        for m in models:
            assert m.tiny is not None or "tiny" in m.init
            assert m.dtype == "float32"


def test_paper_hyperparameters_in_t5_large_config():
    """docs/originals.md (ClarifyDelphi) and the paper's App. A.4."""
    cfg = load_config(REPO_ROOT / "configs" / "ppo_t5_large.yaml")
    p = cfg.ppo
    assert cfg.run.steps == 6000
    assert (p.batch_size, p.epochs, p.clip, p.value_clip, p.vf_coef) == (64, 4, 0.2, 0.2, 1.0)
    # 29 new tokens: the original's max_length=30 counted the start token (docs/fidelity.md)
    assert (p.gamma, p.lam, p.kl_coef, p.sampling.max_new_tokens) == (1.0, 0.95, 0.15, 29)
    s = p.sampling
    assert (s.temperature, s.top_p, s.top_k, p.whiten_rewards) == (0.7, 0.6, 0, True)
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.schedule) == ("adam", 1e-5,
                                                                               "constant")
    assert (cfg.normalizer.gain, cfg.normalizer.bias) == (4.0725, -0.45726)
    assert cfg.mesh.rules == "fsdp" and cfg.mesh.fsdp > 1
    assert cfg.policy.dtype == "bfloat16" and cfg.policy.param_dtype == "float32"
    assert cfg.rewards.judge.class_tokens == ("-1", "0", "1")
    assert cfg.reference is None and cfg.value.model is None


def test_base_files_merge_and_tiny_ppo_inherits_the_paper_settings():
    large = load_config(REPO_ROOT / "configs" / "ppo_t5_large.yaml")
    tiny = load_config(REPO_ROOT / "configs" / "ppo_tiny.yaml")
    assert tiny.ppo.batch_size == 16 and tiny.ppo.minibatches == 2
    assert dataclasses.replace(tiny.ppo, batch_size=64, minibatches=1) == large.ppo
    assert tiny.rewards.nli is None and large.rewards.nli is not None
    # a nested mapping is merged key by key: the tiny run keeps the base's other settings
    assert tiny.rewards.judge.input_prefix == large.rewards.judge.input_prefix == "[moral_single]: "
    assert tiny.rewards.answerer.max_input_length == 64 and tiny.ppo.sampling.max_new_tokens == 29


def test_overrides_coerce_to_field_types():
    cfg = load_config(REPO_ROOT / "configs" / "ppo_tiny.yaml", [
        "ppo.batch_size=8", "optimizer.lr=3e-4", "ppo.adaptive_kl=true", "run.name=x",
        "data.length_buckets=[8,16]", "mesh.rules=fsdp", "rewards.dropped_answer=resample",
        "rewards.nli=pretrained/wanli", "rewards.nli.max_input_length=64", "data.dev_path=null",
        "data.dev_situations=500",  # the default: no dev file, so no dev count
        "ppo.vf_coef=2", "policy.tiny.vocab_size=500", "policy.init=null",
    ])
    assert cfg.ppo.batch_size == 8 and isinstance(cfg.ppo.batch_size, int)
    assert cfg.optimizer.lr == 3e-4 and isinstance(cfg.optimizer.lr, float)
    assert cfg.ppo.adaptive_kl is True and cfg.run.name == "x"
    assert cfg.data.length_buckets == (8, 16) and cfg.data.dev_path is None
    assert cfg.mesh.rules == "fsdp" and cfg.rewards.dropped_answer == "resample"
    assert cfg.rewards.nli == ModelConfig(init="pretrained/wanli", max_input_length=64)
    assert cfg.ppo.vf_coef == 2.0 and isinstance(cfg.ppo.vf_coef, float)
    # a section that was absent starts from its defaults
    assert cfg.policy.init is None and cfg.policy.tiny.vocab_size == 500
    assert cfg.policy.tiny.d_model == 64
    # comma lists work too
    cfg = load_config(REPO_ROOT / "configs" / "sft_question_tiny.yaml",
                      ["data.length_buckets=16,48", "run.steps=1e3"])
    assert cfg.data.length_buckets == (16, 48) and cfg.run.steps == 1000


def test_unknown_key_in_override_names_key_file_and_valid_keys():
    path = REPO_ROOT / "configs" / "ppo_tiny.yaml"
    with pytest.raises(ConfigError) as e:
        load_config(path, ["ppo.lr_rate=1e-5"])
    msg = str(e.value)
    assert "ppo.lr_rate" in msg and "ppo_tiny.yaml" in msg
    assert "batch_size" in msg and "kl_coef" in msg  # the valid keys under ppo
    with pytest.raises(ConfigError, match="unknown key 'bogus'.*valid keys at the top level"):
        load_config(path, ["bogus=1"])
    with pytest.raises(ConfigError, match="not a section"):
        load_config(path, ["ppo.batch_size.x=1"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(path, ["ppo.batch_size"])


def test_unknown_key_in_file_names_key_file_and_valid_keys(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: %s\nppo:\n  batchsize: 8\n" % (REPO_ROOT / "configs" / "ppo_tiny.yaml"))
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    msg = str(e.value)
    assert "bad.yaml" in msg and "'ppo.batchsize'" in msg and "batch_size" in msg
    bad.write_text("kind: sft\nmodel:\n  tiny:\n    widht: 3\n")
    with pytest.raises(ConfigError, match=r"model\.tiny\.widht.*d_model"):
        load_config(bad)


@pytest.mark.parametrize("override, expected", [
    ("ppo.batch_size=eight", "'ppo.batch_size': 'eight' is not int"),
    ("ppo.batch_size=1.5", "'ppo.batch_size': '1.5' is not int"),
    ("optimizer.lr=fast", "'optimizer.lr': 'fast' is not float"),
    ("ppo.adaptive_kl=maybe", "'ppo.adaptive_kl': 'maybe' is not bool"),
    ("mesh.rules=zero3", "'mesh.rules': 'zero3' is not one of 'default', 'fsdp'"),
    ("data.length_buckets=[8,x]", "'data.length_buckets[1]': 'x' is not int"),
])
def test_bad_override_value_names_key_value_and_type(override, expected):
    with pytest.raises(ConfigError) as e:
        load_config(REPO_ROOT / "configs" / "ppo_tiny.yaml", [override])
    assert expected in str(e.value)
    assert override in str(e.value)  # the error says which override


def test_bad_values_in_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ppo\nppo:\n  epochs: [4]\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*'ppo.epochs': \[4\] is not int"):
        load_config(bad)
    bad.write_text("kind: ppo\nppo:\n  adaptive_kl: 1.5\n")
    with pytest.raises(ConfigError, match="'ppo.adaptive_kl': 1.5 is not bool"):
        load_config(bad)
    bad.write_text("kind: dpo\n")
    with pytest.raises(ConfigError, match="'kind' must be one of"):
        load_config(bad)
    bad.write_text("kind: ppo\nppo: [1\n")
    with pytest.raises(ConfigError, match="YAML syntax error at line"):
        load_config(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_cross_field_checks():
    path = REPO_ROOT / "configs" / "ppo_tiny.yaml"
    with pytest.raises(ConfigError, match="minibatches = 3 does not divide ppo.batch_size = 16"):
        load_config(path, ["ppo.minibatches=3"])
    with pytest.raises(ConfigError, match="exactly one of 'init'"):
        load_config(path, ["policy.tiny.d_model=32"])  # init is still set
    with pytest.raises(ConfigError, match=r"override 'ppo.sampling.top_p=1.5'.*top_p: must be a "
                                          r"number in \(0, 1\], got 1.5"):
        load_config(path, ["ppo.sampling.top_p=1.5"])
    with pytest.raises(ConfigError, match="ppo.sampling.temperature = 0 .greedy.: the rollouts "
                                          "must sample"):
        load_config(path, ["ppo.sampling.temperature=0"])
    with pytest.raises(ConfigError, match="ppo.logprobs = sampling needs untruncated rollouts, "
                                          "but ppo.sampling has top_k 0, top_p 0.6"):
        load_config(path, ["ppo.logprobs=sampling"])
    h = load_config(path, ["ppo.logprobs=sampling", "ppo.sampling.top_p=1.0"]).ppo
    assert h.logprob_temperature == 0.7 and load_config(path).ppo.logprob_temperature == 1.0
    with pytest.raises(ConfigError, match="ppo.sampling.stop = .* is not used"):
        load_config(path, ["ppo.sampling.stop=?"])
    with pytest.raises(ConfigError, match="at most one axis may be -1"):
        load_config(path, ["mesh.fsdp=-1"])


def test_base_cycle_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")


def test_tiny_spec_maps_onto_the_model_configs():
    from clarifyjax.models import t5
    cfg = load_config(REPO_ROOT / "configs" / "sft_question_tiny.yaml")
    t5_config = t5.T5Config(**cfg.model.tiny.t5_kwargs())
    assert (t5_config.d_model, t5_config.d_kv, t5_config.num_heads) == (64, 16, 4)
    from clarifyjax.models.encoder import EncoderConfig

    enc = EncoderConfig(**cfg.model.tiny.encoder_kwargs())
    assert (enc.hidden_size, enc.num_layers) == (64, 2)


def test_a_sampling_section_given_in_part_keeps_the_other_defaults(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(f"base: {REPO_ROOT / 'configs' / 'ppo_tiny.yaml'}\nppo:\n  sampling:\n"
                    "    top_k: 5\n")
    s = load_config(path, ["ppo.sampling.temperature=1.5"]).ppo.sampling
    assert (s.max_new_tokens, s.temperature, s.top_k, s.top_p) == (29, 1.5, 5, 0.6)
    assert load_config(path, ["ppo.sampling.top_p=null"]).ppo.sampling.top_p == 0.6


def test_an_old_key_names_its_new_place(tmp_path):
    path = REPO_ROOT / "configs" / "ppo_tiny.yaml"
    for old, new in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                     ("max_question_length", "max_new_tokens")):
        with pytest.raises(ConfigError, match=rf"^override 'ppo.{old}=1' .*: ppo.{old}: moved to "
                                              rf"ppo.sampling.{new}$"):
            load_config(path, [f"ppo.{old}=1"])
    bad = tmp_path / "old.yaml"
    bad.write_text(f"base: {path}\nppo:\n  temperature: 0.9\n")
    with pytest.raises(ConfigError, match=r"old.yaml: ppo.temperature: moved to "
                                          r"ppo.sampling.temperature$"):
        load_config(bad)
