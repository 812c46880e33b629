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
from clarifyjax.models.state import honours_precision
from clarifyjax.models.t5_layers import make_param


HEAD_INITS = ("zero", "torch", "normal")


class ValueModel(nnx.Module):
    """A T5 trunk with a scalar head on every decoder position: V(s, q_<t) for t = 0 .. T-1.

    `head_init`: "zero" (ours: the head starts at V = 0, so that before it has learned anything
    it adds no noise to the advantages, which whitening would otherwise scale up to full-size
    policy steps), "torch" (the original's `nn.Linear` default: weight and bias uniform in
    +-1/sqrt(d_model)) or "normal" (weight normal with std d_model**-0.5, bias 0).
    """

    def __init__(self, config: T5Config, *, rngs: nnx.Rngs, trunk: T5 | None = None,
                 head_init: str = "zero"):
        if head_init not in HEAD_INITS:
            raise ValueError(f"ValueModel: head_init must be one of {HEAD_INITS}, got {head_init!r}")
        self.config = config
        self.trunk = trunk if trunk is not None else T5(config, rngs=rngs)
        d, dtype = config.d_model, config.param_dtype
        self.head_kernel = make_param(rngs, d ** -0.5, (d, 1), ("embed", None), dtype)
        self.head_bias = nnx.Param(jnp.zeros((1,), dtype))
        if head_init == "zero":
            self.head_kernel[...] = jnp.zeros((d, 1), dtype)
        elif head_init == "torch":
            bound = d ** -0.5
            k_w, k_b = jax.random.split(rngs.params())
            self.head_kernel[...] = jax.random.uniform(k_w, (d, 1), dtype, -bound, bound)
            self.head_bias[...] = jax.random.uniform(k_b, (1,), dtype, -bound, bound)

    @classmethod
    def from_t5(cls, model: T5, *, seed: int = 0, head_init: str = "zero") -> ValueModel:
        """A value model whose trunk is a *copy* of `model` (the policy's initial weights) and
        whose head is new (seeded, `head_init` as above)."""
        graphdef, state = nnx.split(model)
        trunk = nnx.merge(graphdef, jax.tree.map(lambda x: jnp.array(x, copy=True), state))
        return cls(model.config, rngs=nnx.Rngs(seed), trunk=trunk, head_init=head_init)

    @honours_precision
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 decoder_input_ids: jax.Array) -> jax.Array:
        """input_ids/attention_mask [b, s], decoder_input_ids [b, t] (shifted right)
        -> values [b, t] float32. Only the decoder's hidden states are computed (no vocabulary
        projection). Matmuls at the trunk's ``config.precision``."""
        t5 = self.trunk
        encoded = t5.encode(input_ids, attention_mask)
        hidden = t5.decoder(t5.embed(decoder_input_ids), encoded, attention_mask, None)
        if self.config.scale_decoder_outputs:
            hidden = hidden * jnp.asarray(self.config.d_model ** -0.5, hidden.dtype)
        values = jnp.einsum("btm,mo->bto", hidden.astype(jnp.float32),
                            self.head_kernel[...].astype(jnp.float32))
        return values[..., 0] + self.head_bias[...].astype(jnp.float32)[0]
