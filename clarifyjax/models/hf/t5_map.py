"""Hugging Face T5 checkpoint names <-> the NNX `T5`'s parameters: the T5 family's tensor map, config
ranges and checks, which `clarifyjax.models.hf` loads and saves through.

One table, `t5_tensor_maps(config)` (the names are listed above it), says for every parameter
which Hugging Face tensor holds it and how to get from the torch layout to ours (a reshape that
splits `heads * d_kv`, then a transpose). Loading and saving both read that table."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from clarifyjax.models.hf.tensor_map import TensorMap, check_tensors, linear, same_layout
from clarifyjax.models.safetensors_io import CheckpointError, TensorSource, check_config_numbers
from clarifyjax.models.t5 import T5Config

# In Hugging Face checkpoints but redundant (copies of shared.weight) or unused by the model.
IGNORED_TENSORS = frozenset({
    "encoder.embed_tokens.weight",
    "decoder.embed_tokens.weight",
    "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
})


# The numeric fields of a T5 config.json and their ranges (`check_config_numbers`): sizes are
# positive integers, the epsilon positive (0 divides by zero in RMSNorm), rates in [0, 1).
# initializer_factor is unused when loading but refused when meaningless all the same.
T5_CONFIG_RANGES = {
    **dict.fromkeys(("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers",
                     "num_heads", "relative_attention_num_buckets",
                     "relative_attention_max_distance"), "int >= 1"),
    **dict.fromkeys(("pad_token_id", "decoder_start_token_id"), "int >= 0"),
    "dropout_rate": "[0, 1)", "layer_norm_epsilon": "> 0", "initializer_factor": "> 0"}


# Name correspondence (i = layer; enc/dec = encoder/decoder):
#   shared.weight                                   [V, m]    -> embedding            [V, m]
#   lm_head.weight (untied only)                    [V, m]    -> lm_head              [m, V]
#   {enc,dec}.block.{i}.layer.0.SelfAttention.{q,k,v}.weight [h*d, m] -> {..}.query/key/value [m, h, d]
#   {enc,dec}.block.{i}.layer.0.SelfAttention.o.weight       [m, h*d] -> {..}.out             [h, d, m]
#   {enc,dec}.block.0.layer.0.SelfAttention.relative_attention_bias.weight [buckets, h]
#                                                             -> {enc,dec}.relative_bias.embedding
#   dec.block.{i}.layer.1.EncDecAttention.*                    -> decoder.layers.{i}.cross_attention.*
#   ....layer.{1|2}.DenseReluDense.wi / wi_0, wi_1 [f, m]      -> mlp.wi.{0,1} [m, f];  wo [m, f] -> [f, m]
#   ....layer.{k}.layer_norm.weight, {enc,dec}.final_layer_norm.weight  [m] -> ...norm.scale [m]
def t5_tensor_maps(config: T5Config) -> dict[tuple, TensorMap]:
    """NNX state path -> TensorMap, for every parameter of `T5(config)`."""
    c = config
    m, h, d, f = c.d_model, c.num_heads, c.d_kv, c.d_ff
    maps: dict[tuple, TensorMap] = {
        ("embedding",): same_layout("shared.weight", (c.vocab_size, m))}
    if not c.tie_word_embeddings:
        maps[("lm_head",)] = linear("lm_head.weight", (m,), (c.vocab_size,))

    def attention(ours: tuple, theirs: str) -> None:
        for p, name in (("query", "q"), ("key", "k"), ("value", "v")):
            maps[ours + (p,)] = linear(f"{theirs}.{name}.weight", (m,), (h, d))
        maps[ours + ("out",)] = linear(f"{theirs}.o.weight", (h, d), (m,))

    def feed_forward(ours: tuple, theirs: str) -> None:
        names = ("wi_0", "wi_1") if c.is_gated_act else ("wi",)
        for j, name in enumerate(names):
            maps[ours + ("wi", j)] = linear(f"{theirs}.{name}.weight", (m,), (f,))
        maps[ours + ("wo",)] = linear(f"{theirs}.wo.weight", (f,), (m,))

    for stack, n_layers in (("encoder", c.num_layers), ("decoder", c.num_decoder_layers)):
        maps[(stack, "relative_bias", "embedding")] = same_layout(
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            (c.relative_attention_num_buckets, h))
        maps[(stack, "final_norm", "scale")] = same_layout(f"{stack}.final_layer_norm.weight",
                                                           (m,))
        for i in range(n_layers):
            ours, theirs = (stack, "layers", i), f"{stack}.block.{i}.layer"
            maps[ours + ("self_attention_norm", "scale")] = same_layout(
                f"{theirs}.0.layer_norm.weight", (m,))
            attention(ours + ("self_attention",), f"{theirs}.0.SelfAttention")
            ff = 1
            if stack == "decoder":
                maps[ours + ("cross_attention_norm", "scale")] = same_layout(
                    f"{theirs}.1.layer_norm.weight", (m,))
                attention(ours + ("cross_attention",), f"{theirs}.1.EncDecAttention")
                ff = 2
            maps[ours + ("mlp_norm", "scale")] = same_layout(
                f"{theirs}.{ff}.layer_norm.weight", (m,))
            feed_forward(ours + ("mlp",), f"{theirs}.{ff}.DenseReluDense")
    return maps


def resolve_config(folder: Path, hf: dict, source: TensorSource, **overrides) -> T5Config:
    """transformers 5 semantics: the output projection is tied unless the checkpoint holds an
    `lm_head.weight` that differs from `shared.weight` (or the config says untied)."""
    has_head = "lm_head.weight" in source
    tied = not has_head
    if has_head and hf.get("tie_word_embeddings", True) is not False and "shared.weight" in source:
        tied = (source.shape("lm_head.weight") == source.shape("shared.weight")
                and np.array_equal(source.get("lm_head.weight"), source.get("shared.weight")))
    scale = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True) is not False)
    check_config_numbers(hf, folder / "config.json", T5_CONFIG_RANGES)
    eos = hf.get("eos_token_id")
    for e in eos if isinstance(eos, list) else [eos]:  # transformers allows several
        check_config_numbers({"eos_token_id": e}, folder / "config.json",
                             {"eos_token_id": "int >= 0"})
    try:
        return T5Config.from_hf(hf, tie_word_embeddings=tied, scale_decoder_outputs=bool(scale),
                                **overrides)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{folder / 'config.json'}: {e}") from e


def check_t5_tensors(folder: Path, source: TensorSource, maps: dict[tuple, TensorMap],
                     tied: bool) -> None:
    """`tensor_map.check_tensors` with the T5's ignored tensors (and `lm_head.weight` when tied:
    a copy of shared.weight)."""
    check_tensors(folder, source, maps, "the T5 config",
                  hint="wrong feed_forward_proj or layer counts?",
                  ignore=IGNORED_TENSORS | ({"lm_head.weight"} if tied else set()))
