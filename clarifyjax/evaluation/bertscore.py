"""BERTScore exactly as the `bert-score` package (0.3.13) computes it, jitted and batched on the
project's BERT / RoBERTa encoder; sage_jax's consistency baseline, ParaScore and ClarifyDelphi's
evaluation all score through `bertscore`.

    p, r, f = bertscore(candidates, references, model="models/roberta-large")

The package's quirks reproduced (its batch padding included) are listed above `bertscore`."""
from __future__ import annotations

import collections
import csv
import functools
import io
import json
import math
import os
import warnings
from pathlib import Path
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clarifyjax.core import traces
from clarifyjax.core.buckets import (FINE_BUCKETS, POWER_OF_TWO_BUCKETS, SENTENCE_BUCKETS, bucket_length, bucket_rows,
                                length_sorted_batches, pad_sequences)
from clarifyjax.models.encoder import BertEncoder
from clarifyjax.models.hf.encoder_map import checked_maps, read_encoder_config
from clarifyjax.models.hf import load_encoder, load_encoder_tokenizer
from clarifyjax.models.safetensors_io import CheckpointError, check_folder
from clarifyjax.files.textfiles import check_texts, read_text_file

# bert_score.utils.model2layers (0.3.13), the BERT and RoBERTa models this encoder runs.
MODEL_LAYERS = {
    "bert-base-uncased": 9, "bert-large-uncased": 18, "bert-base-cased-finetuned-mrpc": 9,
    "bert-base-multilingual-cased": 9, "bert-base-chinese": 8, "roberta-base": 10,
    "roberta-large": 17, "roberta-large-mnli": 19, "roberta-base-openai-detector": 7,
    "roberta-large-openai-detector": 15, "allenai/scibert_scivocab_uncased": 8,
    "allenai/scibert_scivocab_cased": 9, "nfliu/scibert_basevocab_uncased": 9,
    "distilroberta-base": 5, "google/bert_uncased_L-2_H-128_A-2": 1,
    "google/bert_uncased_L-2_H-256_A-4": 1, "google/bert_uncased_L-2_H-512_A-8": 1,
    "google/bert_uncased_L-2_H-768_A-12": 2, "google/bert_uncased_L-4_H-128_A-2": 3,
    "google/bert_uncased_L-4_H-256_A-4": 3, "google/bert_uncased_L-4_H-512_A-8": 3,
    "google/bert_uncased_L-4_H-768_A-12": 3, "google/bert_uncased_L-6_H-128_A-2": 5,
    "google/bert_uncased_L-6_H-256_A-4": 5, "google/bert_uncased_L-6_H-512_A-8": 5,
    "google/bert_uncased_L-6_H-768_A-12": 5, "google/bert_uncased_L-8_H-128_A-2": 7,
    "google/bert_uncased_L-8_H-256_A-4": 7, "google/bert_uncased_L-8_H-512_A-8": 6,
    "google/bert_uncased_L-8_H-768_A-12": 7, "google/bert_uncased_L-10_H-128_A-2": 8,
    "google/bert_uncased_L-10_H-256_A-4": 8, "google/bert_uncased_L-10_H-512_A-8": 9,
    "google/bert_uncased_L-10_H-768_A-12": 8, "google/bert_uncased_L-12_H-128_A-2": 10,
    "google/bert_uncased_L-12_H-256_A-4": 11, "google/bert_uncased_L-12_H-512_A-8": 10,
    "google/bert_uncased_L-12_H-768_A-12": 9, "SpanBERT/spanbert-base-cased": 8,
    "SpanBERT/spanbert-large-cased": 17, "ProsusAI/finbert": 10,
    "princeton-nlp/unsup-simcse-bert-base-uncased": 10,
    "princeton-nlp/unsup-simcse-bert-large-uncased": 18,
    "princeton-nlp/unsup-simcse-roberta-base": 8, "princeton-nlp/unsup-simcse-roberta-large": 13,
    "princeton-nlp/sup-simcse-bert-base-uncased": 10,
    "princeton-nlp/sup-simcse-bert-large-uncased": 18,
    "princeton-nlp/sup-simcse-roberta-base": 10, "princeton-nlp/sup-simcse-roberta-large": 16,
    "dbmdz/bert-base-turkish-cased": 10,
}
PAIRS_PER_CALL = 256  # pairs per jitted matching call (the matching is cheap; few calls)
TEXTS_PER_CALL = 64  # texts per encoder call, whatever the package's batch_size
# From this many texts on, the encoder pads to the sentence embedder's finer buckets (less padding,
# more shapes to compile); fewer texts use FINE_BUCKETS (few compilations for small calls).
MANY_TEXTS = 2048


