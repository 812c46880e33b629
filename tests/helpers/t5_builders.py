"""Random T5s for tests: `random_t5` draws a `clarifyjax` T5's parameters on the host (TINY and
FAMILIES are the decoding tests' configurations); `make_hf_t5` saves a random torch T5 (HF_TINY,
HF_FAMILIES) for the parity and checkpoint tests; `padded_batch` makes right-padded ids."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from clarifyjax.models.t5 import T5, T5Config
from helpers.env import require

TINY = dict(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=1, num_decoder_layers=2,
            num_heads=3, relative_attention_num_buckets=8, relative_attention_max_distance=16,
            dropout_rate=0.0)
FAMILIES = {"v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
            "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)}
GAIN = 3.0  # see random_t5

HF_TINY = dict(vocab_size=96, d_model=32, d_kv=6, d_ff=40, num_layers=2, num_decoder_layers=3,
               num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
               dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
HF_FAMILIES = {
    "v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    # transformers 5 ties lm_head even when the config says untied, and only drops the rescale
    "v1.1-tied-by-transformers5": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


def random_t5(config: T5Config, seed: int = 0) -> T5:
    """A T5 with random parameters drawn on the host (numpy).

    `T5(config, rngs=...)` is the real initializer, but compiling its many random draws costs
    more XLA time than most tests take; they only need some random weights. Norm scales
    are drawn around 1 (not exactly 1) so that a mix-up between them would show. The output
    projection is scaled so that logits are of order 1 in both families (v1.0 rescales by
    d_model**-0.5 before the tied embedding; an untied lm_head gets std d_model**-0.5).
    The sublayer output projections get GAIN x the usual std: otherwise the residual stream is
    dominated by the input embedding and a tied (v1.0) random model just repeats one token.
    """
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: T5(config, rngs=nnx.Rngs(0))))
    rng = np.random.RandomState(seed)
    dtype = jnp.dtype(config.param_dtype)

    def draw(path, shape):
        name = path[-1] if isinstance(path[-1], str) else path[-2]
        if name == "scale":
            value = 1.0 + 0.2 * rng.randn(*shape)
        elif name == "embedding":
            value = rng.randn(*shape)
        elif name == "out":  # [h, d, m]
            value = GAIN * rng.randn(*shape) / np.sqrt(shape[0] * shape[1])
        elif name == "wo":
            value = GAIN * rng.randn(*shape) / np.sqrt(shape[0])
        else:  # [fan_in, ...]
            value = rng.randn(*shape) / np.sqrt(shape[0])
        return jnp.asarray(value.astype(np.float32), dtype)

    flat = [(p, v.replace(draw(p, v.shape))) for p, v in nnx.to_flat_state(abstract)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def make_hf_t5(folder, family: str, seed: int = 0, **overrides):
    """A random torch T5 of `family`, saved as safetensors in `folder`; returns the torch model."""
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(seed)
    cfg = transformers.T5Config(**{**HF_TINY, **HF_FAMILIES[family], **overrides})
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    if family == "v1.1":  # a real v1.1 checkpoint has its own lm_head (std 1, as HF inits it)
        model.lm_head.weight = torch.nn.Parameter(torch.randn(cfg.vocab_size, cfg.d_model))
    model.save_pretrained(str(folder), safe_serialization=True)
    return model


def padded_batch(rng: np.random.RandomState, lengths, vocab: int, low: int = 2):
    """Right-padded ids [b, max(lengths)] (pad 0) and mask."""
    ids = np.zeros((len(lengths), max(lengths)), np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.randint(low, vocab, n)
        mask[i, :n] = 1
    return ids, mask
