"""The NNX BERT / RoBERTa encoder against Hugging Face's PyTorch models on the same random weights.

Reference: transformers 5 `BertModel` / `RobertaModel` (eval mode), tiny random configs whose
weights are redrawn with std 0.2 (so that a wrong transpose or mask shows far above the
tolerance), saved with `save_pretrained` (safetensors) and loaded by `load_encoder`.
Tolerance: 1e-4 absolute on every position of the last hidden state (measured ~1e-6).
"""
from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clarifyjax.core.buckets import bucket_length, bucket_rows, length_sorted_batches, pad_sequences
from clarifyjax.models.safetensors_io import CheckpointError
from clarifyjax.models.encoder import (EncoderConfig, SequenceClassifier,
                                       roberta_position_ids)
from clarifyjax.models.hf import load_encoder, load_question_answering, load_sequence_classifier
from helpers.encoder_builders import padded_batch, randomize
from helpers.env import require

pytestmark = pytest.mark.usefixtures("full_float32_matmuls")

TOL = 1e-4
AGREED_AXES = {"vocab", "embed", "mlp", "heads", "kv", "classes", None}


def hf_config(model_type: str, **extra):
    transformers = require("transformers")
    cls = transformers.BertConfig if model_type == "bert" else transformers.RobertaConfig
    values = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=48, max_position_embeddings=40)
    if model_type == "roberta":
        values.update(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    values.update(extra)
    return cls(**values)


def save_hf(model, folder):
    model.save_pretrained(folder)  # transformers 5 writes model.safetensors
    assert (folder / "model.safetensors").exists()
    return folder


def torch_hidden(model, ids, mask, types=None):
    torch = require("torch")
    kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    if types is not None:
        kwargs["token_type_ids"] = torch.tensor(types)
    with torch.no_grad():
        return model(**kwargs).last_hidden_state.numpy()


@pytest.mark.reference
@pytest.mark.parametrize("model_type,hidden_act", [("bert", "gelu"), ("roberta", "gelu"),
                                                   ("bert", "gelu_new"), ("roberta", "relu")])
def test_encoder_matches_pytorch_with_padding(tmp_path, model_type, hidden_act):
    transformers = require("transformers")
    config = hf_config(model_type, hidden_act=hidden_act)
    reference = randomize(transformers.AutoModel.from_config(config))
    save_hf(reference, tmp_path)
    ours = load_encoder(tmp_path)
    ids, mask = padded_batch(config.pad_token_id, config.vocab_size)
    types = None
    if model_type == "bert":  # exercise the token-type table too
        types = np.zeros_like(ids)
        types[:, 5:] = 1
    expected = torch_hidden(reference, ids, mask, types)
    got = np.asarray(ours(jnp.asarray(ids), jnp.asarray(mask),
                          None if types is None else jnp.asarray(types)))
    assert got.shape == expected.shape == (3, 12, 32)
    err = np.abs(got - expected).max()
    print(f"{model_type}/{hidden_act}: max |ours - torch| = {err:.2e}")
    assert err < TOL
    # A wrong mask would change the unpadded rows; check they are unaffected by padding too.
    alone = np.asarray(ours(jnp.asarray(ids[1:2, :7]), jnp.asarray(mask[1:2, :7]),
                            None if types is None else jnp.asarray(types[1:2, :7])))
    assert np.abs(alone[0] - got[1, :7]).max() < TOL


@pytest.mark.reference
@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_question_answering_head_matches_pytorch(tmp_path, model_type):
    """`...ForQuestionAnswering` (qa_outputs -> start / end logits) on a padded batch."""
    transformers = require("transformers")
    config = hf_config(model_type, num_labels=2)
    reference = randomize(transformers.AutoModelForQuestionAnswering.from_config(config))
    save_hf(reference, tmp_path)
    ids, mask = padded_batch(config.pad_token_id, config.vocab_size)
    torch = require("torch")
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    start, end = load_question_answering(tmp_path)(jnp.asarray(ids), jnp.asarray(mask))
    assert start.shape == end.shape == (3, 12)
    assert np.abs(np.asarray(start) - expected.start_logits.numpy()).max() < TOL
    assert np.abs(np.asarray(end) - expected.end_logits.numpy()).max() < TOL


@pytest.mark.reference
def test_jit_with_split_merge_and_nnx_jit_agree(tmp_path):
    transformers = require("transformers")
    config = hf_config("roberta")
    save_hf(randomize(transformers.AutoModel.from_config(config)), tmp_path)
    model = load_encoder(tmp_path)
    ids, mask = padded_batch(1, config.vocab_size)
    eager = model(jnp.asarray(ids), jnp.asarray(mask))
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, ids, mask):
        return nnx.merge(graphdef, state)(ids, mask)

    np.testing.assert_allclose(forward(state, ids, mask), eager, atol=1e-5)
    np.testing.assert_allclose(nnx.jit(lambda m, i, k: m(i, k))(model, ids, mask), eager, atol=1e-5)