def default_layer(name: str | None) -> int | None:
    """The package's default layer for a model name ("bert-base-uncased" -> 9), else None."""
    if not name:
        return None
    return MODEL_LAYERS.get(name, MODEL_LAYERS.get(name.rsplit("/", 1)[-1]))


def _model_names(folder: Path) -> list[str]:
    """Names a folder may go by: a hub cache's `models--org--name/snapshots/<hash>`, the folder's
    own name, its config.json `_name_or_path`."""
    names = [p[len("models--"):].replace("--", "/") for p in folder.parts if p.startswith("models--")]
    names.append(folder.name)
    try:
        names.append(str(json.loads((folder / "config.json").read_text()).get("_name_or_path") or ""))
    except (OSError, ValueError):
        pass
    return [n for n in names if n]


def transformer_folder(path: str | os.PathLike) -> Path:
    """The Hugging Face folder inside `path`: itself, or a sentence-transformers folder's
    Transformer module (modules.json) when config.json is not at its top."""
    folder = check_folder(path)
    if (folder / "config.json").exists() or not (folder / "modules.json").exists():
        return folder
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except ValueError as e:
        raise CheckpointError(f"{folder / 'modules.json'}: invalid JSON ({e})") from e
    for module in modules:
        if str(module.get("type", "")).endswith("Transformer"):
            return folder / module.get("path", "")
    raise CheckpointError(f"{folder / 'modules.json'} lists no Transformer module and {folder} has "
                          "no config.json")


def _folder_name(folder: Path, path) -> str | None:
    """The name a folder goes by: the first that bert-score's layer table knows, else its own."""
    names = _model_names(folder) + _model_names(Path(path))
    return next((n for n in names if default_layer(n) is not None), names[0] if names else None)


def _resolve_layer(name: str | None, num_layers: int, layer: int | None) -> int:
    if layer is None:
        layer = default_layer(name)
        if layer is None:
            raise ValueError(f"no default BERTScore layer for {name!r} (not in bert-score's "
                             f"model2layers table); give layer= (0 .. {num_layers})")
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not (
            0 <= layer <= num_layers):
        raise ValueError(f"layer must be an integer in [0, {num_layers}] for {name!r}, got "
                         f"{layer!r}")
    return int(layer)


def check_layer(path: str | os.PathLike, layer: int | None) -> int:
    """The layer `bertscore` would read for the folder at `path` (its config only, no weights):
    ValueError when `layer` is None and the package has no default for the model, or when
    `layer` is past the model's depth. For checks before long work."""
    folder = transformer_folder(path)
    return _resolve_layer(_folder_name(folder, path), read_encoder_config(folder).num_layers, layer)


def check_model_folder(path: str | os.PathLike, layer: int | None = None) -> None:
    """What `BertScoreModel.from_folder` checks before it reads a weight (config.json, the
    tokenizer, every tensor's name and shape in the safetensors headers) and a `layer` given
    against the model's depth. For checks before long work."""
    folder = transformer_folder(path)
    config = read_encoder_config(folder)
    checked_maps(BertEncoder, folder, config)
    load_encoder_tokenizer(folder, config.max_tokens, config.vocab_size)
    if layer is not None and layer > config.num_layers:
        raise ValueError(f"layer {layer} is past the {config.num_layers} layers of {folder}")


