"""Hugging Face DeBERTa-v2/v3 folders -> `clarifyjax.models.deberta`: config resolution, the tensor
maps (the name correspondence is above `trunk_maps`), the checks, and the (sharded) read, which
`clarifyjax.models.hf` loads through. Every expected tensor must be there with its shape."""
from __future__ import annotations

from pathlib import Path

from flax import nnx

from clarifyjax.models.deberta import (ATTENTION_TERMS, DebertaConfig, DebertaEncoder,
                                       DebertaQuestionAnswering, DebertaSequenceClassifier)
from clarifyjax.models.encoder import ENCODER_ACTIVATIONS, labels_from_hf
from clarifyjax.models.hf.tensor_map import (TensorMap, check_tensors, linear, read_into,
                                             same_layout, vector)
from clarifyjax.models.safetensors_io import (CheckpointError, TensorSource, check_config_numbers,
                                             read_config)

MODEL_TYPE = "deberta-v2"  # DeBERTa-v3 checkpoints use the v2 model_type

DEBERTA_CONFIG_RANGES = {
    **dict.fromkeys(("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "num_labels",
                     "embedding_size", "attention_head_size", "pooler_hidden_size"), "int >= 1"),
    **dict.fromkeys(("pad_token_id", "type_vocab_size"), "int >= 0"),
    **dict.fromkeys(("max_relative_positions", "position_buckets", "conv_kernel_size"),
                    "int finite"),
    **dict.fromkeys(("hidden_dropout_prob", "attention_probs_dropout_prob", "pooler_dropout",
                     "cls_dropout"), "[0, 1)"),
    "layer_norm_eps": "> 0", "initializer_range": ">= 0"}


def _split_options(value, field: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """config.json's "a|b" strings or lists (lower-cased, as Hugging Face), each in `allowed`."""
    if value is None:
        return ()
    items = value.lower().split("|") if isinstance(value, str) else list(value)
    items = tuple(str(x).strip().lower() for x in items if str(x).strip())
    unknown = [x for x in items if x not in allowed]
    if unknown:
        raise CheckpointError(f"config.json field {field!r} has {unknown}; supported: {allowed}")
    return items


def deberta_config_from_hf(hf: dict, **overrides) -> DebertaConfig:
    """A `DebertaConfig` from a config.json dict, with Hugging Face's defaults (DebertaV2Config
    and the `getattr` defaults of its modeling code); unsupported switches name their field."""
    if hf.get("model_type") != MODEL_TYPE:
        raise CheckpointError(f"config.json field 'model_type' is {hf.get('model_type')!r}; "
                              f"this DeBERTa supports {MODEL_TYPE!r} (DeBERTa-v2 and v3) only")

    def field(name):
        if hf.get(name) is None:
            raise CheckpointError(f"config.json lacks the field {name!r} ({MODEL_TYPE})")
        return hf[name]

    d, heads = int(field("hidden_size")), int(field("num_attention_heads"))
    if d % heads:
        raise CheckpointError(f"config.json: hidden_size {d} is not divisible by "
                              f"num_attention_heads {heads}")
    if int(hf.get("conv_kernel_size") or 0) > 0:
        raise CheckpointError("config.json field 'conv_kernel_size' is "
                              f"{hf['conv_kernel_size']}: the convolution layer of "
                              "deberta-v2-xlarge/xxlarge is not supported")
    if int(hf.get("pooler_hidden_size") or d) != d:
        raise CheckpointError(f"config.json field 'pooler_hidden_size' is "
                              f"{hf['pooler_hidden_size']}; only hidden_size ({d}) is supported")
    if hf.get("z_steps"):
        raise CheckpointError("config.json field 'z_steps' is not supported")
    for name, default in (("hidden_act", "gelu"), ("pooler_hidden_act", "gelu")):
        if str(hf.get(name, default)) not in ENCODER_ACTIVATIONS:
            raise CheckpointError(f"config.json field {name!r} is {hf.get(name)!r}; supported: "
                                  f"{sorted(ENCODER_ACTIVATIONS)}")
    max_positions = int(field("max_position_embeddings"))
    max_relative = int(hf.get("max_relative_positions", -1))
    values = dict(
        vocab_size=int(field("vocab_size")), hidden_size=d,
        num_layers=int(field("num_hidden_layers")), num_heads=heads,
        head_dim=int(hf.get("attention_head_size") or d // heads),
        intermediate_size=int(field("intermediate_size")),
        hidden_act=str(hf.get("hidden_act", "gelu")),
        max_position_embeddings=max_positions,
        type_vocab_size=int(hf.get("type_vocab_size", 0)),
        embedding_size=int(hf.get("embedding_size") or d),
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-7)),
        pad_token_id=int(hf.get("pad_token_id") or 0),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        position_biased_input=bool(hf.get("position_biased_input", True)),
        relative_attention=bool(hf.get("relative_attention", False)),
        max_relative_positions=max_relative if max_relative >= 1 else max_positions,
        position_buckets=int(hf.get("position_buckets", -1)),
        pos_att_type=_split_options(hf.get("pos_att_type"), "pos_att_type", ATTENTION_TERMS),
        share_att_key=bool(hf.get("share_att_key", False)),
        norm_rel_ebd="layer_norm" in _split_options(hf.get("norm_rel_ebd", "none"),
                                                    "norm_rel_ebd", ("none", "layer_norm")),
        pooler_hidden_act=str(hf.get("pooler_hidden_act", "gelu")),
        labels=labels_from_hf(hf))
    values.update(overrides)
    return DebertaConfig(**values)