@pytest.mark.reference
def test_roberta_position_ids_match_huggingface():
    torch = require("torch")
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    ids = np.array([[0, 5, 6, 2, 1, 1], [0, 7, 2, 1, 1, 1], [0, 5, 6, 7, 8, 2]])
    expected = RobertaEmbeddings.create_position_ids_from_input_ids(torch.tensor(ids), 1).numpy()
    np.testing.assert_array_equal(np.asarray(roberta_position_ids(jnp.asarray(ids), 1)), expected)


@pytest.mark.reference
def test_prefixed_and_unprefixed_names_load_the_same_trunk(tmp_path):
    transformers = require("transformers")
    config = hf_config("bert", num_labels=3)
    classifier = randomize(transformers.BertForSequenceClassification(config))
    save_hf(classifier, tmp_path / "cls")  # names "bert.encoder...", "classifier..."
    save_hf(classifier.bert, tmp_path / "bare")  # names "encoder..."
    ids, mask = padded_batch(0, config.vocab_size)
    a = load_encoder(tmp_path / "cls")(jnp.asarray(ids), jnp.asarray(mask))
    b = load_encoder(tmp_path / "bare")(jnp.asarray(ids), jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(a), torch_hidden(classifier.bert, ids, mask), atol=TOL)


def test_parameters_carry_agreed_logical_axes():
    config = EncoderConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=4,
                           intermediate_size=24, max_position_embeddings=20, labels=("a", "b"))
    model = nnx.eval_shape(lambda: SequenceClassifier(config, nnx.Rngs(0)))  # metadata only
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    names = {path: tuple(var.get_metadata()["out_sharding"]) for path, var in flat.items()}
    for path, axes in names.items():
        assert len(axes) == flat[path].ndim, path
        assert set(axes) <= AGREED_AXES, (path, axes)
    assert names[("encoder", "embeddings", "word_embeddings", "embedding")] == ("vocab", "embed")
    assert names[("encoder", "layers", 0, "attention", "query", "kernel")] == ("embed", "heads", "kv")
    assert names[("encoder", "layers", 0, "attention", "output", "kernel")] == ("heads", "kv", "embed")
    assert names[("encoder", "layers", 0, "mlp", "wi", "kernel")] == ("embed", "mlp")
    assert names[("out_proj", "kernel")] == (None, "classes")


