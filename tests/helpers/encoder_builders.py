"""Random Hugging Face encoders and padded batches for the encoder and DeBERTa parity tests."""
from __future__ import annotations

import numpy as np

from helpers.env import require


def randomize(model, seed: int = 0):
    """Redraw every weight (LayerNorm scales around 1) so that errors are not hidden by 0.02 init."""
    torch = require("torch")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.2
            p.copy_(1.0 + noise if "LayerNorm.weight" in name else noise)
    return model.eval()


def padded_batch(pad: int, vocab: int, seed: int = 0):
    """[3, 12] ids with padding after 12, 7 and 1 tokens (ids avoid the special tokens 0..3)."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(4, vocab, size=(3, 12))
    mask = np.ones_like(ids)
    for row, n in ((1, 7), (2, 1)):
        ids[row, n:], mask[row, n:] = pad, 0
    return ids, mask