def read_deberta_config(path, **overrides) -> DebertaConfig:
    """`DebertaConfig` from `path`/config.json; errors name the file and the field."""
    hf = read_config(path)
    file = Path(path) / "config.json"
    check_config_numbers(hf, file, DEBERTA_CONFIG_RANGES)
    try:
        return deberta_config_from_hf(hf, **overrides)
    except CheckpointError as e:
        raise CheckpointError(f"{file}: {e}") from e


# --------------------------------------------------------------------------- the tensor map


def _dense(maps: dict, ours: tuple, theirs: str, n_in: int, n_out: int) -> None:
    maps[ours + ("kernel",)] = linear(theirs + ".weight", (n_in,), (n_out,))
    maps[ours + ("bias",)] = same_layout(theirs + ".bias", (n_out,))


def _norm(maps: dict, ours: tuple, theirs: str, d: int) -> None:
    maps[ours + ("scale",)] = same_layout(theirs + ".weight", (d,))
    maps[ours + ("bias",)] = same_layout(theirs + ".bias", (d,))


def _layer_maps(maps: dict, c: DebertaConfig, ours: tuple, theirs: str) -> None:
    d, h, k = c.hidden_size, c.num_heads, c.head_dim
    attention = ours + ("attention",)
    projections = [("query", "query_proj"), ("key", "key_proj"), ("value", "value_proj")]
    if c.relative_attention and not c.share_att_key:
        projections += [(ours_name, hf) for ours_name, hf, term in
                        (("pos_key", "pos_key_proj", "c2p"), ("pos_query", "pos_query_proj", "p2c"))
                        if term in c.pos_att_type]
    for name, hf in projections:
        hf = f"{theirs}.attention.self.{hf}"
        maps[attention + (name, "kernel")] = linear(hf + ".weight", (d,), (h, k))
        maps[attention + (name, "bias")] = vector(hf + ".bias", (h, k))
    out = f"{theirs}.attention.output.dense"
    maps[attention + ("output", "kernel")] = linear(out + ".weight", (h, k), (d,))
    maps[attention + ("output", "bias")] = same_layout(out + ".bias", (d,))
    _norm(maps, ours + ("attention_norm",), f"{theirs}.attention.output.LayerNorm", d)
    _dense(maps, ours + ("mlp", "wi"), f"{theirs}.intermediate.dense", d, c.intermediate_size)
    _dense(maps, ours + ("mlp", "wo"), f"{theirs}.output.dense", c.intermediate_size, d)
    _norm(maps, ours + ("mlp_norm",), f"{theirs}.output.LayerNorm", d)


