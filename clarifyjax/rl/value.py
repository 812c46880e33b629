"""The value model of PPO, a separate model with a scalar head at every response position: for a
T5 policy (`ValueModel`) a T5 as in the original (`T5ForTokenRegression`), for a decoder-only one
(`CausalValueModel`) a copy of its trunk; each starts from the policy's weights (`from_t5`,
`from_lm`) or its own checkpoint. Both give `response_values(query, response) -> [b, t]`.
`causal_response_hidden`: a decoder's last hidden state at the positions that predict each
response token. Shapes: b = batch, s = query length, t = response length, m = d_model."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from clarifyjax.models.causal_lm import CausalLM, left_align
from clarifyjax.models.t5 import T5, T5Config, shift_right
from clarifyjax.models.state import honours_precision
from clarifyjax.models.t5_layers import make_param


HEAD_INITS = ("zero", "torch", "normal")


def scalar_head(rngs: nnx.Rngs, d: int, dtype, head_init: str, where: str):
    """(kernel [d, 1], bias [1]) of a value head started as `head_init` says (`ValueModel`)."""
    if head_init not in HEAD_INITS:
        raise ValueError(f"{where}: head_init must be one of {HEAD_INITS}, got {head_init!r}")
    kernel = make_param(rngs, d ** -0.5, (d, 1), ("embed", None), dtype)
    bias = nnx.Param(jnp.zeros((1,), dtype))
    if head_init == "zero":
        kernel[...] = jnp.zeros((d, 1), dtype)
    elif head_init == "torch":
        bound = d ** -0.5
        k_w, k_b = jax.random.split(rngs.params())
        kernel[...] = jax.random.uniform(k_w, (d, 1), dtype, -bound, bound)
        bias[...] = jax.random.uniform(k_b, (1,), dtype, -bound, bound)
    return kernel, bias


def _head(hidden: jax.Array, kernel, bias) -> jax.Array:
    """[b, t, m] -> [b, t] float32 through a scalar head."""
    values = jnp.einsum("btm,mo->bto", hidden.astype(jnp.float32), kernel[...].astype(jnp.float32))
    return values[..., 0] + bias[...].astype(jnp.float32)[0]


def _copy_module(model: nnx.Module) -> nnx.Module:
    """`model` with its own buffers (a copy of every array)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: jnp.array(x, copy=True), state))


class ValueModel(nnx.Module):
    """A T5 trunk with a scalar head on every decoder position: V(s, q_<t) for t = 0 .. T-1.

    `head_init`: "zero" (ours: the head starts at V = 0, so that before it has learned anything
    it adds no noise to the advantages, which whitening would otherwise scale up to full-size
    policy steps), "torch" (the original's `nn.Linear` default: weight and bias uniform in
    +-1/sqrt(d_model)) or "normal" (weight normal with std d_model**-0.5, bias 0).
    """

    def __init__(self, config: T5Config, *, rngs: nnx.Rngs, trunk: T5 | None = None,
                 head_init: str = "zero"):
        self.config = config
        self.trunk = trunk if trunk is not None else T5(config, rngs=rngs)
        self.head_kernel, self.head_bias = scalar_head(rngs, config.d_model, config.param_dtype,
                                                       head_init, "ValueModel")

    def response_values(self, query_ids, query_mask, response_ids, response_mask) -> jax.Array:
        """V at every response position [b, t] float32 (0 on padding)."""
        values = self(query_ids, query_mask,
                      shift_right(response_ids, self.config.decoder_start_token_id))
        return jnp.where(response_mask > 0, values, 0.0)

    @classmethod
    def from_t5(cls, model: T5, *, seed: int = 0, head_init: str = "zero") -> ValueModel:
        """A value model whose trunk is a *copy* of `model` (the policy's initial weights) and
        whose head is new (seeded, `head_init` as above)."""
        return cls(model.config, rngs=nnx.Rngs(seed), trunk=_copy_module(model),
                   head_init=head_init)

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
        return _head(hidden, self.head_kernel, self.head_bias)


def causal_response_hidden(lm: CausalLM, query_ids, query_mask, response_ids, response_mask
                           ) -> jax.Array:
    """The last layer's output [b, t, H] at the positions that predict each response token: the
    prompt (any padding; left-aligned here) followed by the right-padded response, one forward;
    row i's position j is its prompt's last token for j = 0, else response token j - 1."""
    ids, mask = left_align(query_ids, query_mask)
    s = ids.shape[1]
    hidden, _ = lm.hidden_states(jnp.concatenate([ids, response_ids.astype(ids.dtype)], axis=1),
                                 jnp.concatenate([mask, response_mask.astype(mask.dtype)], axis=1))
    return hidden[:, s - 1:-1]


# The value model of a decoder-only policy is a separate model, a copy of the policy's trunk with
# a scalar head, not a head on the policy's own trunk: as the original's T5 design (and TRL's and
# tunix's PPO critics), so that the value loss never moves the policy's weights, the two keep
# their own optimizer states and `ppo.make_ppo_update` stays one function of (policy params,
# value params) for both families. It costs a second trunk's parameters and Adam state.
class CausalValueModel(nnx.Module):
    """A decoder-only trunk (a `CausalLM`; its vocabulary head unused) with a scalar head on the
    last layer's output after the final norm: V(prompt, response_<j) for j = 0 .. t - 1.
    `head_init` as `ValueModel`'s."""

    def __init__(self, config, *, rngs: nnx.Rngs, trunk: CausalLM | None = None,
                 head_init: str = "zero"):
        self.config = config
        self.trunk = trunk if trunk is not None else CausalLM(config, rngs=rngs)
        self.head_kernel, self.head_bias = scalar_head(rngs, config.embed_size, config.param_dtype,
                                                       head_init, "CausalValueModel")

    @classmethod
    def from_lm(cls, model: CausalLM, *, seed: int = 0, head_init: str = "zero"
                ) -> CausalValueModel:
        """A value model whose trunk is a copy of `model` and whose head is new."""
        return cls(model.config, rngs=nnx.Rngs(seed), trunk=_copy_module(model),
                   head_init=head_init)

    def response_values(self, query_ids, query_mask, response_ids, response_mask) -> jax.Array:
        """V at every response position [b, t] float32 (0 on padding)."""
        lm, c = self.trunk, self.config
        hidden = causal_response_hidden(lm, query_ids, query_mask, response_ids, response_mask)
        if c.final_norm:
            hidden = lm.final_norm(hidden)
        if c.embed_size != c.hidden_size:
            hidden = hidden @ lm.project_out[...].astype(c.dtype)
        return jnp.where(response_mask > 0, _head(hidden, self.head_kernel, self.head_bias), 0.0)
