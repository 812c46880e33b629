"""Our NNX T5 against PyTorch transformers 5 `T5ForConditionalGeneration` on the same weights.

Tiny random models of both families are built in torch with a seed, written with
`save_pretrained(..., safe_serialization=True)` and read back with our `load_t5`. Tolerances:
float32 logits within 1e-4 (measured ~1e-5), log-probs within 1e-4, greedy tokens identical.
Configs use num_decoder_layers != num_layers and d_kv * num_heads != d_model.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers.env import require
from helpers.t5_builders import HF_TINY as TINY
from helpers.t5_builders import make_hf_t5, padded_batch, random_t5

from clarifyjax.decoding import generate, score
from clarifyjax.models.hf import load_t5
from clarifyjax.models.t5 import T5Config
from clarifyjax.models.t5_layers import relative_position_bucket

LOGIT_TOL = 1e-4

# Jitted calls: eager NNX dispatches (and compiles) op by op, far slower on a shared 2-core box.
forward = nnx.jit(lambda model, *args: model(*args))
encode_decode = nnx.jit(lambda model, ids, mask, dec: model.decode(
    dec, model.encode(ids, mask), mask, return_hidden=True))


@pytest.fixture(scope="module", params=["v1.0", "v1.1"])
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    torch_model = make_hf_t5(folder, request.param)
    config, model = load_t5(folder)
    return request.param, folder, torch_model, config, model


def torch_logits(torch_model, ids, mask, dec_ids, dec_mask=None):
    torch = require("torch")
    with torch.no_grad():
        out = torch_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                          decoder_input_ids=torch.tensor(dec_ids),
                          decoder_attention_mask=None if dec_mask is None
                          else torch.tensor(dec_mask))
    return out.logits.numpy()


@pytest.mark.reference
def test_config_family_is_read_correctly(pair):
    family, _, torch_model, config, model = pair
    check_family(family, torch_model, config, model)


def check_family(family, torch_model, config, model):
    assert config.tie_word_embeddings == (family != "v1.1")
    assert config.scale_decoder_outputs == (family == "v1.0")
    assert config.scale_decoder_outputs == torch_model.config.scale_decoder_outputs
    assert hasattr(model, "lm_head") == (family == "v1.1")
    assert config.num_decoder_layers == 3 != config.num_layers
    assert config.d_kv * config.num_heads != config.d_model


@pytest.mark.reference
def test_transformers5_tied_v11_checkpoint(tmp_path):
    """gated-gelu, one shared matrix, no rescale: what transformers 5 writes for tie=False."""
    family = "v1.1-tied-by-transformers5"
    torch_model = make_hf_t5(tmp_path, family)
    config, model = load_t5(tmp_path)
    check_family(family, torch_model, config, model)
    check_forward(torch_model, config, model)


@pytest.mark.reference
def test_forward_matches_transformers(pair):
    _, _, torch_model, config, model = pair
    check_forward(torch_model, config, model)


def check_forward(torch_model, config, model):
    """Full forward pass, padding in both encoder and decoder masks; all positions compared."""
    rng = np.random.RandomState(1)
    ids, mask = padded_batch(rng, [23, 9, 17, 1], config.vocab_size)  # > max_distance: log buckets
    dec_ids, dec_mask = padded_batch(rng, [21, 5, 12, 2], config.vocab_size)
    dec_ids[:, 0] = config.decoder_start_token_id
    expected = torch_logits(torch_model, ids, mask, dec_ids, dec_mask)
    got = np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(dec_ids),
                             jnp.asarray(dec_mask)))
    assert got.shape == expected.shape == (4, 21, config.vocab_size)
    assert got.dtype == np.float32
    assert np.abs(got - expected).max() <= LOGIT_TOL, np.abs(got - expected).max()
    # the decoder without a mask (causal only) and return_hidden
    expected = torch_logits(torch_model, ids, mask, dec_ids)
    logits, hidden = encode_decode(model, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(dec_ids))
    assert hidden.shape == (4, 21, config.d_model)
    assert np.abs(np.asarray(logits) - expected).max() <= LOGIT_TOL


@pytest.mark.reference
def test_greedy_generation_matches_transformers(pair):
    family, folder, torch_model, config, _ = pair
    torch = require("torch")
    rng = np.random.RandomState(2)
    lengths = [3, 20, 7, 12, 1, 15, 9, 4, 18, 6, 11, 2, 14, 8, 5, 16]  # 16 prompts, mixed lengths
    ids, mask = padded_batch(rng, lengths, config.vocab_size)
    max_new = 10

    def hf_generate(eos):
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        # transformers 5.23 sizes its default cache by num_layers (the encoder's), which breaks
        # generate when num_decoder_layers > num_layers: hand it a cache that grows per layer.
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        with torch.no_grad():
            out = torch_model.generate(input_ids=torch.tensor(ids), past_key_values=cache,
                                       attention_mask=torch.tensor(mask), do_sample=False,
                                       num_beams=1, max_new_tokens=max_new, eos_token_id=eos,
                                       pad_token_id=config.pad_token_id)
        return out.numpy()[:, 1:]  # drop the decoder start token

    # Make EOS a token this random model actually emits, so that rows stop at different steps.
    probe = hf_generate(config.eos_token_id)
    values, counts = np.unique(probe[probe > 1], return_counts=True)
    eos = int(values[np.argmax(counts)])
    expected = hf_generate(eos)
    _, model = load_t5(folder)
    model.config = dataclasses.replace(model.config, eos_token_id=eos)
    got = generate(model, jnp.asarray(ids), jnp.asarray(mask), rng=None, max_new_tokens=max_new,
                   greedy=True)
    tokens = np.asarray(got.tokens)
    n = expected.shape[1]
    np.testing.assert_array_equal(tokens[:, :n], expected)
    assert (tokens[:, n:] == config.pad_token_id).all()
    lengths_out = np.asarray(got.mask).sum(1)
    assert lengths_out.min() < max_new, "EOS was never emitted: the stopping rule is untested"
    for row, length in enumerate(lengths_out):  # mask covers up to and including EOS
        assert length == max_new or tokens[row, length - 1] == eos


@pytest.mark.reference
def test_score_matches_torch_log_softmax(pair):
    _, _, torch_model, config, model = pair
    torch = require("torch")
    rng = np.random.RandomState(3)
    ids, mask = padded_batch(rng, [13, 4, 9], config.vocab_size)
    targets, target_mask = padded_batch(rng, [6, 11, 1], config.vocab_size)
    dec_ids = np.concatenate([np.full((3, 1), config.decoder_start_token_id), targets[:, :-1]], 1)
    logits = torch_logits(torch_model, ids, mask, dec_ids)
    expected = torch.log_softmax(torch.tensor(logits), -1).numpy()
    expected = np.take_along_axis(expected, targets[..., None], -1)[..., 0] * target_mask
    got = np.asarray(score(model, ids, mask, targets, target_mask))
    assert got.shape == targets.shape
    assert np.abs(got - expected).max() <= LOGIT_TOL
    assert (got[target_mask == 0] == 0).all()


@pytest.mark.reference
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets,max_distance", [(32, 128), (8, 20), (16, 64), (64, 256)])
def test_relative_position_bucket_matches_transformers(bidirectional, buckets, max_distance):
    torch = require("torch")
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = np.arange(-5000, 5000)
    expected = T5Attention._relative_position_bucket(
        torch.tensor(relative), bidirectional=bidirectional, num_buckets=buckets,
        max_distance=max_distance).numpy()
    got = relative_position_bucket(jnp.asarray(relative, jnp.int32), bidirectional=bidirectional,
                                   num_buckets=buckets, max_distance=max_distance)
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.reference
def test_bfloat16_compute_and_params(tmp_path):
    make_hf_t5(tmp_path, "v1.1")
    folder = tmp_path
    config, model = load_t5(folder)
    rng = np.random.RandomState(4)
    ids, mask = padded_batch(rng, [11, 6], config.vocab_size)
    dec = ids[:, :7].copy()
    ref = np.asarray(forward(model, ids, mask, dec))
    scale = np.abs(ref).max()
    for param_dtype in ("bfloat16", "float32"):
        cfg16, m16 = load_t5(folder, dtype="bfloat16", param_dtype=param_dtype)
        assert cfg16.dtype == "bfloat16" and m16.embedding[...].dtype == jnp.dtype(param_dtype)
        got = np.asarray(forward(m16, ids, mask, dec))
        assert got.dtype == np.float32 and np.isfinite(got).all()
        # bfloat16 has 8 bits of mantissa: a few percent of the logit scale
        assert np.abs(got - ref).max() <= 0.05 * scale, (param_dtype, np.abs(got - ref).max(), scale)
        if param_dtype == "bfloat16":
            out = generate(m16, ids, mask, rng=None, max_new_tokens=4, greedy=True)
            assert out.tokens.shape == (2, 4) and np.isfinite(np.asarray(out.logprobs)).all()


@pytest.mark.slow  # compiles the model with and without dropout: ~15 s
def test_dropout_only_when_asked():
    config = T5Config(**{**TINY, "dropout_rate": 0.5})
    model = random_t5(config)
    ids = jnp.arange(2, 14).reshape(2, 6)
    mask = jnp.ones_like(ids)
    train = nnx.jit(lambda m, key: m(ids, mask, ids, deterministic=False,
                                     rngs=nnx.Rngs(dropout=key)))
    a = forward(model, ids, mask, ids)
    np.testing.assert_array_equal(a, forward(model, ids, mask, ids))  # default: deterministic
    b, c = train(model, jax.random.key(1)), train(model, jax.random.key(2))
    assert np.abs(a - b).max() > 1e-3 and np.abs(b - c).max() > 1e-3
    with pytest.raises(ValueError, match="dropout"):
        model(ids, mask, ids, deterministic=False)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"feed_forward_proj.*swiglu-x.*gated-gelu"):
        T5Config(feed_forward_proj="swiglu-x")
    with pytest.raises(ValueError, match="dtype"):
        T5Config(dtype="int8")
    with pytest.raises(ValueError, match="num_heads"):
        T5Config(num_heads=0)
    cfg = T5Config(**TINY, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    assert T5Config.from_hf(cfg.to_hf()) == cfg
    assert T5Config(dtype=jnp.bfloat16).dtype == "bfloat16"
