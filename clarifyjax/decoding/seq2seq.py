"""A seq2seq model run on texts: a T5 with its tokenizer, batched, bucketed and jitted.

`Seq2SeqModel`: texts -> ids padded to length buckets, rows padded to a multiple
(`buckets.padded_rows`, so that shapes repeat) -> jitted `decoding.generate` -> texts
(`GeneratedText`), decoded as a `Sampling` says (unset fields: `DEFAULTS`, greedy). The reward
pipeline runs the answer generator and the fusion model through it, the judge (`delphi.Judge`)
its judgment text, and the demo the question generator.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple
from collections.abc import Sequence

import jax
import numpy as np

from clarifyjax.core import sharding
from clarifyjax.text import formats
from clarifyjax.core.buckets import FINE_BUCKETS, pad_rows, padded_rows
from clarifyjax.decoding.api import generate
from clarifyjax.models.safetensors_io import CheckpointError, check_folder
from clarifyjax.models.t5 import T5
from clarifyjax.files.textfiles import check_texts
from clarifyjax.text.generator import Sampling
from clarifyjax.text.tokenizer import Tokenizer
from clarifyjax.models.hf import load_t5


# what a `Seq2SeqModel` uses for a `Sampling` field left None: greedy, at most 32 new tokens
DEFAULTS = Sampling(max_new_tokens=32, min_new_tokens=0, temperature=0.0, top_k=0, top_p=1.0)


class GeneratedText(NamedTuple):
    """texts: one per input (special tokens dropped, whitespace normalized);
    tokens: [n, max_new_tokens] int32; truncated_inputs: inputs cut to max_input_length."""

    texts: list[str]
    tokens: np.ndarray
    truncated_inputs: int


class Seq2SeqModel:
    """A T5 and its tokenizer: batched, bucketed, jitted text -> text.

    Inputs longer than `max_input_length` tokens are truncated (counted); batches are padded to
    `bucket_length(longest, length_buckets)` columns (steps of 8 and 16 by default: a padded
    column costs as much encoder work as a real one) and to `padded_rows(n, batch_multiple)` rows.

    mesh: a `sharding.process_mesh` the model's parameters live on (`from_pretrained(mesh=...)`
    loads them there, each device reading only its slice); inputs are then split over its data x
    fsdp devices, and `batch_multiple` grows to a multiple of their number.
    """

    def __init__(self, model: T5, tokenizer: Tokenizer, *, max_input_length: int = 128,
                 batch_multiple: int = 8, source: str = "model",
                 length_buckets: Sequence[int] = FINE_BUCKETS, mesh=None):
        c = model.config
        if tokenizer.pad_id != c.pad_token_id or tokenizer.eos_id != c.eos_token_id:
            raise CheckpointError(
                f"{source}: tokenizer pad/eos ids ({tokenizer.pad_id}, {tokenizer.eos_id}) differ "
                f"from the model's config.json pad_token_id/eos_token_id ({c.pad_token_id}, "
                f"{c.eos_token_id})")
        if tokenizer.vocab_size > c.vocab_size:
            raise CheckpointError(f"{source}: the tokenizer has {tokenizer.vocab_size} pieces but "
                                  f"the model's vocab_size is {c.vocab_size}")
        if max_input_length < 2:
            raise ValueError(f"{source}: max_input_length must be >= 2, got {max_input_length}")
        self.model, self.tokenizer, self.config = model, tokenizer, c
        self.max_input_length = int(max_input_length)
        self.length_buckets = tuple(int(b) for b in length_buckets)
        padded_rows(1, int(batch_multiple))  # validates the multiple
        self.mesh = mesh
        self.batch_multiple = math.lcm(int(batch_multiple), sharding.row_shards(mesh))
        self.source = source

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, tokenizer_path=None,
                        backend: str = "hf", dtype: str = "float32", mesh=None, rules=None,
                        precision: str = "default", **kwargs) -> Seq2SeqModel:
        """A Hugging Face T5 folder (safetensors) with its tokenizer (spiece.model /
        tokenizer.json, in `tokenizer_path` or the same folder); with `mesh`, the parameters are
        read straight into their shards by the logical axis `rules` (default
        `sharding.DEFAULT_RULES`); `precision`: of the model's matmuls (`T5Config.precision`)."""
        folder = check_folder(path)
        _, model = load_t5(folder, dtype=dtype, mesh=mesh, rules=rules, precision=precision)
        tokenizer = Tokenizer.from_pretrained(tokenizer_path or folder, backend=backend)
        return cls(model, tokenizer, source=str(folder), mesh=mesh, **kwargs)

    def encode(self, texts: Sequence[str], *, power_of_two_rows: bool = False
               ) -> tuple[np.ndarray, np.ndarray, int]:
        """ids, mask int32 [rows, bucket] and the number of truncated texts."""
        ids, mask, stats = self.tokenizer.encode_batch_with_stats(
            texts, self.max_input_length, pad_to="bucket", buckets=self.length_buckets)
        rows = padded_rows(len(texts), self.batch_multiple, power_of_two=power_of_two_rows)
        return pad_rows(ids, rows), pad_rows(mask, rows), stats.truncated

    def generate(self, texts: Sequence[str], sampling: Sampling = DEFAULTS, *,
                 rng: jax.Array | None = None, power_of_two_rows: bool = False) -> GeneratedText:
        """Decode a continuation of every text in one jitted call (`decoding.generate`); stop
        strings are not used."""
        texts = check_texts(texts, f"{self.source} inputs")
        sampling = sampling.with_defaults(DEFAULTS)
        if not texts:
            return GeneratedText([], np.zeros((0, sampling.max_new_tokens), np.int32), 0)
        if not sampling.greedy and rng is None:
            raise ValueError(f"{self.source}: sampling (temperature {sampling.temperature}) "
                             "needs an rng key")
        ids, mask, truncated = self.encode(texts, power_of_two_rows=power_of_two_rows)
        ids, mask = (sharding.place_rows(x, self.mesh) for x in (ids, mask))
        out = generate(self.model, ids, mask, rng=rng, max_new_tokens=sampling.max_new_tokens,
                       min_new_tokens=sampling.min_new_tokens, greedy=sampling.greedy,
                       temperature=sampling.temperature or 1.0, top_k=sampling.top_k,
                       top_p=sampling.top_p)
        tokens = np.asarray(jax.device_get(out.tokens))[: len(texts)]
        decoded = [formats.normalize_whitespace(t) for t in self.tokenizer.decode_batch(tokens)]
        return GeneratedText(decoded, tokens, truncated)
