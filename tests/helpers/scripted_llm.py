"""A tiny Llama folder that writes a fixed script, for tests that need a local causal LM whose text
the pipeline's parsers accept (a random model never writes a numbered list); how is written
above `scripted_llama_folder`."""
from __future__ import annotations

from pathlib import Path

import numpy as np

SCRIPT = ("1. Is it ever right to lie to a good friend?\n",
          "2. Would you say lying to a friend is fine?\n",
          "3. Can a person lie to their friend and be right?\n",
          "4. Is lying to friends morally acceptable?\n",
          "5. Should someone ever tell a friend a lie?\n",
          "6. Are lies between friends ever justified?\n")


# The script's lines are added to the tiny byte-level BPE as whole tokens. The weights are a random
# `LlamaForCausalLM`'s (std 0.02), except the embedding and the head: every token that is not a
# script line embeds to one direction, line j to its own, all orthonormal and scaled up so that the
# random layers barely move them, and the head maps each direction to the next line (any other token
# -> line 0, the last line -> EOS) with a margin of ~40 nats. So whatever the prompt, greedy and
# top-k sampling alike write the script, then stop, through the real model code.
def scripted_llama_folder(root: Path, script=SCRIPT, *, hidden: int = 64, layers: int = 2,
                          max_position_embeddings: int = 4096,
                          generation: dict | None = None) -> Path:
    import torch
    import transformers

    from clarifyjax.models.tiny import tiny_causal_tokenizer

    folder = Path(root) / "scripted_llama"
    if (folder / "model.safetensors").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tok = tiny_causal_tokenizer(folder)
    tok.add_tokens(list(script))
    tok.save_pretrained(str(folder))
    line_ids = tok.convert_tokens_to_ids(list(script))
    eos = tok.eos_token_id
    assert len(script) + 1 <= hidden, "one direction per line and one for every other token"
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings, bos_token_id=1, eos_token_id=eos,
        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()  # transformers' init: std 0.02
    directions = np.linalg.qr(np.random.RandomState(0).randn(hidden, hidden))[0].T  # orthonormal rows
    other = directions[len(script)]
    embed = np.tile(other, (len(tok), 1))
    head = np.zeros((len(tok), hidden))
    for j, token in enumerate(line_ids):
        embed[token] = directions[j]
        head[token] = directions[j - 1] if j else other  # line j follows line j - 1 (0: anything)
    head[eos] = directions[len(script) - 1]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.tensor(10.0 * embed, dtype=torch.float32))
        model.lm_head.weight.copy_(torch.tensor(5.0 * head, dtype=torch.float32))
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=1, eos_token_id=eos, **(generation or {"do_sample": True, "top_k": 10}))
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder
