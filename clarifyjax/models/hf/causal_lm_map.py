"""Hugging Face decoder-only checkpoints -> `clarifyjax.models.causal_lm`: the config of each
`model_type` (llama, mistral, qwen2, qwen3, opt, falcon) as a `CausalLMConfig`, and each family's
tensor maps (`causal_lm_tensor_maps`, the names listed above it), which `hf.load_causal_lm` loads
through. Falcon's fused query_key_value is split exactly as transformers' `_split_heads` does."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from clarifyjax.core.ranges import within
from clarifyjax.models.causal_lm import CausalLMConfig
from clarifyjax.models.causal_lm_layers import CAUSAL_LM_ACTIVATIONS
from clarifyjax.models.hf.tensor_map import (TensorMap, check_tensors, grid, linear, same_layout,
                                             vector)
from clarifyjax.models.safetensors_io import (CheckpointError, TensorSource, check_config_numbers,
                                             check_folder, read_config)

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "opt", "falcon")
_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")

CONFIG_RANGES = {
    **dict.fromkeys(("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "ffn_dim", "ffn_hidden_size", "word_embed_proj_dim",
                     "max_position_embeddings", "sliding_window"), "int >= 1"),
    **dict.fromkeys(("pad_token_id", "bos_token_id"), "int >= 0"),
    **dict.fromkeys(("rms_norm_eps", "layer_norm_epsilon"), "> 0"),  # rope_theta: ROPE_RANGES
}


# --------------------------------------------------------------------------- config


def eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))


# Each rotary setting's range (`clarifyjax.core.ranges`), as transformers' rope validation states
# it: a theta or a low / high frequency factor that is 0, negative or not a number makes the
# rotary angles NaN or infinite, and a scaling factor below 1 is not a scaling transformers reads.
ROPE_RANGES = {"rope_theta": "> 0", "factor": ">= 1", "low_freq_factor": "> 0",
               "high_freq_factor": "> 0", "original_max_position_embeddings": "int >= 1"}


def _rope_section(hf: dict, name: str, where: str) -> dict:
    value = hf.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: field {name!r} must be an object, got {value!r}")
    return value


def _rope_number(params: dict, sources: dict, name: str, where: str):
    """params[name] checked against ROPE_RANGES, naming the field where config.json holds it."""
    value, bound = params[name], ROPE_RANGES[name]
    integer = bound.startswith("int ")
    bound = bound.removeprefix("int ")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or (integer and not float(value).is_integer()) or not within(value, bound):
        kind = "an integer" if integer else "a finite number"
        raise CheckpointError(f"{where}: field '{sources[name]}' is {value!r}; must be {kind} "
                              f"{bound}")
    return int(value) if integer else float(value)


def _rope(hf: dict, where: str) -> dict:
    """rope_theta and scaling from `rope_parameters` (transformers 5) or the older top-level
    `rope_theta` + `rope_scaling`; every number is checked (`ROPE_RANGES`), the error naming the
    file and the field as config.json writes it (e.g. 'rope_parameters.rope_theta')."""
    params, sources = {"rope_theta": 10000.0}, {"rope_theta": "rope_theta"}
    for section, prefix in ((hf, ""), (_rope_section(hf, "rope_scaling", where), "rope_scaling."),
                            (_rope_section(hf, "rope_parameters", where), "rope_parameters.")):
        for key in ("rope_theta", "rope_type", "type", "partial_rotary_factor", *ROPE_RANGES):
            if key in section and (section is not hf or key in ("rope_theta",
                                                                "partial_rotary_factor")):
                params[key], sources[key] = section[key], prefix + key
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear", "llama3"):
        field = sources.get("rope_type", sources.get("type"))
        raise CheckpointError(f"{where}: field '{field}' is {kind!r}; supported: default, "
                              "linear, llama3")
    partial = params.get("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0) or isinstance(partial, bool):
        raise CheckpointError(f"{where}: field 'partial_rotary_factor' is {partial!r}; only "
                              "rotary embeddings over the whole head (1.0) are supported")
    out = dict(rope_theta=_rope_number(params, sources, "rope_theta", where), rope_type=kind)
    needed = {"linear": ("factor",), "default": (),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings")}[kind]
    for name in needed:
        if name not in params:
            raise CheckpointError(f"{where}: rope type {kind!r} needs field {name!r}")
    ours = {"factor": "rope_factor", "low_freq_factor": "rope_low_freq_factor",
            "high_freq_factor": "rope_high_freq_factor",
            "original_max_position_embeddings": "rope_original_max_positions"}
    out.update({ours[name]: _rope_number(params, sources, name, where) for name in needed})
    if kind == "llama3" and out["rope_high_freq_factor"] <= out["rope_low_freq_factor"]:
        raise CheckpointError(f"{where}: field '{sources['high_freq_factor']}' "
                              f"({out['rope_high_freq_factor']:g}) must be greater than "
                              f"'{sources['low_freq_factor']}' ({out['rope_low_freq_factor']:g})")
    return out


def _field(hf: dict, name: str, where: str):
    if hf.get(name) is None:
        raise CheckpointError(f"{where}: missing field {name!r}")
    return hf[name]


def _llama_like(hf: dict, where: str) -> dict:
    t = hf["model_type"]
    H, n = _field(hf, "hidden_size", where), _field(hf, "num_attention_heads", where)
    if t in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        raise CheckpointError(f"{where}: field 'use_sliding_window' is true; sliding-window "
                              f"layers of {t} are not supported")
    act = hf.get("hidden_act", "silu")
    bias = bool(hf.get("attention_bias", False))
    return dict(
        hidden_size=H, num_heads=n, num_layers=_field(hf, "num_hidden_layers", where),
        num_kv_heads=hf.get("num_key_value_heads") or n,
        head_dim=hf.get("head_dim") or H // n, ffn_size=_field(hf, "intermediate_size", where),
        norm="rms", norm_eps=float(hf.get("rms_norm_eps", 1e-6)), activation=act, gated_mlp=True,
        qkv_bias=True if t == "qwen2" else bias, out_bias=False if t == "qwen2" else bias,
        mlp_bias=bool(hf.get("mlp_bias", False)), qk_norm=t == "qwen3", positions="rope",
        sliding_window=hf.get("sliding_window") if t == "mistral" else None,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), **_rope(hf, where))


def _opt(hf: dict, where: str) -> dict:
    H, n = _field(hf, "hidden_size", where), _field(hf, "num_attention_heads", where)
    if hf.get("layer_norm_elementwise_affine", True) is False:
        raise CheckpointError(f"{where}: field 'layer_norm_elementwise_affine' is false; "
                              "OPT without layer-norm parameters is not supported")
    pre = bool(hf.get("do_layer_norm_before", True))
    bias = bool(hf.get("enable_bias", True))
    return dict(
        hidden_size=H, num_heads=n, num_kv_heads=n, head_dim=H // n,
        num_layers=_field(hf, "num_hidden_layers", where), ffn_size=_field(hf, "ffn_dim", where),
        embed_size=hf.get("word_embed_proj_dim") or H, norm="layer", norm_eps=1e-5,
        activation=hf.get("activation_function", "relu"), gated_mlp=False, qkv_bias=bias,
        out_bias=bias, mlp_bias=bias, positions="learned",
        block="sequential" if pre else "post_norm",
        final_norm=pre and not hf.get("_remove_final_layer_norm", False),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)))


def _falcon(hf: dict, where: str) -> dict:
    if hf.get("alibi"):
        raise CheckpointError(f"{where}: field 'alibi' is true; Falcon with ALiBi positions "
                              "is not supported (only rotary, alibi: false)")
    H, n = _field(hf, "hidden_size", where), _field(hf, "num_attention_heads", where)
    new = bool(hf.get("new_decoder_architecture", False))
    if new:
        kv = hf.get("num_kv_heads") or n
    else:
        kv = 1 if hf.get("multi_query", True) else n
    parallel = new or bool(hf.get("parallel_attn", True))
    norms = (hf.get("num_ln_in_parallel_attn") or 2) if new else 1
    bias = bool(hf.get("bias", False))
    return dict(
        hidden_size=H, num_heads=n, num_kv_heads=kv, head_dim=H // n,
        num_layers=_field(hf, "num_hidden_layers", where),
        ffn_size=hf.get("ffn_hidden_size") or 4 * H, norm="layer",
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        activation=hf.get("activation", "gelu"), gated_mlp=False, qkv_bias=bias, out_bias=bias,
        mlp_bias=bias, positions="rope", block="parallel" if parallel else "sequential",
        parallel_norms=norms, tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        **_rope(hf, where))


def config_from_hf(hf: dict, where: str | Path = "config.json", **overrides) -> CausalLMConfig:
    """A `CausalLMConfig` from a config.json dict; `overrides` (dtype, param_dtype,
    eos_token_ids) win. Errors name `where` and the field."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"{where}: field 'model_type' is {model_type!r}; supported "
                              f"decoder-only types: {', '.join(MODEL_TYPES)}")
    check_config_numbers(hf, where, CONFIG_RANGES)
    build = _opt if model_type == "opt" else _falcon if model_type == "falcon" else _llama_like
    fields = build(hf, str(where))
    if fields["activation"] not in CAUSAL_LM_ACTIVATIONS:
        raise CheckpointError(f"{where}: activation {fields['activation']!r} is not supported "
                              f"(known: {', '.join(CAUSAL_LM_ACTIVATIONS)})")
    if model_type == "falcon" and fields["hidden_size"] % fields["num_heads"]:
        raise CheckpointError(f"{where}: hidden_size is not a multiple of num_attention_heads")
    fields.update(model_type=model_type, vocab_size=_field(hf, "vocab_size", str(where)),
                  max_position_embeddings=hf.get("max_position_embeddings") or 2048,
                  bos_token_id=hf.get("bos_token_id"), pad_token_id=hf.get("pad_token_id"),
                  eos_token_ids=eos_ids(hf.get("eos_token_id")))
    fields.update(overrides)
    try:
        return CausalLMConfig(**fields)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: {e}") from e


