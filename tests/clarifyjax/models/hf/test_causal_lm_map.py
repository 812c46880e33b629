"""Issue 26, item 3: rotary settings in a decoder-only config.json are checked when it is read.

A `rope_theta` of 0, a negative one or "abc", a scaling `factor` of 0, a llama3 high frequency
factor at or below the low one: each would load and make every rotary angle NaN or infinite (the
model writes garbage, `generate` empty completions). Each is refused with one line that names the
file and the field as config.json writes it, in either layout (transformers 5's
`rope_parameters`, the older top-level `rope_theta` + `rope_scaling`); good settings load with
their values. The command refuses such a folder with exit status 2 before generating.
"""
from __future__ import annotations

import json
import math
import re

import pytest

from clarifyjax import cli
from clarifyjax.models.causal_lm import CausalLMConfig
from clarifyjax.models.hf import load_causal_lm
from clarifyjax.models.hf.causal_lm_map import config_from_hf
from clarifyjax.models.safetensors_io import CheckpointError
from helpers.tiny_models import tiny_llama_folder

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 128}
NEW = {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
FALCON = {"model_type": "falcon", "vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4,
          "num_hidden_layers": 2, "alibi": False}


def _params(**change):
    return {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, **change}}


def _llama3(**change):
    return {"rope_parameters": {**LLAMA3, **change}}


def _scaling(**scaling):
    return {"rope_theta": 10000.0, "rope_scaling": scaling}