class BertScoreModel:
    """An encoder and its tokenizer, as BERTScore reads them: `from_folder`, then pass it as
    `bertscore(..., model=...)`. Forwards are jitted per (layer, rows, length) and counted in
    `clarifyjax.core.traces` under "bertscore.embed"."""

    def __init__(self, encoder, tokenizer, *, name: str | None = None, max_length: int):
        self.config = encoder.config
        self.tokenizer = tokenizer
        self.name = name
        self.max_length = max_length
        self.prefix_space = self.config.model_type == "roberta"
        vocab = tokenizer.get_vocab()
        cls, sep = ("<s>", "</s>") if self.prefix_space else ("[CLS]", "[SEP]")
        if cls not in vocab or sep not in vocab:
            raise CheckpointError(f"the tokenizer of {name or 'the model'} lacks {cls} or {sep}")
        self.cls_id, self.sep_id = vocab[cls], vocab[sep]
        self._graphdef, self._state = nnx.split(encoder)

    @classmethod
    def from_folder(cls, path: str | os.PathLike, *, dtype: str = "float32") -> BertScoreModel:
        """A BERT / RoBERTa folder, or a sentence-transformers folder holding one."""
        folder = transformer_folder(path)
        config = read_encoder_config(folder)
        max_length = config.max_tokens
        tokenizer_config = folder / "tokenizer_config.json"
        if tokenizer_config.exists():  # the package truncates at the tokenizer's model_max_length
            stated = json.loads(tokenizer_config.read_text()).get("model_max_length")
            if isinstance(stated, (int, float)) and 2 <= stated < max_length:
                max_length = int(stated)
        name = _folder_name(folder, path)
        return cls(load_encoder(folder, dtype=dtype),
                   load_encoder_tokenizer(folder, max_length, config.vocab_size), name=name,
                   max_length=max_length)

    def resolve_layer(self, layer: int | None) -> int:
        """`layer`, or the package's default for this model; checked against the model's depth."""
        return _resolve_layer(self.name, self.config.num_layers, layer)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text as the package's `sent_encode` makes them."""
        out: list[list[int]] = [[self.cls_id, self.sep_id]] * len(texts)
        stripped = [t.strip() for t in texts]
        todo = [i for i, t in enumerate(stripped) if t]
        if todo:
            prefix = " " if self.prefix_space else ""
            for i, enc in zip(todo, self.tokenizer.encode_batch([prefix + stripped[i] for i in todo])):
                out[i] = list(enc.ids)
        return out

    @functools.partial(jax.jit, static_argnums=(0, 2))
    def _embed(self, state, layer, input_ids, attention_mask):
        """[rows, length] ids -> unit token vectors of hidden_states[layer], [rows, length, d]."""
        traces.note(("bertscore.embed", layer, *input_ids.shape))
        encoder = nnx.merge(self._graphdef, state)
        mask = attention_mask.astype(bool)
        x = encoder.embeddings(input_ids, jnp.zeros_like(input_ids))
        for block in encoder.layers[:layer]:
            x = block(x, mask)
        x = x.astype(jnp.float32)
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    def token_vectors(self, ids: Sequence[Sequence[int]], layer: int,
                      batch_size: int = TEXTS_PER_CALL) -> list[np.ndarray]:
        """Per text, its unit token vectors [len_i, d] at `layer`, in length-sorted batches
        padded to `buckets.FINE_BUCKETS`, or `SENTENCE_BUCKETS` from MANY_TEXTS texts on."""
        lengths = [len(x) for x in ids]
        buckets = SENTENCE_BUCKETS if len(ids) >= MANY_TEXTS else FINE_BUCKETS
        out: list[np.ndarray] = [None] * len(ids)  # type: ignore[list-item]
        pending = []
        for index in length_sorted_batches(lengths, batch_size):
            length = bucket_length(max(lengths[i] for i in index), buckets, cap=self.max_length)
            rows = bucket_rows(len(index), batch_size)
            batch = pad_sequences([ids[i] for i in index], rows, length, self.config.pad_token_id)
            mask = pad_sequences([[1] * lengths[i] for i in index], rows, length, 0)
            pending.append((index, self._embed(self._state, layer, batch, mask)))
        for index, vectors in pending:
            vectors = np.asarray(vectors)
            for row, i in enumerate(index):
                out[i] = vectors[row, :lengths[i]]
        return out


