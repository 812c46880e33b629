"""Tiny random decoder-only models of every family and switch, made in torch `transformers` and
saved as safetensors, for the causal LM parity, bf16 and sharded tests (`make_hf_causal_lm`),
and mixed-length prompt batches (`prompts`, `left_padded`, `right_padded`)."""
from __future__ import annotations

import numpy as np

from helpers.env import require

VOCAB = 96
EOS = 3
# One layer (compiling is most of these tests' time), two for llama, whose layer index map is
# the one every family uses.
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
               max_position_embeddings=64, bos_token_id=1, eos_token_id=EOS, pad_token_id=0)
_LLAMA = dict(intermediate_size=48, rms_norm_eps=1e-5)

# name -> (transformers config class, its arguments): every model_type and switch of issue 12.
CASES = {
    "llama-gqa-llama3": ("LlamaConfig", dict(
        _LLAMA, num_hidden_layers=2, num_key_value_heads=2, attention_bias=True, mlp_bias=True,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=16),
        rope_theta=500.0)),
    "mistral-window": ("MistralConfig", dict(_LLAMA, num_key_value_heads=1, sliding_window=4,
                                             head_dim=None)),
    "qwen2-tied": ("Qwen2Config", dict(_LLAMA, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3-head-dim": ("Qwen3Config", dict(_LLAMA, num_key_value_heads=2, head_dim=12)),
    "opt-pre-ln": ("OPTConfig", dict(ffn_dim=48, word_embed_proj_dim=32,
                                     do_layer_norm_before=True)),
    "opt-pre-ln-project": ("OPTConfig", dict(ffn_dim=48, word_embed_proj_dim=16,
                                             do_layer_norm_before=True)),
    "opt-post-ln": ("OPTConfig", dict(ffn_dim=48, word_embed_proj_dim=16,
                                      do_layer_norm_before=False, initializer_range=0.35)),
    "falcon-multi-query-parallel": ("FalconConfig", dict(
        multi_query=True, parallel_attn=True, new_decoder_architecture=False, bias=False,
        ffn_hidden_size=48)),
    "falcon-new-architecture": ("FalconConfig", dict(
        new_decoder_architecture=True, num_kv_heads=2, bias=True, ffn_hidden_size=48)),
    "falcon-multi-head-sequential": ("FalconConfig", dict(
        multi_query=False, parallel_attn=False, new_decoder_architecture=False, bias=True,
        ffn_hidden_size=48)),
}


def make_hf_causal_lm(folder, case: str, seed: int = 0, **overrides):
    """A random torch model of `case`, saved as safetensors in `folder` -> the torch model.

    Weights are drawn with std 0.25 (0.35 for post-LN OPT, which repeats itself at 0.25)
    (transformers' 0.02 makes a tiny model's logits almost uniform, so greedy decoding would repeat
    one token and ties would decide it), and every 1-D parameter (norm scales, biases) gets noise so
    that a mix-up between them shows.
    """
    torch = require("torch")
    transformers = require("transformers")
    cls, kwargs = CASES[case]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cls)(**{**_COMMON, "initializer_range": 0.25, **kwargs,
                                        **overrides})
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model = model.float().eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(str(folder), safe_serialization=True)
    return model


def prompts(rng: np.random.RandomState, lengths) -> list[list[int]]:
    """Random prompts (ids 4..VOCAB-1: no pad, BOS or EOS) of the given lengths."""
    return [rng.randint(4, VOCAB, n).tolist() for n in lengths]


def right_padded(rows, length: int | None = None, pad: int = 0):
    length = length or max(map(len, rows))
    ids = np.full((len(rows), length), pad, np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    return ids, mask


def left_padded(rows, length: int | None = None, pad: int = 0):
    length = length or max(map(len, rows))
    ids = np.full((len(rows), length), pad, np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, length - len(r):], mask[i, length - len(r):] = r, 1
    return ids, mask


MAX_NEW = 8  # the new tokens of the sharded tests' `generate` calls


def batches():
    """(ids, mask) [8, 12] for the logits; (ids, mask) [16, <= 9] prompts and (ids, mask)
    [16, <= 7] targets for `score` and `generate`; a prefix of 7 tokens."""
    rng = np.random.RandomState(0)
    logits_batch = right_padded(prompts(rng, [1, 5, 12, 3, 9, 7, 10, 4]), 12)
    ids, mask = right_padded(prompts(rng, [3, 9, 1, 7, 6, 2, 9, 5, 4, 8, 2, 6, 1, 3, 7, 5]))
    targets, target_mask = right_padded(prompts(rng, [4, 1, 6, 2, 3, 5, 1, 2, 7, 3, 4, 1, 5, 2,
                                                      6, 3]))
    return logits_batch, (ids, mask), (targets, target_mask), prompts(rng, [7])[0]



# The tiny question policies of the RL tests: d_model 32, two layers, 128 positions, the
# vocabulary of `clarifyjax.models.tiny.tiny_causal_tokenizer` (259 ids: 256 bytes + 3 specials).
POLICY_CONFIGS = {
    "llama": dict(model_type="llama", intermediate_size=64, num_key_value_heads=2,
                  rms_norm_eps=1e-5, tie_word_embeddings=False),
    "qwen3": dict(model_type="qwen3", intermediate_size=48, num_key_value_heads=2, head_dim=12,
                  rms_norm_eps=1e-6, tie_word_embeddings=True),
}


def tiny_policy_folder(folder, family: str, seed: int = 0, tokenizer=None):
    """A tiny random decoder-only question policy of `family` (`POLICY_CONFIGS`) saved in
    `folder` by `hf.save_causal_lm` (config.json, model.safetensors, generation_config.json),
    with `tokenizer` (a transformers tokenizer; None: a new `tiny_causal_tokenizer`, vocabulary
    256 bytes, its Llama-2-like chat template; <s> = 1, </s> = 2). No torch. -> the tokenizer."""
    import json
    from pathlib import Path

    from flax import nnx

    from clarifyjax.models.causal_lm import CausalLM
    from clarifyjax.models.hf import causal_lm_map, save_causal_lm
    from clarifyjax.models.tiny import tiny_causal_tokenizer

    require("tokenizers")
    folder = Path(folder)
    if tokenizer is None:
        tokenizer = tiny_causal_tokenizer(folder, vocab_size=256)
    else:
        tokenizer.save_pretrained(str(folder))
    hf = {"vocab_size": len(tokenizer), "hidden_size": 32, "num_hidden_layers": 2,
          "num_attention_heads": 4, "max_position_embeddings": 128, "bos_token_id": 1,
          "eos_token_id": 2, **POLICY_CONFIGS[family]}
    (folder / "config.json").write_text(json.dumps(hf))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1,
                                                               "eos_token_id": 2}))
    config = causal_lm_map.config_from_hf(hf, folder / "config.json")
    save_causal_lm(CausalLM(config, rngs=nnx.Rngs(seed)), folder, folder)
    return tokenizer
