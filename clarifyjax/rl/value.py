"""The value model of PPO: as in the original (`T5ForTokenRegression`), a separate T5 whose final
decoder hidden state goes through a scalar head ``Linear(d_model, 1)`` at every decoder position
(scaled by d_model**-0.5 first for v1.0 checkpoints, as the original did when embeddings are
tied). It starts from the policy's weights (`ValueModel.from_t5`) or from its own checkpoint.

Shapes: b = batch, s = query length, t = response length, m = d_model.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from clarifyjax.models.t5 import T5, T5Config
from clarifyjax.models.t5_layers import make_param


class ValueModel(nnx.Module):
    """A T5 trunk with a scalar head on every decoder position: V(s, q_<t) for t = 0 .. T-1."""

    def __init__(self, config: T5Config, *, rngs: nnx.Rngs, trunk: T5 | None = None):
        self.config = config
        self.trunk = trunk if trunk is not None else T5(config, rngs=rngs)
        self.head_kernel = make_param(rngs, config.d_model ** -0.5, (config.d_model, 1),
                                      ("embed", None), config.param_dtype)
        self.head_bias = nnx.Param(jnp.zeros((1,), config.param_dtype))

    @classmethod
    def from_t5(cls, model: T5, *, seed: int = 0) -> ValueModel:
        """A value model whose trunk is a *copy* of `model` (the policy's initial weights) and
        whose head is new (seeded)."""
        graphdef, state = nnx.split(model)
        trunk = nnx.merge(graphdef, jax.tree.map(lambda x: jnp.array(x, copy=True), state))
        return cls(model.config, rngs=nnx.Rngs(seed), trunk=trunk)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 decoder_input_ids: jax.Array) -> jax.Array:
        """input_ids/attention_mask [b, s], decoder_input_ids [b, t] (shifted right)
        -> values [b, t] float32. Only the decoder's hidden states are computed (no vocabulary
        projection)."""
        t5 = self.trunk
        encoded = t5.encode(input_ids, attention_mask)
        hidden = t5.decoder(t5.embed(decoder_input_ids), encoded, attention_mask, None)
        if self.config.scale_decoder_outputs:
            hidden = hidden * jnp.asarray(self.config.d_model ** -0.5, hidden.dtype)
        values = jnp.einsum("btm,mo->bto", hidden.astype(jnp.float32),
                            self.head_kernel[...].astype(jnp.float32))
        return values[..., 0] + self.head_bias[...].astype(jnp.float32)[0]
