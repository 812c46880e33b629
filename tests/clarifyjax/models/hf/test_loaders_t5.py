"""Hugging Face checkpoint folders <-> our T5: round trips through PyTorch, and bad input.

Round trip: torch model -> save_pretrained -> load_t5 -> save_t5 -> torch from_pretrained: the
tensors come back bit-identical, so the logits are identical (exact equality), and load_t5 of
the folder we wrote gives back the same NNX parameters (exact equality).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from flax import nnx

from helpers.env import require
from helpers.t5_builders import HF_TINY as TINY, make_hf_t5, padded_batch

from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.models.hf import load_t5, save_t5
from clarifyjax.models.hf.t5_map import t5_tensor_maps
from clarifyjax.models.t5 import T5Config


def torch_state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def nnx_params(model) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def assert_same_logits(a, b):
    torch = require("torch")
    rng = np.random.RandomState(0)
    ids, mask = padded_batch(rng, [9, 4], TINY["vocab_size"])
    dec, dec_mask = padded_batch(rng, [6, 3], TINY["vocab_size"])
    with torch.no_grad():
        outs = [m(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                  decoder_input_ids=torch.tensor(dec),
                  decoder_attention_mask=torch.tensor(dec_mask)).logits.numpy() for m in (a, b)]
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.reference
@pytest.mark.parametrize("family", ["v1.0", "v1.1"])
def test_save_t5_round_trips_through_pytorch(family, tmp_path):
    transformers = require("transformers")
    original = make_hf_t5(tmp_path / "hf", family)
    config, model = load_t5(tmp_path / "hf")
    save_t5(model, config, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == "t5"
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(
        str(tmp_path / "ours")).eval()
    before, after = torch_state(original), torch_state(reloaded)
    assert set(before) == set(after)
    for name in before:
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)
    assert reloaded.config.scale_decoder_outputs == original.config.scale_decoder_outputs
    assert_same_logits(original, reloaded)
    # ... and back again
    config2, model2 = load_t5(tmp_path / "ours")
    assert config2 == config
    p1, p2 = nnx_params(model), nnx_params(model2)
    assert p1.keys() == p2.keys()
    for path in p1:
        np.testing.assert_array_equal(p1[path], p2[path], err_msg=str(path))


@pytest.mark.reference
def test_sharded_safetensors_index(tmp_path):
    torch_model = make_hf_t5(tmp_path / "one", "v1.1")
    torch_model.save_pretrained(str(tmp_path / "many"), safe_serialization=True,
                                max_shard_size="20KB")
    assert (tmp_path / "many" / "model.safetensors.index.json").exists()
    assert not (tmp_path / "many" / "model.safetensors").exists()
    _, single = load_t5(tmp_path / "one")
    config, sharded = load_t5(tmp_path / "many")
    assert not config.tie_word_embeddings
    p1, p2 = nnx_params(single), nnx_params(sharded)
    for path in p1:
        np.testing.assert_array_equal(p1[path], p2[path], err_msg=str(path))


@pytest.mark.reference
def test_pickle_refused_unless_allowed(tmp_path):
    torch = require("torch")
    torch_model = make_hf_t5(tmp_path / "hf", "v1.0")
    folder = tmp_path / "bin"
    folder.mkdir()
    shutil.copy(tmp_path / "hf" / "config.json", folder / "config.json")
    torch.save(torch_model.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*allow_pickle=True"):
        load_t5(folder)
    _, from_pickle = load_t5(folder, allow_pickle=True)
    _, from_safetensors = load_t5(tmp_path / "hf")
    p1, p2 = nnx_params(from_pickle), nnx_params(from_safetensors)
    for path in p1:
        np.testing.assert_array_equal(p1[path], p2[path], err_msg=str(path))


@pytest.fixture
def hf_folder(tmp_path):
    make_hf_t5(tmp_path / "hf", "v1.1")
    return tmp_path / "hf"


def rewrite_tensors(folder, change):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="not found.*nowhere"):
        load_t5(tmp_path / "nowhere")


def test_no_weights_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(T5Config(**TINY).to_hf()))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_t5(tmp_path)


@pytest.mark.reference
def test_unknown_feed_forward_proj(hf_folder):
    cfg = json.loads((hf_folder / "config.json").read_text())
    cfg["feed_forward_proj"] = "swiglu-x"
    (hf_folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError,
                       match=r"config\.json.*feed_forward_proj.*swiglu-x.*allowed.*gated-gelu"):
        load_t5(hf_folder)


@pytest.mark.reference
def test_wrong_shape_names_tensor_and_both_shapes(hf_folder):
    name = "decoder.block.1.layer.1.EncDecAttention.k.weight"

    def change(t):
        t[name] = t[name][:-6]  # one head fewer: [18, 32] instead of [24, 32]

    rewrite_tensors(hf_folder, change)
    with pytest.raises(CheckpointError, match=rf"{name}.*\(18, 32\).*\(24, 32\)"):
        load_t5(hf_folder)


@pytest.mark.reference
def test_missing_tensor_is_named(hf_folder):
    name = "encoder.block.1.layer.1.DenseReluDense.wi_1.weight"
    rewrite_tensors(hf_folder, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=rf"missing.*{name}"):
        load_t5(hf_folder)


@pytest.mark.reference
def test_family_mismatch_is_reported(hf_folder):
    """A gated checkpoint read with feed_forward_proj "relu": wi is missing (named)."""
    cfg = json.loads((hf_folder / "config.json").read_text())
    cfg["feed_forward_proj"] = "relu"
    (hf_folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"missing.*DenseReluDense\.wi\.weight"):
        load_t5(hf_folder)


@pytest.mark.reference
def test_unexpected_tensor_is_reported(hf_folder):
    rewrite_tensors(hf_folder, lambda t: t.update({"encoder.block.9.layer.0.layer_norm.weight":
                                                   np.ones(32, np.float32)}))
    with pytest.raises(CheckpointError, match=r"encoder\.block\.9"):
        load_t5(hf_folder)


@pytest.mark.reference
def test_redundant_copies_are_ignored(hf_folder):
    """transformers 4 wrote encoder/decoder.embed_tokens copies; they are not errors."""
    rewrite_tensors(hf_folder, lambda t: t.update({
        "encoder.embed_tokens.weight": t["shared.weight"],
        "decoder.embed_tokens.weight": t["shared.weight"]}))
    config, _ = load_t5(hf_folder)
    assert not config.tie_word_embeddings


def test_tensor_maps_cover_every_parameter_once():
    for ff, tie in [("relu", True), ("gated-gelu", False)]:
        config = T5Config(**{**TINY, "feed_forward_proj": ff, "tie_word_embeddings": tie})
        maps = t5_tensor_maps(config)
        names = [tm.hf_name for tm in maps.values()]
        assert len(names) == len(set(names))
        per_layer = 8 if ff == "relu" else 9  # norm, q, k, v, o, norm, wi (or wi_0, wi_1), wo
        assert len([n for n in names if n.startswith("encoder.block.0.")]) == per_layer + 1  # + bias
        assert ("lm_head",) in maps or tie


@pytest.mark.reference
def test_save_t5_rejects_a_different_config(hf_folder, tmp_path):
    config, model = load_t5(hf_folder)
    other = T5Config(**{**TINY, "feed_forward_proj": "relu"})
    with pytest.raises(ValueError, match="feed_forward_proj"):
        save_t5(model, other, tmp_path / "out")


@pytest.mark.reference
def test_bfloat16_params_save_as_float32(hf_folder, tmp_path):
    transformers = require("transformers")
    config, model = load_t5(hf_folder, dtype="bfloat16")
    save_t5(model, config, tmp_path / "out")
    cfg_back, back = load_t5(tmp_path / "out")
    assert cfg_back.param_dtype == "float32"
    p16, p32 = nnx_params(model), nnx_params(back)
    for path in p16:
        np.testing.assert_array_equal(p16[path].astype(np.float32), p32[path])
    transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "out"))


@pytest.mark.reference
def test_bfloat16_checkpoint_roundtrip(hf_folder, tmp_path):
    """Released T5 checkpoints are often bfloat16: we write them, PyTorch reads them, we read them."""
    torch = require("torch")
    transformers = require("transformers")
    config, model = load_t5(hf_folder, dtype="bfloat16")
    save_t5(model, config, tmp_path / "bf16", dtype="bfloat16")
    cfg_back, back = load_t5(tmp_path / "bf16", dtype="bfloat16")
    p_a, p_b = nnx_params(model), nnx_params(back)
    for path in p_a:
        np.testing.assert_array_equal(p_a[path], p_b[path])
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "bf16"))
    assert theirs.shared.weight.dtype == torch.bfloat16
