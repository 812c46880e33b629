"""The NNX DeBERTa-v2/v3 against Hugging Face's PyTorch models on the same random weights.

Reference: transformers 5 `DebertaV2Model`, `DebertaV2ForSequenceClassification` and
`DebertaV2ForQuestionAnswering` (eval mode) on tiny random configs whose weights are redrawn with
std 0.2 (LayerNorm scales around 1), saved with `save_pretrained` (safetensors). Two configs:
* v2: separate position projections (`share_att_key` false), `position_biased_input`, token
  types, an embedding size below the hidden size (`embed_proj`), no log buckets and
  `max_relative_positions` 6, so relative distances of a 12-token batch are clamped;
* v3: `share_att_key`, `norm_rel_ebd: layer_norm`, no absolute positions, `position_buckets` 4
  with `max_relative_positions` 16, so distances beyond 2 fall into log buckets.
The batch is padded (rows of 12, 7 and 1 tokens); every position is compared, padding rows
included (Hugging Face's masked rows attend uniformly; ours must too).
Tolerance: 1e-4 absolute (measured ~1e-6).
"""
from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clarifyjax.models.deberta import (DebertaConfig, DebertaSequenceClassifier,
                                       log_bucket_positions)
from clarifyjax.models.hf.deberta_map import deberta_config_from_hf
from clarifyjax.models.hf import (load_deberta, load_deberta_sequence_classifier,
                                  load_question_answering)
from clarifyjax.models.safetensors_io import CheckpointError
from helpers.env import require
from helpers.encoder_builders import padded_batch, randomize

pytestmark = pytest.mark.usefixtures("full_float32_matmuls")

TOL = 1e-4
AGREED_AXES = {"vocab", "embed", "mlp", "heads", "kv", "classes", "relpos_buckets", None}

COMMON = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=48, max_position_embeddings=40, relative_attention=True,
              num_labels=3)
VARIANTS = {
    "v2": dict(COMMON, pos_att_type="p2c|c2p", share_att_key=False, position_biased_input=True,
               max_relative_positions=6, type_vocab_size=2, embedding_size=24),
    "v3": dict(COMMON, pos_att_type=["p2c", "c2p"], share_att_key=True,
               position_biased_input=False, max_relative_positions=16, position_buckets=4,
               norm_rel_ebd="layer_norm", type_vocab_size=0),
}
HEADS = ("DebertaV2Model", "DebertaV2ForSequenceClassification", "DebertaV2ForQuestionAnswering")


def save_reference(folder, head: str, **config):
    """A random Hugging Face model `head` with `config`, saved to `folder` (safetensors)."""
    transformers = require("transformers")
    if head == "DebertaV2ForQuestionAnswering":
        config = dict(config, num_labels=2)  # start and end
    model = randomize(getattr(transformers, head)(transformers.DebertaV2Config(**config)))
    model.save_pretrained(folder)
    assert (folder / "model.safetensors").exists()
    return model


def batch(config: dict):
    ids, mask = padded_batch(0, config["vocab_size"])
    types = np.zeros_like(ids)
    if config.get("type_vocab_size"):
        types[:, 5:] = 1
    return ids, mask, types


def torch_outputs(model, ids, mask, types):
    torch = require("torch")
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                     token_type_ids=torch.tensor(types))