# --------------------------------------------------------------------------- tensor maps


def _vector(name: str, shape: tuple[int, ...], rows: np.ndarray | None = None,
            size: int | None = None) -> TensorMap:
    """A 1-D tensor reshaped to `shape`, or picked by `rows` out of `size` (a part of Falcon's
    fused query_key_value)."""
    if rows is None:
        return vector(name, shape)
    return TensorMap(name, (size,), shape, tuple(range(len(shape))), rows)


def _linear(name: str, d_in: int, out_shape: tuple[int, ...],
            rows: np.ndarray | None = None, hf_out: int | None = None) -> TensorMap:
    """torch [out, in] -> ours [in, *out_shape]; `rows`: which of the `hf_out` HF rows make our
    out entries (a part of Falcon's fused query_key_value)."""
    if rows is None:
        return linear(name, (d_in,), out_shape)
    return TensorMap(name, (hf_out, d_in), (d_in, *out_shape),
                     tuple(range(1, 1 + len(out_shape))), rows, (0,), grid(d_in))


def falcon_qkv_rows(c: CausalLMConfig) -> dict[str, np.ndarray]:
    """Rows of Falcon's fused query_key_value weight that make our q [n, d], k and v [k, d]:
    k groups of (g = n/k queries, 1 key, 1 value) x d rows, as `_split_heads` of
    new_decoder_architecture reads it. The other two layouts are the same rule: multi_query
    is k = 1 ([n queries, key, value]) and the old multi-head layout is k = n
    ([(query, key, value)] per head)."""
    n, k, d = c.num_heads, c.num_kv_heads, c.head_dim
    g, e = n // k, np.arange(d)
    heads = np.arange(n)
    groups = np.arange(k)[:, None] * (g + 2)
    return dict(query=((heads // g) * (g + 2) + heads % g)[:, None] * d + e,
                key=(groups + g) * d + e, value=(groups + g + 1) * d + e)


def _attention(maps: dict, ours: tuple, names: dict, c: CausalLMConfig, prefix: str,
               fused: dict | None = None) -> None:
    """q/k/v/out kernels and biases; `names` maps query/key/value/out to HF module names;
    `fused`: Falcon's row tables into one query_key_value tensor."""
    H, n, k, d = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    total = (n + 2 * k) * d
    for part, heads in (("query", n), ("key", k), ("value", k)):
        rows = fused[part] if fused else None
        hf_name = prefix + (names["qkv"] if fused else names[part])
        maps[ours + (part,)] = _linear(hf_name + ".weight", H, (heads, d), rows,
                                       total if fused else None)
        if c.qkv_bias:
            maps[ours + (f"{part}_bias",)] = _vector(hf_name + ".bias", (heads, d), rows,
                                                     total if fused else None)
    maps[ours + ("out",)] = linear(prefix + names["out"] + ".weight", (n, d), (H,))
    if c.out_bias:
        maps[ours + ("out_bias",)] = _vector(prefix + names["out"] + ".bias", (H,))


def _feed_forward(maps: dict, ours: tuple, names: dict, c: CausalLMConfig, prefix: str) -> None:
    H, F = c.hidden_size, c.ffn_size
    for part in (("gate", "up") if c.gated_mlp else ("up",)):
        maps[ours + (part,)] = _linear(prefix + names[part] + ".weight", H, (F,))
        if c.mlp_bias:
            maps[ours + (f"{part}_bias",)] = _vector(prefix + names[part] + ".bias", (F,))
    maps[ours + ("down",)] = _linear(prefix + names["down"] + ".weight", F, (H,))
    if c.mlp_bias:
        maps[ours + ("down_bias",)] = _vector(prefix + names["down"] + ".bias", (H,))


def _norm(maps: dict, ours: tuple, hf_name: str, c: CausalLMConfig, size: int | None = None):
    size = size or c.hidden_size
    maps[ours + ("scale",)] = _vector(hf_name + ".weight", (size,))
    if c.norm == "layer":
        maps[ours + ("bias",)] = _vector(hf_name + ".bias", (size,))


# Each family's Hugging Face names:
#   llama / mistral / qwen2 / qwen3: model.embed_tokens, model.layers.{i}.self_attn.{q,k,v,o}_proj
#     (+ q_norm / k_norm for qwen3), mlp.{gate,up,down}_proj, input_layernorm,
#     post_attention_layernorm, model.norm, lm_head.
#   opt: model.decoder.embed_tokens, embed_positions, project_in/out, layers.{i}.self_attn.*,
#     self_attn_layer_norm, fc1, fc2, final_layer_norm, model.decoder.final_layer_norm.
#   falcon: transformer.word_embeddings, h.{i}.self_attention.query_key_value / dense,
#     mlp.dense_h_to_4h / dense_4h_to_h, input_layernorm / post_attention_layernorm /
#     ln_attn / ln_mlp, transformer.ln_f, lm_head.
def causal_lm_tensor_maps(config: CausalLMConfig) -> dict[tuple, TensorMap]:
    """NNX state path -> TensorMap, for every parameter of `CausalLM(config)`."""
    c = config
    V, E, H = c.vocab_size, c.embed_size, c.hidden_size
    maps: dict[tuple, TensorMap] = {}
    if c.model_type in _LLAMA_LIKE:
        top, layer = "model.", "model.layers.{}."
        maps[("embedding",)] = same_layout("model.embed_tokens.weight", (V, E))
        attention = dict(query="self_attn.q_proj", key="self_attn.k_proj",
                         value="self_attn.v_proj", out="self_attn.o_proj")
        mlp = dict(gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj")
        norms = ("input_layernorm", "post_attention_layernorm")
        final = "model.norm"
    elif c.model_type == "opt":
        top, layer = "model.decoder.", "model.decoder.layers.{}."
        maps[("embedding",)] = same_layout(top + "embed_tokens.weight", (V, E))
        maps[("position_embedding",)] = same_layout(top + "embed_positions.weight",
                                               (c.max_position_embeddings + 2, H))
        if E != H:
            maps[("project_in",)] = _linear(top + "project_in.weight", E, (H,))
            maps[("project_out",)] = _linear(top + "project_out.weight", H, (E,))
        attention = dict(query="self_attn.q_proj", key="self_attn.k_proj",
                         value="self_attn.v_proj", out="self_attn.out_proj")
        mlp = dict(up="fc1", down="fc2")
        norms = ("self_attn_layer_norm", "final_layer_norm")
        final = top + "final_layer_norm"
    else:  # falcon
        top, layer = "transformer.", "transformer.h.{}."
        maps[("embedding",)] = same_layout(top + "word_embeddings.weight", (V, E))
        attention = dict(qkv="self_attention.query_key_value", out="self_attention.dense")
        mlp = dict(up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h")
        if c.block == "sequential":
            norms = ("input_layernorm", "post_attention_layernorm")
        elif c.parallel_norms == 2:
            norms = ("ln_attn", "ln_mlp")
        else:
            norms = ("input_layernorm",)
        final = top + "ln_f"
    fused = falcon_qkv_rows(c) if c.model_type == "falcon" else None
    for i in range(c.num_layers):
        ours, prefix = ("layers", i), layer.format(i)
        _norm(maps, ours + ("attention_norm",), prefix + norms[0], c)
        if len(norms) == 2:
            _norm(maps, ours + ("mlp_norm",), prefix + norms[1], c)
        _attention(maps, ours + ("attention",), attention, c, prefix, fused)
        if c.qk_norm:
            _norm(maps, ours + ("attention", "query_norm"), prefix + "self_attn.q_norm", c,
                  c.head_dim)
            _norm(maps, ours + ("attention", "key_norm"), prefix + "self_attn.k_norm", c,
                  c.head_dim)
        _feed_forward(maps, ours + ("mlp",), mlp, c, prefix)
    if c.final_norm:
        _norm(maps, ("final_norm",), final, c)
    if not c.tie_word_embeddings:
        maps[("lm_head",)] = _linear("lm_head.weight", E, (V,))
    return maps


# In checkpoints but not parameters: rotary tables some exporters save.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "attn.bias", "attn.masked_bias")


def check_causal_lm_tensors(folder: Path, source: TensorSource, maps: dict[tuple, TensorMap],
                            config: CausalLMConfig) -> None:
    """`tensor_map.check_tensors`: every mapped tensor present with its shape, and no tensor
    left unmapped but rotary tables (and `lm_head.weight` when tied)."""
    what = f"the {config.model_type} config"
    check_tensors(folder, source, maps, what, hint="wrong switches or layer counts?",
                  ignore={"lm_head.weight"} if config.tie_word_embeddings else (),
                  ignore_suffixes=_IGNORED_SUFFIXES)


# --------------------------------------------------------------------------- generation_config


# transformers' `GenerationConfig` defaults, for what generation_config.json leaves out
GENERATION_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0,
                       "eos_token_ids": (), "max_new_tokens": None, "max_length": 20,
                       "pad_token_id": None}


GENERATION_RANGES = {"temperature": "> 0", "top_k": "int >= 0", "top_p": "(0, 1]",
                     "max_new_tokens": "int >= 1", "max_length": "int >= 1",
                     "pad_token_id": "int >= 0"}


def read_generation_defaults(path: str | Path, config_eos: tuple[int, ...] | None = None
                             ) -> dict:
    """The model's own sampling defaults, the keys of GENERATION_DEFAULTS: `path`/
    generation_config.json read as transformers reads it, its defaults where the file is missing
    or silent (what `model.generate(ids)` uses with no arguments: greedy unless do_sample;
    temperature / top_k / top_p apply only when sampling). Eos ids: the file's, else
    `config_eos` (None: those of config.json)."""
    folder = check_folder(path)
    if config_eos is None:
        config_eos = ()
        if (folder / "config.json").exists():
            config_eos = eos_ids(read_config(folder).get("eos_token_id"))
    file = folder / "generation_config.json"
    if not file.exists():
        return GENERATION_DEFAULTS | {"eos_token_ids": tuple(config_eos)}
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    check_config_numbers(data, file, GENERATION_RANGES)
    try:
        eos = eos_ids(data.get("eos_token_id")) or tuple(config_eos)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{file}: field 'eos_token_id' is {data.get('eos_token_id')!r}"
                              ) from e
    given = {k: data[k] for k in GENERATION_DEFAULTS if data.get(k) is not None}
    return GENERATION_DEFAULTS | given | {"eos_token_ids": eos}
