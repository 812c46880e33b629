"""The safetensors reader/writer against the `safetensors` package itself (and bfloat16)."""
import ml_dtypes
import numpy as np
import pytest
from helpers.env import require

from clarifyjax.models.safetensors_io import (CheckpointError, SafetensorsFile, TensorSource,
                                             safetensors_bytes, write_checkpoint)


def _tensors():
    rng = np.random.default_rng(0)
    return {"a.weight": rng.normal(size=(5, 7)).astype(np.float32),
            "b.bias": rng.normal(size=(3,)).astype(np.float16),
            "c.ids": rng.integers(-5, 5, size=(2, 3, 4)).astype(np.int64),
            "d.flag": np.array([True, False])}


@pytest.mark.reference
def test_our_bytes_read_by_safetensors_and_back(tmp_path):
    st = require("safetensors.numpy")
    tensors = _tensors()
    data = safetensors_bytes(tensors)
    theirs = st.load(data)
    assert set(theirs) == set(tensors)
    for k, v in tensors.items():
        np.testing.assert_array_equal(theirs[k], v)
        assert theirs[k].dtype == v.dtype
    # and their bytes read by us
    (tmp_path / "x.safetensors").write_bytes(st.save(tensors))
    f = SafetensorsFile(tmp_path / "x.safetensors")
    for k, v in tensors.items():
        np.testing.assert_array_equal(f.array(k), v)


@pytest.mark.reference
def test_bfloat16_roundtrip_and_slices(tmp_path):
    torch = require("torch")
    from safetensors.torch import load_file

    w = np.random.default_rng(1).normal(size=(8, 6)).astype(ml_dtypes.bfloat16)
    write_checkpoint(tmp_path, {"w": w}, {"model_type": "t5"})
    src = TensorSource(tmp_path)
    np.testing.assert_array_equal(src.get("w"), w)
    assert src.get("w").dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(src.get_slice("w", (slice(2, 4), slice(None))), w[2:4])
    # PyTorch reads the same bf16 values
    t = load_file(str(tmp_path / "model.safetensors"))["w"]
    assert t.dtype == torch.bfloat16
    np.testing.assert_array_equal(t.float().numpy(), w.astype(np.float32))


def test_corrupt_file_is_a_clear_error(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        TensorSource(tmp_path)