# (config.json fields over LLAMA, the field the refusal must name)
BAD = [
    (_params(rope_theta=0), "rope_parameters.rope_theta"),
    (_params(rope_theta=-10000.0), "rope_parameters.rope_theta"),
    (_params(rope_theta="abc"), "rope_parameters.rope_theta"),
    (_params(rope_theta="10000"), "rope_parameters.rope_theta"),
    (_params(rope_theta=float("nan")), "rope_parameters.rope_theta"),
    (_params(rope_theta=float("inf")), "rope_parameters.rope_theta"),
    (_params(rope_theta=True), "rope_parameters.rope_theta"),
    (_params(rope_theta=None), "rope_parameters.rope_theta"),
    (_params(rope_theta=[10000.0]), "rope_parameters.rope_theta"),
    ({"rope_theta": 0}, "rope_theta"),
    ({"rope_theta": -1}, "rope_theta"),
    ({"rope_theta": "abc"}, "rope_theta"),
    ({"rope_theta": float("-inf")}, "rope_theta"),
    (_scaling(type="linear", factor=0), "rope_scaling.factor"),
    (_scaling(type="linear", factor=-2.0), "rope_scaling.factor"),
    (_scaling(type="linear", factor=0.5), "rope_scaling.factor"),
    (_scaling(type="linear", factor="2"), "rope_scaling.factor"),
    (_scaling(type="linear", factor=float("nan")), "rope_scaling.factor"),
    (_scaling(type="linear"), "'factor'"),
    (_scaling(type="dynamic", factor=2.0), "rope_scaling.type"),
    (_params(rope_type="linear", factor=0.0), "rope_parameters.factor"),
    (_params(rope_type="yarn", factor=2.0), "rope_parameters.rope_type"),
    (_llama3(factor=0), "rope_parameters.factor"),
    (_llama3(factor=-8.0), "rope_parameters.factor"),
    (_llama3(low_freq_factor=0), "rope_parameters.low_freq_factor"),
    (_llama3(high_freq_factor=-4.0), "rope_parameters.high_freq_factor"),
    (_llama3(high_freq_factor=1.0), "rope_parameters.high_freq_factor"),  # == low: 0 / 0
    (_llama3(high_freq_factor=0.5), "rope_parameters.high_freq_factor"),  # < low
    (_llama3(original_max_position_embeddings=0), "rope_parameters.original_max_position_"),
    (_llama3(original_max_position_embeddings=8192.5), "rope_parameters.original_max_position_"),
    (_llama3(original_max_position_embeddings="8192"), "rope_parameters.original_max_position_"),
    (_llama3(low_freq_factor="abc"), "rope_parameters.low_freq_factor"),
    ({"rope_parameters": "default"}, "rope_parameters"),
    ({"rope_parameters": [10000.0]}, "rope_parameters"),
    ({"rope_scaling": 2.0}, "rope_scaling"),
    (_params(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (_params(partial_rotary_factor="abc"), "partial_rotary_factor"),
]


@pytest.mark.parametrize("model_type", ["llama", "falcon"])
def test_every_bad_rotary_setting_names_the_file_and_field(model_type):
    base = LLAMA if model_type == "llama" else FALCON
    for fields, field in BAD:
        with pytest.raises(CheckpointError) as e:
            config_from_hf({**base, **fields}, "/models/m/config.json")
        text = str(e.value)
        assert "\n" not in text and text.startswith("/models/m/config.json: "), text
        assert field in text, (fields, text)


def test_good_rotary_settings_load_with_their_values():
    default = config_from_hf({**LLAMA, **NEW}, "c.json")
    assert (default.rope_type, default.rope_theta) == ("default", 10000.0)
    assert config_from_hf(LLAMA, "c.json").rope_theta == 10000.0  # transformers' default
    old = config_from_hf({**LLAMA, "rope_theta": 500000}, "c.json")
    assert old.rope_theta == 500000.0 and isinstance(old.rope_theta, float)
    linear = config_from_hf({**LLAMA, **_scaling(type="linear", factor=1)}, "c.json")
    assert (linear.rope_type, linear.rope_factor) == ("linear", 1.0)
    llama3 = config_from_hf({**LLAMA, **_llama3()}, "c.json")
    assert (llama3.rope_theta, llama3.rope_factor, llama3.rope_high_freq_factor,
            llama3.rope_original_max_positions) == (500000.0, 8.0, 4.0, 8192)
    # rope_parameters wins over the older fields, as transformers reads them
    both = config_from_hf({**LLAMA, "rope_theta": 0.5, **_params(rope_theta=20000.0)}, "c.json")
    assert both.rope_theta == 20000.0


def test_the_config_itself_refuses_bad_rotary_values():
    base = dict(model_type="llama", vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
                num_kv_heads=1, head_dim=4, ffn_size=8)
    for change in (dict(rope_theta=0.0), dict(rope_theta=-1.0), dict(rope_theta=math.nan),
                   dict(rope_theta="abc"), dict(rope_type="linear", rope_factor=0.0),
                   dict(rope_type="llama3", rope_low_freq_factor=2.0, rope_high_freq_factor=2.0),
                   dict(rope_type="llama3", rope_original_max_positions=0)):
        with pytest.raises(ValueError, match=r"causal LM config.*rope"):
            CausalLMConfig(**base, **change)
    assert CausalLMConfig(**base, positions="learned", rope_theta=0.0).rope_theta == 0.0  # unread


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama_folder(tmp_path_factory, seed=3)


def _with(folder, tmp_path, change: dict):
    bad = tmp_path / "model"
    bad.mkdir()
    for f in folder.iterdir():
        (bad / f.name).symlink_to(f)
    config = json.loads((folder / "config.json").read_text())
    (bad / "config.json").unlink()
    (bad / "config.json").write_text(json.dumps({**config, **change}))
    return bad


@pytest.mark.reference
@pytest.mark.e2e
def test_a_saved_folder_with_a_bad_theta_is_refused_by_the_loader_and_the_command(
        llama, tmp_path, capsys):
    config = json.loads((llama / "config.json").read_text())
    assert "rope_parameters" in config  # transformers 5's layout, as the issue's folder
    bad = _with(llama, tmp_path, {"rope_parameters": {**config["rope_parameters"],
                                                       "rope_theta": 0}})
    with pytest.raises(CheckpointError, match=re.escape(f"{bad / 'config.json'}: field "
                                                        "'rope_parameters.rope_theta' is 0;")):
        load_causal_lm(bad)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 0, "prompt": "hello"}\n')
    out = tmp_path / "out.jsonl"
    status = cli.main(["generate", str(bad), "--input", str(prompts), "--out", str(out),
                       "--max-new-tokens", "4", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.count("\n") == 0, err
    assert "rope_parameters.rope_theta" in err and not out.exists()