# Name correspondence (P = "deberta." in `...For*` folders, "" in a bare `DebertaV2Model`;
# i = layer; torch `nn.Linear` stores [out, in], we store [in, out] with heads split):
#   P embeddings.word_embeddings.weight  [V, e]        -> embeddings.word_embeddings.embedding
#   P embeddings.position_embeddings.weight [n, e]     -> ...position_embeddings (position_biased_input)
#   P embeddings.token_type_embeddings.weight [t, e]   -> ...token_type_embeddings (type_vocab_size > 0)
#   P embeddings.embed_proj.weight [d, e]              -> embeddings.embed_proj [e, d] (e != d)
#   P embeddings.LayerNorm.{weight,bias}               -> embeddings.norm.{scale,bias}
#   P encoder.rel_embeddings.weight [r, d]             -> encoder.rel_embeddings
#   P encoder.LayerNorm.{weight,bias}                  -> rel_norm (norm_rel_ebd: layer_norm)
#   P encoder.layer.i.attention.self.{query,key,value,pos_key,pos_query}_proj [h*k, d]
#                                                      -> layers.i.attention.{query,..,pos_query} [d, h, k]
#   P encoder.layer.i.attention.output.dense [d, h*k]  -> layers.i.attention.output [h, k, d]
#   P encoder.layer.i.attention.output.LayerNorm       -> layers.i.attention_norm
#   P encoder.layer.i.intermediate.dense / output.dense -> layers.i.mlp.wi / wo
#   P encoder.layer.i.output.LayerNorm                 -> layers.i.mlp_norm
#   pooler.dense, classifier                           -> dense, out_proj (sequence classification)
#   qa_outputs                                         -> qa_outputs (question answering)
# A trunk tensor the config does not account for (a `pos_key_proj` under `share_att_key`, a conv
# layer) is refused, naming it; tensors of other heads (MLM, ...) are ignored, as is a
# `position_embeddings` table under `position_biased_input: false` (Hugging Face ignores it too).
def trunk_maps(c: DebertaConfig, prefix: str, at: tuple = ()) -> dict[tuple, TensorMap]:
    """NNX path (under `at`) -> TensorMap for every parameter of `DebertaEncoder(c)`."""
    e, d = c.embedding_size, c.hidden_size
    emb = f"{prefix}embeddings."
    maps = {("embeddings", "word_embeddings", "embedding"):
            same_layout(emb + "word_embeddings.weight", (c.vocab_size, e))}
    if c.position_biased_input:
        maps[("embeddings", "position_embeddings", "embedding")] = same_layout(
            emb + "position_embeddings.weight", (c.max_position_embeddings, e))
    if c.type_vocab_size > 0:
        maps[("embeddings", "token_type_embeddings", "embedding")] = same_layout(
            emb + "token_type_embeddings.weight", (c.type_vocab_size, e))
    if e != d:
        maps[("embeddings", "embed_proj")] = linear(emb + "embed_proj.weight", (e,), (d,))
    _norm(maps, ("embeddings", "norm"), emb + "LayerNorm", d)
    if c.relative_attention:
        maps[("rel_embeddings",)] = same_layout(f"{prefix}encoder.rel_embeddings.weight",
                                                (2 * c.att_span, d))
        if c.norm_rel_ebd:
            _norm(maps, ("rel_norm",), f"{prefix}encoder.LayerNorm", d)
    for i in range(c.num_layers):
        _layer_maps(maps, c, ("layers", i), f"{prefix}encoder.layer.{i}")
    return {at + path: tm for path, tm in maps.items()}


def deberta_tensor_maps(cls, c: DebertaConfig, prefix: str) -> dict[tuple, TensorMap]:
    """Every parameter of `cls` (`DebertaEncoder`, `DebertaSequenceClassifier` or
    `DebertaQuestionAnswering`) with its Hugging Face tensor."""
    if cls is DebertaEncoder:
        return trunk_maps(c, prefix)
    maps = trunk_maps(c, prefix, ("encoder",))
    d = c.hidden_size
    if cls is DebertaSequenceClassifier:
        _dense(maps, ("dense",), "pooler.dense", d, d)
        _dense(maps, ("out_proj",), "classifier", d, c.num_labels)
    elif cls is DebertaQuestionAnswering:
        _dense(maps, ("qa_outputs",), "qa_outputs", d, 2)
    else:
        raise TypeError(f"no DeBERTa tensor map for {cls.__name__}")
    return maps


def check_deberta_tensors(source: TensorSource, maps: dict[tuple, TensorMap], prefix: str,
                          c: DebertaConfig) -> None:
    """`tensor_map.check_tensors` over the trunk's names (other heads' tensors are ignored, and
    the position table under position_biased_input: false, as Hugging Face does)."""
    positions = f"{prefix}embeddings.position_embeddings.weight"
    ignored = set() if c.position_biased_input else {positions}
    check_tensors(source.folder, source, maps, "the DeBERTa config",
                  hint="check share_att_key, pos_att_type, relative_attention, norm_rel_ebd, "
                       "embedding_size, type_vocab_size",
                  ignore=ignored, within=(f"{prefix}embeddings.", f"{prefix}encoder."))


def read_deberta(cls, path, config: DebertaConfig, allow_pickle: bool = False, mesh=None,
                 rules=None):
    """A `cls` with the folder's tensors in `config.param_dtype`; with `mesh`, each device reads
    only its own slice of each tensor (`tensor_map.read_into`)."""
    source = TensorSource(path, allow_pickle=allow_pickle)
    prefix = "deberta." if any(k.startswith("deberta.") for k in source.keys()) else ""
    maps = deberta_tensor_maps(cls, config, prefix)
    check_deberta_tensors(source, maps, prefix, config)
    abstract = nnx.eval_shape(lambda: cls(config, nnx.Rngs(0)))
    return read_into(abstract, maps, source, config.param_dtype, mesh, rules)