@pytest.mark.reference
def test_parameter_and_compute_dtypes_are_separate(tmp_path):
    """bfloat16 compute over float32 parameters agrees with PyTorch's float32 to bfloat16's
    precision; bfloat16 parameters with float32 compute give float32 outputs (their dtype read
    from jax's abstract evaluation of the same call, which compiles nothing)."""
    transformers = require("transformers")
    config = hf_config("bert")
    reference = randomize(transformers.AutoModel.from_config(config))
    save_hf(reference, tmp_path)
    ids, mask = padded_batch(0, config.vocab_size)
    expected = torch_hidden(reference, ids, mask)
    mixed = load_encoder(tmp_path, dtype="bfloat16", param_dtype="float32")
    assert mixed.embeddings.word_embeddings.embedding[...].dtype == jnp.float32
    out = nnx.jit(lambda m, i, k: m(i, k))(mixed, jnp.asarray(ids), jnp.asarray(mask))
    assert out.dtype == jnp.bfloat16
    # bfloat16 has 8 mantissa bits: LayerNorm'd activations of size ~1 agree to a few 1e-2.
    assert np.abs(np.asarray(out, np.float32) - expected).max() < 0.15
    stored = load_encoder(tmp_path, dtype="float32", param_dtype="bfloat16")
    assert stored.layers[0].mlp.wi.kernel[...].dtype == jnp.bfloat16
    out = nnx.eval_shape(lambda m, i, k: m(i, k), stored, jnp.asarray(ids), jnp.asarray(mask))
    assert out.dtype == jnp.float32


# -- checkpoint errors ---------------------------------------------------------------------------

def _write_bert(tmp_path):
    transformers = require("transformers")
    return save_hf(randomize(transformers.AutoModel.from_config(hf_config("bert"))), tmp_path)


@pytest.mark.reference
def test_missing_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = _write_bert(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["encoder.layer.1.output.dense.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.1\.output\.dense\.weight.*missing"):
        load_encoder(folder)


@pytest.mark.reference
def test_wrong_shape_names_tensor_and_both_shapes(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = _write_bert(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["encoder.layer.0.attention.self.key.weight"] = np.zeros((32, 16), np.float32)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        load_encoder(folder)
    assert "encoder.layer.0.attention.self.key.weight" in str(e.value)
    assert "(32, 16)" in str(e.value) and "(32, 32)" in str(e.value)


@pytest.mark.reference
def test_unsupported_model_type_and_pickles_are_refused(tmp_path):
    folder = _write_bert(tmp_path / "a")
    pickled = tmp_path / "b"
    pickled.mkdir()
    shutil.copy(folder / "config.json", pickled / "config.json")
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match="pickle"):
        load_encoder(pickled)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"a/config.json.*'gpt2'.*bert and roberta"):
        load_encoder(folder)


def test_config_errors_name_the_field():
    base = dict(model_type="bert", vocab_size=10, hidden_size=8, num_hidden_layers=1,
                num_attention_heads=2, intermediate_size=8, max_position_embeddings=16)
    with pytest.raises(CheckpointError, match="'num_attention_heads'"):
        EncoderConfig.from_hf({k: v for k, v in base.items() if k != "num_attention_heads"})
    with pytest.raises(CheckpointError, match="hidden_act.*'mish'"):
        EncoderConfig.from_hf({**base, "hidden_act": "mish"})
    with pytest.raises(CheckpointError, match="position_embedding_type"):
        EncoderConfig.from_hf({**base, "position_embedding_type": "relative_key"})
    cfg = EncoderConfig.from_hf({**base, "id2label": {"1": "b", "0": "a"}})
    assert cfg.labels == ("a", "b")


@pytest.mark.reference
def test_load_sequence_classifier_requires_labels(tmp_path):
    folder = _write_bert(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.pop("id2label", None), config.pop("label2id", None), config.pop("num_labels", None)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="sequence-classification"):
        load_sequence_classifier(folder)


# -- batching helpers ----------------------------------------------------------------------------

def test_bucketing_helpers():
    assert [bucket_length(n, cap=256) for n in (1, 16, 17, 64, 65, 200, 256)] == \
        [16, 16, 32, 64, 128, 256, 256]
    assert bucket_length(90, cap=100) == 100 and bucket_length(20, cap=24) == 24
    assert [bucket_rows(n, 64) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert bucket_rows(7, 6) == 6
    batches = length_sorted_batches([5, 1, 4, 2, 3], 2)
    assert [b.tolist() for b in batches] == [[1, 3], [4, 2], [0]]
    np.testing.assert_array_equal(pad_sequences([[1, 2], [3]], 3, 4, 9),
                                  [[1, 2, 9, 9], [3, 9, 9, 9], [9, 9, 9, 9]])
