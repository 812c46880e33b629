"""Hand-made broken safetensors files and config.json values: each is refused when the file is
opened, by one `CheckpointError` (a ValueError, which both CLIs print as one line) naming the file
and, where there is one, the tensor or the field; never a MemoryError or a bare reshape error."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from clarifyjax.models.safetensors_io import (CheckpointError, SafetensorsFile, TensorSource,
                                             safetensors_bytes, write_checkpoint)


def _file(header, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file with any header (a dict is JSON-encoded) and data section."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(head) if length is None else length
    return struct.pack("<Q", n) + head + data


def _entry(dtype="F32", shape=(2, 3), offsets=(0, 24)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


GOOD = safetensors_bytes({"w": np.ones((2, 3), np.float32), "b": np.zeros(4, np.float16)})

# (id, file bytes, what the message must say besides the path)
BROKEN = [
    ("empty", b"", "shorter than the 8-byte header length"),
    ("shorter_than_8_bytes", b"\x01\x02\x03", "shorter than the 8-byte header length"),
    ("header_length_past_the_end", _file({"w": _entry()}, bytes(24), length=2 ** 62),
     "header length 4611686018427387904 exceeds"),
    ("header_length_one_past_the_end", _file(b"{}", length=3), "header length 3 exceeds"),
    ("header_not_utf8", _file(b"\xff\xfe{not json"), "header is not JSON"),
    ("header_not_json", _file(b"{'w': 1}"), "header is not JSON"),
    ("header_a_list", _file([1, 2, 3]), "is a JSON list, not an object"),
    ("entry_not_an_object", _file({"w": 5}), "tensor 'w': header entry is 5"),
    ("unknown_dtype", _file({"w": _entry(dtype="F8_E4M3")}, bytes(24)),
     "tensor 'w' has unsupported dtype 'F8_E4M3'"),
    ("negative_dim", _file({"w": _entry(shape=(-2, 3))}, bytes(24)), "tensor 'w': shape [-2, 3]"),
    ("shape_not_a_list", _file({"w": {"dtype": "F32", "shape": "2x3", "data_offsets": [0, 24]}},
                               bytes(24)), "tensor 'w': shape '2x3'"),
    ("offsets_not_a_pair", _file({"w": _entry(offsets=(0,))}, bytes(24)),
     "tensor 'w': data_offsets [0] is not [begin, end]"),
    ("begin_after_end", _file({"w": _entry(offsets=(24, 0))}, bytes(24)),
     "tensor 'w': data_offsets [24, 0] lie outside"),
    ("truncated_data", GOOD[:-5], "tensor 'w': data_offsets [8, 32] lie outside the 27 data bytes"),
    ("size_not_shape_times_itemsize", _file({"w": _entry(offsets=(0, 20))}, bytes(24)),
     "tensor 'w': 20 data bytes, but shape [2, 3] of F32 needs 24"),
    ("overlapping_tensors", _file({"a": _entry(offsets=(0, 24)), "b": _entry(offsets=(16, 40))},
                                  bytes(40)), "tensor 'b' overlaps tensor 'a'"),
]


def test_the_good_file_reads(tmp_path):
    (tmp_path / "good.safetensors").write_bytes(GOOD)
    f = SafetensorsFile(tmp_path / "good.safetensors")
    np.testing.assert_array_equal(f.array("w"), np.ones((2, 3), np.float32))
    assert f.shape("b") == (4,)


@pytest.mark.parametrize("name, data, expected", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_file_is_one_checkpoint_error_naming_file_and_tensor(tmp_path, name, data,
                                                                    expected):
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as e:
        SafetensorsFile(path)
    assert isinstance(e.value, ValueError)  # what clarifyjax / sage_jax CLIs print as one line
    assert str(path) in str(e.value) and expected in str(e.value)
    assert "\n" not in str(e.value)


def test_broken_model_safetensors_in_a_folder_fails_when_the_folder_opens(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(GOOD[:-5])
    with pytest.raises(CheckpointError, match="model.safetensors: tensor 'w'"):
        TensorSource(tmp_path)


def test_index_naming_the_wrong_file_names_file_and_tensor(tmp_path):
    write_checkpoint(tmp_path, {"w": np.ones((2, 3), np.float32)}, {})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w": "model.safetensors", "v": "model.safetensors"}}))
    source = TensorSource(tmp_path)
    with pytest.raises(CheckpointError, match=r"model.safetensors: no tensor 'v' in this file"):
        source.get("v")


# --------------------------------------------------------------------------- config.json


T5_BAD = [("layer_norm_epsilon", float("nan")), ("layer_norm_epsilon", 0.0),
          ("dropout_rate", float("inf")), ("dropout_rate", -0.1), ("initializer_factor", -1.0),
          ("d_model", 0), ("num_heads", -4), ("d_ff", 2.5), ("vocab_size", "600"),
          ("eos_token_id", [1, -1])]


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory):
    from helpers.tiny_models import tiny_t5_folder

    return tiny_t5_folder(tmp_path_factory.mktemp("t5"))


@pytest.mark.parametrize("field, value", T5_BAD, ids=[f"{f}={v}" for f, v in T5_BAD])
def test_t5_config_json_numbers_are_checked(t5_folder, tmp_path, field, value):
    from clarifyjax.models.hf import load_t5

    folder = tmp_path / "t5"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(t5_folder / "model.safetensors")
    hf = json.loads((t5_folder / "config.json").read_text())
    hf[field] = value
    (folder / "config.json").write_text(json.dumps(hf))  # NaN / Infinity as Python writes them
    with pytest.raises(CheckpointError) as e:
        load_t5(folder)
    message = str(e.value)
    assert str(folder / "config.json") in message and repr(field.split("[")[0]) in message
    assert "\n" not in message


ENCODER_BAD = [("layer_norm_eps", float("nan")), ("layer_norm_eps", -1e-5),
               ("hidden_dropout_prob", 1.0), ("initializer_range", float("-inf")),
               ("hidden_size", 0), ("num_hidden_layers", -1)]


@pytest.mark.parametrize("field, value", ENCODER_BAD, ids=[f"{f}={v}" for f, v in ENCODER_BAD])
def test_encoder_config_json_numbers_are_checked(tmp_path, field, value):
    from clarifyjax.models.hf.encoder_map import read_encoder_config

    hf = {"model_type": "roberta", "vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 40,
          "layer_norm_eps": 1e-5, "hidden_dropout_prob": 0.1, "initializer_range": 0.02}
    read_encoder_config(write_checkpoint(tmp_path, {}, hf))  # the good one reads
    write_checkpoint(tmp_path, {}, {**hf, field: value})
    with pytest.raises(CheckpointError) as e:
        read_encoder_config(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value) and repr(field) in str(e.value)
