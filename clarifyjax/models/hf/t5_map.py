"""Hugging Face T5 checkpoint names <-> the NNX `T5`'s parameters: the T5 family's tensor map,
config ranges and checks, which `clarifyjax.models.hf` loads and saves through.

One table, `tensor_maps(config)`, says for every NNX parameter which Hugging Face tensor holds it
and how to get from the torch layout to ours: a reshape that splits a dimension (the joined
`heads * d_kv` of q/k/v/o) followed by a transpose. Loading and saving both read that table.

Name correspondence (i = layer; enc/dec = encoder/decoder):
  shared.weight                                   [V, m]    -> embedding            [V, m]
  lm_head.weight (untied only)                    [V, m]    -> lm_head              [m, V]
  {enc,dec}.block.{i}.layer.0.SelfAttention.{q,k,v}.weight [h*d, m] -> {..}.query/key/value [m, h, d]
  {enc,dec}.block.{i}.layer.0.SelfAttention.o.weight       [m, h*d] -> {..}.out             [h, d, m]
  {enc,dec}.block.0.layer.0.SelfAttention.relative_attention_bias.weight [buckets, h]
                                                            -> {enc,dec}.relative_bias.embedding
  dec.block.{i}.layer.1.EncDecAttention.*                    -> decoder.layers.{i}.cross_attention.*
  ....layer.{1|2}.DenseReluDense.wi / wi_0, wi_1 [f, m]      -> mlp.wi.{0,1} [m, f];  wo [m, f] -> [f, m]
  ....layer.{k}.layer_norm.weight, {enc,dec}.final_layer_norm.weight  [m] -> ...norm.scale [m]
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from clarifyjax.models.safetensors_io import (CheckpointError, TensorSource, check_config_numbers,
                                             check_shape)
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


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """ours = hf.reshape(view).transpose(perm); `groups[i]` lists the view dims that make HF dim i."""

    hf_name: str
    hf_shape: tuple[int, ...]
    view: tuple[int, ...]
    perm: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.view[p] for p in self.perm)

    def read(self, source: TensorSource, index: tuple | None = None) -> np.ndarray:
        """Our-layout block `index` (tuple of unit-step slices over `self.shape`), reading only
        the rows/columns of the Hugging Face tensor that it needs."""
        shape = self.shape
        index = tuple(index) if index is not None else ()
        index = index + (slice(None),) * (len(shape) - len(index))
        ours = [slice(*s.indices(n)) for s, n in zip(index, shape)]
        view_index: list[slice] = [slice(None)] * len(self.view)
        for j, p in enumerate(self.perm):
            view_index[p] = ours[j]
        hf_index, local_shape, post = [], [], []
        for group in self.groups:
            outer = view_index[group[0]]
            inner = math.prod(self.view[g] for g in group[1:])
            hf_index.append(slice(outer.start * inner, outer.stop * inner))
            local_shape += [outer.stop - outer.start] + [self.view[g] for g in group[1:]]
            post += [slice(None)] + [view_index[g] for g in group[1:]]
        block = np.asarray(source.get_slice(self.hf_name, tuple(hf_index)))
        return block.reshape(local_shape)[tuple(post)].transpose(self.perm)

    def to_hf(self, value: np.ndarray) -> np.ndarray:
        """Our layout -> the torch layout of `hf_name`."""
        return np.asarray(value).transpose(np.argsort(self.perm)).reshape(self.hf_shape)


def _same(name: str, shape: tuple[int, ...]) -> TensorMap:
    dims = tuple(range(len(shape)))
    return TensorMap(name, shape, shape, dims, tuple((i,) for i in dims))


def _transposed(name: str, hf_shape: tuple[int, int]) -> TensorMap:
    return TensorMap(name, hf_shape, hf_shape, (1, 0), ((0,), (1,)))


def tensor_maps(config: T5Config) -> dict[tuple, TensorMap]:
    """NNX state path -> TensorMap, for every parameter of `T5(config)`."""
    c = config
    m, h, d, f = c.d_model, c.num_heads, c.d_kv, c.d_ff
    maps: dict[tuple, TensorMap] = {("embedding",): _same("shared.weight", (c.vocab_size, m))}
    if not c.tie_word_embeddings:
        maps[("lm_head",)] = _transposed("lm_head.weight", (c.vocab_size, m))

    def attention(ours: tuple, theirs: str) -> None:
        for p, name in (("query", "q"), ("key", "k"), ("value", "v")):
            maps[ours + (p,)] = TensorMap(f"{theirs}.{name}.weight", (h * d, m), (h, d, m),
                                          (2, 0, 1), ((0, 1), (2,)))
        maps[ours + ("out",)] = TensorMap(f"{theirs}.o.weight", (m, h * d), (m, h, d), (1, 2, 0),
                                          ((0,), (1, 2)))

    def feed_forward(ours: tuple, theirs: str) -> None:
        names = ("wi_0", "wi_1") if c.is_gated_act else ("wi",)
        for j, name in enumerate(names):
            maps[ours + ("wi", j)] = _transposed(f"{theirs}.{name}.weight", (f, m))
        maps[ours + ("wo",)] = _transposed(f"{theirs}.wo.weight", (m, f))

    for stack, n_layers in (("encoder", c.num_layers), ("decoder", c.num_decoder_layers)):
        maps[(stack, "relative_bias", "embedding")] = _same(
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            (c.relative_attention_num_buckets, h))
        maps[(stack, "final_norm", "scale")] = _same(f"{stack}.final_layer_norm.weight", (m,))
        for i in range(n_layers):
            ours, theirs = (stack, "layers", i), f"{stack}.block.{i}.layer"
            maps[ours + ("self_attention_norm", "scale")] = _same(
                f"{theirs}.0.layer_norm.weight", (m,))
            attention(ours + ("self_attention",), f"{theirs}.0.SelfAttention")
            ff = 1
            if stack == "decoder":
                maps[ours + ("cross_attention_norm", "scale")] = _same(
                    f"{theirs}.1.layer_norm.weight", (m,))
                attention(ours + ("cross_attention",), f"{theirs}.1.EncDecAttention")
                ff = 2
            maps[ours + ("mlp_norm", "scale")] = _same(f"{theirs}.{ff}.layer_norm.weight", (m,))
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


def check_tensors(folder: Path, source: TensorSource, maps: dict[tuple, TensorMap],
                   tied: bool) -> None:
    expected = {tm.hf_name: tm for tm in maps.values()}
    missing = sorted(name for name in expected if name not in source)
    if missing:
        raise CheckpointError(f"{folder}: {len(missing)} tensor(s) missing from the checkpoint: "
                              f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    for name, tm in expected.items():
        check_shape(name, source.shape(name), tm.hf_shape)
    ignored = IGNORED_TENSORS | ({"lm_head.weight"} if tied else set())
    unexpected = sorted(set(source.keys()) - set(expected) - ignored)
    if unexpected:
        raise CheckpointError(
            f"{folder}: {len(unexpected)} tensor(s) the T5 config does not account for (wrong "
            f"feed_forward_proj or layer counts?): {', '.join(unexpected[:8])}"
            f"{' ...' if len(unexpected) > 8 else ''}")