@functools.lru_cache(maxsize=2)
def _load_cached(path: str) -> BertScoreModel:
    return BertScoreModel.from_folder(path)


def load_model(model: str | os.PathLike | BertScoreModel) -> BertScoreModel:
    """A `BertScoreModel` from a folder path (the last two folders stay loaded) or as given."""
    if isinstance(model, BertScoreModel):
        return model
    if isinstance(model, (str, os.PathLike)):
        return _load_cached(str(Path(model).resolve()))
    raise TypeError(f"model must be a folder path or a BertScoreModel, got {type(model).__name__}")


def read_baseline(path: str | os.PathLike, layer: int) -> np.ndarray:
    """[3] float64 (P, R, F) baselines of `layer`: row `layer` after the header of a comma-separated
    file LAYER,P,R,F (what the package reads with pandas, by row position)."""
    text = read_text_file(path)
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
    if not rows or [c.strip() for c in rows[0][1:4]] != ["P", "R", "F"]:
        raise ValueError(f"{path}:1: a BERTScore baseline file starts with the header LAYER,P,R,F")
    if not 0 <= layer < len(rows) - 1:
        raise ValueError(f"{path}: no row for layer {layer} ({len(rows) - 1} layers)")
    row = rows[layer + 1]
    try:
        values = np.array([float(c) for c in row[1:4]], np.float64)
    except (ValueError, IndexError):
        values = np.array([math.nan])
    if values.shape != (3,) or not np.all(np.isfinite(values)) or np.any(values >= 1):
        raise ValueError(f"{path}: the row of layer {layer} ({','.join(row)}) must hold three finite "
                         "baselines P, R, F below 1")
    return values


def _references(references, n: int) -> tuple[list[str], np.ndarray]:
    """Flat references and each candidate's [start, stop) in them."""
    if isinstance(references, (str, bytes)) or len(references) != n:
        size = "a string" if isinstance(references, (str, bytes)) else len(references)
        raise ValueError(f"references must hold one entry (a string or a list of strings) per "
                         f"candidate: {n} candidates, got {size}")
    flat: list[str] = []
    bounds = np.zeros((n, 2), np.int64)
    for i, ref in enumerate(references):
        group = [ref] if isinstance(ref, str) else check_texts(ref, f"references[{i}]")
        if not group:
            raise ValueError(f"references[{i}] is an empty list; give at least one reference")
        bounds[i] = (len(flat), len(flat) + len(group))
        flat.extend(group)
    check_texts(flat, "references")
    return flat, bounds


def _token_weights(model: BertScoreModel, ref_ids: list[list[int]], idf: bool):
    """token id -> weight, as the package's idf_dict."""
    if not idf:
        weights = collections.defaultdict(lambda: 1.0)
        weights[model.sep_id] = 0.0
        weights[model.cls_id] = 0.0
        return weights
    m = len(ref_ids)
    df = collections.Counter(t for ids in ref_ids for t in set(ids))
    weights = collections.defaultdict(lambda: math.log(m + 1))
    weights.update({t: math.log((m + 1) / (c + 1)) for t, c in df.items()})
    return weights