@pytest.mark.reference
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_deberta_matches_pytorch_on_a_padded_batch(tmp_path, variant):
    """Hidden states, classification logits and QA start/end logits, one config per variant."""
    config = VARIANTS[variant]
    ids, mask, types = batch(config)
    args = (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    for head, loader in zip(HEADS, (load_deberta, load_deberta_sequence_classifier,
                                    load_question_answering)):
        reference = save_reference(tmp_path / head, head, **config)
        expected = torch_outputs(reference, ids, mask, types)
        model = loader(tmp_path / head)
        got = model(*args)
        if head == "DebertaV2Model":
            pairs = [(got, expected.last_hidden_state)]
            assert got.shape == (3, 12, 32)
            # padding changes nothing of the real tokens (a wrong mask would); jitted, this
            # shape is one program instead of each of its primitives compiled again eagerly
            alone = nnx.jit(lambda m, *a: m(*a))(model, *(a[1:2, :7] for a in args))
            assert np.abs(np.asarray(alone[0]) - np.asarray(got[1, :7])).max() < TOL
        elif head == "DebertaV2ForSequenceClassification":
            pairs = [(got, expected.logits)]
            assert got.shape == (3, 3)
        else:
            pairs = [(got[0], expected.start_logits), (got[1], expected.end_logits)]
        for ours, theirs in pairs:
            err = np.abs(np.asarray(ours) - theirs.numpy()).max()
            print(f"{variant} {head}: max |ours - torch| = {err:.2e}")
            assert err < TOL


@pytest.mark.reference
@pytest.mark.parametrize("change", [dict(pos_att_type="c2p"), dict(pos_att_type="p2c"),
                                    dict(relative_attention=False, pos_att_type=None),
                                    dict(share_att_key=True, pos_att_type="c2p",
                                         position_buckets=4, max_relative_positions=10)],
                         ids=["c2p", "p2c", "absolute_only", "shared_c2p_buckets"])
def test_other_switches_match_pytorch(tmp_path, change):
    """pos_att_type with a single term changes the scale (sqrt(3 k) -> sqrt(2 k)) and the
    projections that exist; no relative attention at all is BERT with DeBERTa's mask; a shared
    key with log buckets and c2p alone."""
    config = dict(VARIANTS["v2"], **change)
    ids, mask, types = batch(config)
    reference = save_reference(tmp_path, "DebertaV2Model", **config)
    got = load_deberta(tmp_path)(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    expected = torch_outputs(reference, ids, mask, types).last_hidden_state.numpy()
    assert np.abs(np.asarray(got) - expected).max() < TOL


@pytest.mark.reference
def test_log_buckets_equal_huggingface_for_every_distance():
    torch = require("torch")
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    relative = np.arange(-1100, 1101)
    for buckets, max_position in ((256, 512), (4, 16), (64, 128), (256, 1024)):
        expected = make_log_bucket_position(torch.tensor(relative), buckets, max_position)
        np.testing.assert_array_equal(log_bucket_positions(relative, buckets, max_position),
                                      expected.long().numpy(), err_msg=f"{buckets}/{max_position}")


def test_parameters_carry_agreed_logical_axes():
    config = deberta_config_from_hf(dict(VARIANTS["v2"], model_type="deberta-v2"))
    model = nnx.eval_shape(lambda: DebertaSequenceClassifier(config, nnx.Rngs(0)))
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    names = {path: tuple(var.get_metadata()["out_sharding"]) for path, var in flat.items()}
    for path, axes in names.items():
        assert len(axes) == flat[path].ndim and set(axes) <= AGREED_AXES, (path, axes)
    layer = ("encoder", "layers", 0, "attention")
    assert names[layer + ("pos_key", "kernel")] == ("embed", "heads", "kv")
    assert names[layer + ("output", "kernel")] == ("heads", "kv", "embed")
    assert names[("encoder", "rel_embeddings")] == ("relpos_buckets", "embed")
    assert names[("encoder", "embeddings", "word_embeddings", "embedding")] == ("vocab", "embed")
    assert names[("out_proj", "kernel")] == (None, "classes")


@pytest.mark.reference
def test_compute_dtype_and_jit(tmp_path):
    config = VARIANTS["v3"]
    reference = save_reference(tmp_path, "DebertaV2Model", **config)
    ids, mask, types = batch(config)
    expected = torch_outputs(reference, ids, mask, types).last_hidden_state.numpy()
    model = load_deberta(tmp_path, dtype="bfloat16", param_dtype="float32")
    assert model.rel_embeddings[...].dtype == jnp.float32
    out = nnx.jit(lambda m, i, k: m(i, k))(model, jnp.asarray(ids), jnp.asarray(mask))
    assert out.dtype == jnp.bfloat16
    assert np.abs(np.asarray(out, np.float32) - expected).max() < 0.15


# -- errors --------------------------------------------------------------------------------------

def _rewrite(folder, change):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors")


@pytest.mark.reference
def test_checkpoint_errors_name_the_tensor(tmp_path):
    save_reference(tmp_path, "DebertaV2Model", **VARIANTS["v2"])
    name = "encoder.layer.1.attention.self.pos_key_proj.weight"
    _rewrite(tmp_path, lambda t: t.__setitem__(name, np.zeros((32, 16), np.float32)))
    with pytest.raises(CheckpointError, match=rf"{name}.*\(32, 16\).*\(32, 32\)"):
        load_deberta(tmp_path)
    _rewrite(tmp_path, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=rf"missing.*{name}"):
        load_deberta(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    # The folder's pos_key_proj / pos_query_proj tensors contradict share_att_key: named.
    (tmp_path / "config.json").write_text(json.dumps({**config, "share_att_key": True,
                                                      "pos_att_type": "p2c"}))
    with pytest.raises(CheckpointError, match="does not account for.*pos_query_proj"):
        load_deberta(tmp_path)


@pytest.mark.parametrize("field,value,message", [
    ("model_type", "deberta", "'model_type' is 'deberta'"),
    ("conv_kernel_size", 3, "'conv_kernel_size'"),
    ("pos_att_type", "p2p|c2p", r"'pos_att_type' has \['p2p'\]"),
    ("norm_rel_ebd", "batch_norm", "'norm_rel_ebd'"),
    ("hidden_act", "mish", "'hidden_act'"),
    ("pooler_hidden_size", 16, "'pooler_hidden_size'"),
])
def test_unsupported_config_fields_are_named(field, value, message):
    with pytest.raises(CheckpointError, match=message):
        deberta_config_from_hf({**VARIANTS["v3"], "model_type": "deberta-v2", field: value})


def test_config_defaults_follow_huggingface():
    base = dict(model_type="deberta-v2", vocab_size=10, hidden_size=8, num_hidden_layers=1,
                num_attention_heads=2, intermediate_size=8, max_position_embeddings=16)
    config = deberta_config_from_hf(base)
    assert (config.relative_attention, config.position_biased_input, config.share_att_key,
            config.type_vocab_size, config.pos_att_type, config.embedding_size) == \
        (False, True, False, 0, (), 8)
    config = deberta_config_from_hf(dict(base, relative_attention=True))
    assert config.max_relative_positions == 16 and config.att_span == 16
    assert config.scale_factor == 1
    assert DebertaConfig(pos_att_type=("c2p",)).scale_factor == 2


SHARDED = """
import json
import numpy as np, jax, jax.numpy as jnp
from flax import nnx
from clarifyjax.files.child_result import write_result
from clarifyjax.models.hf import load_deberta_sequence_classifier
from clarifyjax.core.sharding import FSDP_RULES, MeshConfig, make_mesh, shard_batch
from helpers.read_spy import record_reads

folder, ids, mask = FOLDER, *json.loads(BATCH)
mesh = make_mesh(MeshConfig(data=2, fsdp=2, model=2))
reads = record_reads()
forward = nnx.jit(lambda m, i, k: m(i, k))
with jax.default_matmul_precision("highest"):
    single = load_deberta_sequence_classifier(folder)
    reads.clear()
    sharded = load_deberta_sequence_classifier(folder, mesh=mesh, rules=FSDP_RULES)
    ids, mask = np.array(ids, np.int32), np.array(mask, np.int32)
    one = np.asarray(forward(single, ids, mask))
    eight = np.asarray(forward(sharded, *shard_batch((ids, mask), mesh)))
query = sharded.encoder.layers[0].attention.query.kernel[...]
write_result({
    "diff": float(np.abs(one - eight).max()),
    "query_spec": [a for a in query.sharding.spec],
    "query_shards": sorted({tuple(s.data.shape) for s in query.addressable_shards}),
    "query_reads": sorted({shape for name, shape, _ in reads
                           if name.endswith("layer.0.attention.self.query_proj.weight")}),
})
"""


@pytest.mark.reference
@pytest.mark.child
@pytest.mark.slow  # a child with 8 fake devices: ~15 s on 2 busy cores
def test_sharded_load_on_8_devices_equals_one_device(tmp_path):
    """FSDP rules on a (2, 2, 2) mesh: each device reads only its slice of a sharded tensor, and
    the classifier's logits equal the single-device ones."""
    from helpers.children import run_with_fake_devices

    config = dict(VARIANTS["v2"], vocab_size=96)
    save_reference(tmp_path, "DebertaV2ForSequenceClassification", **config)
    ids, mask = padded_batch(0, 96)
    ids, mask = np.concatenate([ids, ids[::-1]] * 2)[:8], np.concatenate([mask, mask[::-1]] * 2)[:8]
    argv = json.dumps([ids.tolist(), mask.tolist()])
    result = run_with_fake_devices(f"FOLDER, BATCH = {str(tmp_path)!r}, {argv!r}\n" + SHARDED)
    assert result["diff"] < 1e-5, result
    assert result["query_spec"] == ["fsdp", "model"], result  # [embed, heads, kv]
    assert result["query_shards"] == [[16, 2, 8]], result
    assert result["query_reads"] == [[16, 16]], result  # of torch [h*k, d] = [32, 32]: a quarter
