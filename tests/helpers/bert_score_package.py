"""The `bert-score` package (0.3.13) as it ran under transformers 4: the reference of
clarifyjax.evaluation.bertscore and sage_jax.parascore. `package_score` runs the package's own
code with its two transformers 5 changes undone (described above it)."""
from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

from helpers.env import require


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


# Under transformers 5 two of the package's tokenizer calls changed meaning, restored here for the
# duration of a call: `encode(..., add_prefix_space=True)` is silently ignored by RoBERTa's
# tokenizer, so the shim prepends the space as transformers 4's `prepare_for_tokenization` did; and
# `build_inputs_with_special_tokens` (the package's encoding of an empty text) is gone, so the shim
# gives [CLS] [SEP] (<s> </s>), what it returned. Everything else is the package's own code.
def package_score(candidates, references, folder, layer, **kwargs):
    """`bert_score.score` on a local folder at `layer` -> (P, R, F) numpy float32.

    The package picks its model class from the name it is given: any name containing "t5" is
    loaded as a T5 encoder (`bert_score.utils.get_model`), a checkout at /work/fresh_t5 included.
    The folder is therefore given through a link whose path has no "t5" in it."""
    with _neutral_link(folder) as link, transformers4_tokenizer():
        import bert_score

        p, r, f = bert_score.score(list(candidates), list(references), model_type=str(link),
                                   num_layers=layer, nthreads=0, **kwargs)
    return p.numpy(), r.numpy(), f.numpy()


@contextlib.contextmanager
def _neutral_link(folder):
    """A temporary symlink to `folder` whose whole path lacks "t5" (a random temporary name can
    hold it: a new one is drawn)."""
    for _ in range(50):
        with tempfile.TemporaryDirectory(prefix="bertscore-") as tmp:
            link = Path(tmp) / "model"
            if "t5" not in str(link):
                link.symlink_to(Path(folder).resolve(), target_is_directory=True)
                yield link
                return
    raise RuntimeError(f"no temporary path without 't5' under {tempfile.gettempdir()}")


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