def _floors(cand_len: np.ndarray, ref_len: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Where the package's padding floors a best match at 0: (precision: the reference is shorter
    than the longest reference of its batch of `batch_size` pairs, recall: the same for the
    candidate)."""
    n = len(cand_len)
    batch = np.arange(n) // batch_size
    longest = lambda x: np.maximum.reduceat(x, np.arange(0, n, batch_size))[batch]  # noqa: E731
    return ref_len < longest(ref_len), cand_len < longest(cand_len)


@jax.jit
def greedy_match(cand, cand_weight, ref, ref_weight, floor_p, floor_r):
    """P, R, F of each pair by greedy matching.

    Args:
      cand, ref: [pairs, length, d] unit token vectors (padding: anything).
      cand_weight, ref_weight: [pairs, length] token weights (padding: 0), with a mask
        implied by position < the text's length, passed as weight >= 0 and `*_len`.
      floor_p, floor_r: [pairs] bool, the package's zero floor on best matches (`_floors`).
    Returns:
      [pairs, 3] float32 (P, R, F); P = R = 0 for an empty text, F = 0 where it is NaN.
    """
    traces.note(("bertscore.match", *cand.shape))
    cand_w, cand_mask = cand_weight[..., 0], cand_weight[..., 1] > 0
    ref_w, ref_mask = ref_weight[..., 0], ref_weight[..., 1] > 0
    sim = jnp.einsum("bid,bjd->bij", cand, ref, precision=jax.lax.Precision.HIGHEST)
    sim = jnp.where(cand_mask[:, :, None] & ref_mask[:, None, :], sim, -jnp.inf)
    best_p = jnp.max(sim, axis=2)
    best_p = jnp.where(floor_p[:, None], jnp.maximum(best_p, 0.0), best_p)
    best_r = jnp.max(sim, axis=1)
    best_r = jnp.where(floor_r[:, None], jnp.maximum(best_r, 0.0), best_r)
    p = jnp.sum(jnp.where(cand_mask, best_p, 0.0) * (cand_w / jnp.sum(cand_w, axis=1, keepdims=True)), axis=1)
    r = jnp.sum(jnp.where(ref_mask, best_r, 0.0) * (ref_w / jnp.sum(ref_w, axis=1, keepdims=True)), axis=1)
    f = 2 * p * r / (p + r)
    empty = (jnp.sum(cand_mask, axis=1) == 2) | (jnp.sum(ref_mask, axis=1) == 2)
    p, r = jnp.where(empty, 0.0, p), jnp.where(empty, 0.0, r)
    return jnp.stack([p, r, jnp.where(jnp.isnan(f), 0.0, f)], axis=-1)


def _pack(vectors, weights, index, length: int, rows: int, d: int):
    """[rows, length, d] vectors and [rows, length, 2] (weight, is-token) of texts `index`."""
    x = np.zeros((rows, length, d), np.float32)
    w = np.zeros((rows, length, 2), np.float32)
    for row, t in enumerate(index):
        k = len(vectors[t])
        x[row, :k] = vectors[t]
        w[row, :k, 0] = weights[t]
        w[row, :k, 1] = 1.0
    return x, w


class EmptyTextWarning(UserWarning):
    """`bertscore` met a text with no tokens: its raw P and R are 0, as the package sets them."""


def _warn_empty(empty_candidates: list[bool], empty_references: list[bool],
                bounds: np.ndarray) -> None:
    """One `EmptyTextWarning` counting the empty candidates and references, naming the first of
    each (the package prints "Empty candidate / reference sentence detected")."""
    parts = []
    if any(empty_candidates):
        parts.append(f"{sum(empty_candidates)} empty candidate(s) (the first: candidates"
                     f"[{empty_candidates.index(True)}])")
    if any(empty_references):
        j = empty_references.index(True)
        i = int(np.searchsorted(bounds[:, 1], j, side="right"))
        parts.append(f"{sum(empty_references)} empty reference(s) (the first: references[{i}])")
    if parts:
        warnings.warn(f"bertscore: {' and '.join(parts)}: their raw P and R are 0, as bert-score "
                      "sets them", EmptyTextWarning, stacklevel=3)


# What the package does and this module reproduces (bert_score/utils.py, score.py):
# - each text is stripped and tokenized with the model's special tokens, truncated at the
#   tokenizer's `model_max_length`; RoBERTa texts get a prefix space; an empty text is the special
#   tokens alone (transformers 5 broke the package there; we give what it gave under transformers 4);
# - token vectors are `hidden_states[layer]` (0 = the embeddings), the layer by default the
#   package's per-model table (`MODEL_LAYERS`);
# - greedy matching on cosines, special tokens included; weights 1 without idf but 0 for
#   [CLS] / [SEP], with idf log((M + 1) / (df + 1)) over the M references; P = sum_i w_i max_j
#   cos(c_i, r_j) / sum_i w_i, R likewise, F = 2PR / (P + R);
# - its batch padding leaks in: a text shorter than its batch's longest meets padded positions of
#   similarity 0, so a best match is at least 0 (`_floors`; it matters only where every cosine of a
#   token is negative);
# - a text of no tokens scores P = R = 0, a NaN F is 0; with several references each of P, R, F is
#   the maximum over them, separately; rescaling is (x - b) / (1 - b) per P, R, F.
def bertscore(candidates: Sequence[str], references, *, model, layer: int | None = None,
              idf: bool = False, baseline: str | os.PathLike | None = None, batch_size: int = 64
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BERTScore (P, R, F) of each candidate against its reference(s), as `bert_score.score`.

    Args:
      candidates: N texts.
      references: N entries, each a text or a list of texts (each of P, R, F is then the best
        over the candidate's references).
      model: a BERT / RoBERTa (or sentence-transformers) folder, or a `BertScoreModel`.
      layer: hidden_states index (0 = embeddings); default the package's for the model.
      idf: weight tokens by idf over the references.
      baseline: a baseline file (LAYER,P,R,F rows): rescale as `(x - b) / (1 - b)`.
      batch_size: the package's `batch_size`, whose padding the scores reproduce (keep it equal to
        the package's to match it exactly); our batches are shaped for speed (`TEXTS_PER_CALL`,
        `PAIRS_PER_CALL`).
    Returns:
      (P, R, F), each [N] float32 numpy arrays.

    Every check is eager (nothing here runs under `jit`): candidates and each reference are
    encodable `str` (a ValueError naming the argument and index), one reference entry per
    candidate and no empty list of them, batch_size an integer >= 1, the layer within the model,
    the baseline file's row. An empty text (nothing left once stripped and tokenized) is scored
    as the package scores it, raw P = R = 0 (F 0), with one `EmptyTextWarning` that counts the
    empty candidates and references and names the first of each.
    """
    candidates = check_texts(candidates, "candidates")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    flat_refs, bounds = _references(references, len(candidates))
    model = load_model(model)
    layer = model.resolve_layer(layer)
    base = None if baseline is None else read_baseline(baseline, layer)
    if not candidates:
        return tuple(np.zeros(0, np.float32) for _ in range(3))  # type: ignore[return-value]
    pair_cands = [c for c, (a, b) in zip(candidates, bounds) for _ in range(a, b)]

    texts = list(dict.fromkeys(pair_cands + flat_refs))
    position = {t: i for i, t in enumerate(texts)}
    ids = model.encode(texts)
    _warn_empty([len(ids[position[c]]) <= 2 for c in candidates],
                [len(ids[position[r]]) <= 2 for r in flat_refs], bounds)
    token_weight = _token_weights(model, [ids[position[r]] for r in flat_refs], idf)
    weights = [np.array([token_weight[t] for t in x], np.float32) for x in ids]
    vectors = model.token_vectors(ids, layer)

    cand_t = np.array([position[c] for c in pair_cands])
    ref_t = np.array([position[r] for r in flat_refs])
    lengths = np.array([len(x) for x in ids])
    floor_p, floor_r = _floors(lengths[cand_t], lengths[ref_t], batch_size)
    scores = np.zeros((len(pair_cands), 3), np.float32)
    d = model.config.hidden_size
    pending = []
    for index in length_sorted_batches(np.maximum(lengths[cand_t], lengths[ref_t]), PAIRS_PER_CALL):
        length = bucket_length(int(max(lengths[cand_t[index]].max(), lengths[ref_t[index]].max())),
                               POWER_OF_TWO_BUCKETS)
        rows = bucket_rows(len(index), PAIRS_PER_CALL)
        c, cw = _pack(vectors, weights, cand_t[index], length, rows, d)
        r, rw = _pack(vectors, weights, ref_t[index], length, rows, d)
        fp = np.zeros(rows, bool)
        fr = np.zeros(rows, bool)
        fp[:len(index)], fr[:len(index)] = floor_p[index], floor_r[index]
        pending.append((index, greedy_match(c, cw, r, rw, fp, fr)))
    for index, out in pending:
        scores[index] = np.asarray(out)[:len(index)]

    best = np.stack([scores[a:b].max(axis=0) for a, b in bounds])
    if base is not None:
        best = ((best - base) / (1 - base)).astype(np.float32)
    return best[:, 0], best[:, 1], best[:, 2]
