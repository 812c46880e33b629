"""The `bert-score` package (0.3.13) as it ran under transformers 4, the reference of
clarifyjax.evaluation.bertscore and sage_jax.parascore.

Under transformers 5 two of its tokenizer calls changed meaning, and `package_score` restores
transformers 4's behaviour for the duration of a call:
* `encode(..., add_prefix_space=True)` is silently ignored by RoBERTa's tokenizer, so the package
  no longer adds the prefix space it asks for; the shim prepends it, as transformers 4's
  `prepare_for_tokenization` did;
* `build_inputs_with_special_tokens` (the package's encoding of an empty text) is gone; the shim
  gives [CLS] [SEP] (<s> </s>), what it returned.
Everything else (model, layers, idf, greedy matching, padding, rescaling) is the package's own code.
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from conftest import require


@contextlib.contextmanager
def transformers4_tokenizer():
    require("bert_score")
    module = sys.modules["bert_score.score"]
    original = module.get_tokenizer

    def get_tokenizer(model_type, use_fast=False):
        tokenizer = original(model_type, use_fast)
        encode = tokenizer.encode

        def encode_with_prefix(text, *args, add_prefix_space=False, **kwargs):
            if add_prefix_space and text and not text[0].isspace():
                text = " " + text
            return encode(text, *args, **kwargs)

        tokenizer.encode = encode_with_prefix
        tokenizer.build_inputs_with_special_tokens = (
            lambda ids: [tokenizer.cls_token_id, *ids, tokenizer.sep_token_id])
        return tokenizer

    module.get_tokenizer = get_tokenizer
    try:
        yield
    finally:
        module.get_tokenizer = original


def package_score(candidates, references, folder, layer, **kwargs):
    """`bert_score.score` on a local folder at `layer` -> (P, R, F) numpy float32."""
    with transformers4_tokenizer():
        import bert_score

        p, r, f = bert_score.score(list(candidates), list(references), model_type=str(folder),
                                   num_layers=layer, nthreads=0, **kwargs)
    return p.numpy(), r.numpy(), f.numpy()


def write_baseline(path: Path, layers: int, seed: int = 0) -> Path:
    """A rescaling baseline file in the package's format (comma-separated LAYER,P,R,F)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = ["LAYER,P,R,F"] + [f"{i},{','.join(f'{v:.8f}' for v in rng.uniform(0.2, 0.8, 3))}"
                              for i in range(layers + 1)]
    path.write_text("\n".join(rows) + "\n")
    return path


def tiny_roberta_folder(folder: Path, *, seed: int = 3, num_layers: int = 3) -> Path:
    """A random RoBERTa folder whose token vectors have negative cosines (no token-type vector
    or LayerNorm bias shared by every token), with a byte-level BPE that adds no prefix space
    itself (as roberta-base's), and model_max_length in tokenizer_config.json."""
    import torch
    from tokenizers import pre_tokenizers

    from clarifyjax.models.tiny import random_classifier, tiny_bpe_tokenizer

    tokenizer = tiny_bpe_tokenizer("roberta")
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model = random_classifier(("a", "b"), model_type="roberta", seed=seed,
                              vocab_size=tokenizer.get_vocab_size(), num_layers=num_layers)
    with torch.no_grad():
        model.roberta.embeddings.token_type_embeddings.weight.zero_()
        model.roberta.embeddings.LayerNorm.bias.zero_()
    model.save_pretrained(str(folder))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"model_max_length": 127, "tokenizer_class": "RobertaTokenizer"}))
    return folder
