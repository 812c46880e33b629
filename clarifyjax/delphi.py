"""The moral judge, P(bad, ok, good) of a text, and the seq2seq runner shared by the reward models.

`Judge`: a T5 read through class tokens, as Delphi.

    input   "[moral_single]: " + text
    target  "<class>{1|0|-1}</class> <text>{judgment}</text>"

The original (allenai/clarifydelphi, `DelphiScorer.score_batch`) greedily generated 200 tokens
and read the softmax over the vocabulary at decoder step 4 (after `▁ <unk> class >`) in the
columns of "1", "0", "-1"; the reward then normalized those three numbers. Here the prefix is
teacher-forced: one decoder pass over [start, prefix...], and the logits of the class tokens at
the last position are softmaxed over those tokens only, which equals the normalized columns of
the full softmax. The prefix ids come from the judge's own tokenizer; each class token must be
exactly one vocabulary id right after the prefix, or loading fails naming the token.

`ClassifierJudge`: a BERT / RoBERTa sequence classifier with three labels, same interface.

`Seq2SeqModel`: a T5 with its tokenizer: texts -> ids padded to length buckets, rows padded to a
multiple (so that shapes repeat) -> jitted `decoding.generate` -> texts. The reward pipeline runs
the answer generator and the fusion model through it, the judge its judgment text.

Every judge distribution is `[batch, 3]` float32 in the order (bad, ok, good)
(`text.JUDGE_CLASSES`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clarifyjax.buckets import FINE_BUCKETS
from clarifyjax import sharding as sharding_lib
from clarifyjax import text as text_lib
from clarifyjax import traces
from clarifyjax.decoding import generate
from clarifyjax.models.checkpoint_io import CheckpointError, check_folder, read_config
from clarifyjax.models.t5 import T5
from clarifyjax.tokenizer import Tokenizer


DELPHI_CLASS_STEP = 4  # `▁ <unk> class >` in T5's vocabulary: Delphi reads the class at step 4


def _where(source: str | None) -> str:
    return f"{source}: " if source else ""


def padded_rows(n: int, multiple: int, *, power_of_two: bool = False) -> int:
    """Rows of a batch holding n texts: n rounded up to `multiple` (or to multiple * 2^k), so
    that a few batch shapes repeat and each jitted function compiles once per shape."""
    if multiple < 1:
        raise ValueError(f"padded_rows: multiple must be >= 1, got {multiple}")
    blocks = max(1, -(-n // multiple))
    if power_of_two:
        blocks = 1 << (blocks - 1).bit_length()
    return blocks * multiple


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """Repeat the last row up to `rows` rows (a copy of a real row finishes with it)."""
    if array.shape[0] >= rows:
        return array
    filler = np.repeat(array[-1:], rows - array.shape[0], axis=0)
    return np.concatenate([array, filler], axis=0)


def _check_texts(texts, name: str) -> list[str]:
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{name}: expected a sequence of texts, got a single string")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] is a {type(t).__name__}, not a str")
    return texts


# --------------------------------------------------------------------------- seq2seq runner


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How a `Seq2SeqModel` decodes: temperature 0 is greedy (the other settings then unused)."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_new_tokens: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


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
        self.batch_multiple = math.lcm(int(batch_multiple), sharding_lib.row_shards(mesh))
        self.source = source

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, tokenizer_path=None,
                        backend: str = "hf", dtype: str = "float32", mesh=None, rules=None,
                        **kwargs) -> "Seq2SeqModel":
        """A Hugging Face T5 folder (safetensors) with its tokenizer (spiece.model /
        tokenizer.json, in `tokenizer_path` or the same folder); with `mesh`, the parameters are
        read straight into their shards by the logical axis `rules` (default
        `sharding.DEFAULT_RULES`)."""
        from clarifyjax.models.hf import load_t5  # keeps `import clarifyjax.delphi` light

        folder = check_folder(path)
        _, model = load_t5(folder, dtype=dtype, mesh=mesh, rules=rules)
        tokenizer = Tokenizer.from_pretrained(tokenizer_path or folder, backend=backend)
        return cls(model, tokenizer, source=str(folder), mesh=mesh, **kwargs)

    def encode(self, texts: Sequence[str], *, power_of_two_rows: bool = False
               ) -> tuple[np.ndarray, np.ndarray, int]:
        """ids, mask int32 [rows, bucket] and the number of truncated texts."""
        ids, mask, stats = self.tokenizer.encode_batch_with_stats(
            texts, self.max_input_length, pad_to="bucket", buckets=self.length_buckets)
        rows = padded_rows(len(texts), self.batch_multiple, power_of_two=power_of_two_rows)
        return _pad_rows(ids, rows), _pad_rows(mask, rows), stats.truncated

    def generate(self, texts: Sequence[str], sampling: Sampling = Sampling(), *,
                 rng: jax.Array | None = None, power_of_two_rows: bool = False) -> GeneratedText:
        """Decode a continuation of every text in one jitted call (`decoding.generate`)."""
        texts = _check_texts(texts, f"{self.source} inputs")
        if not texts:
            return GeneratedText([], np.zeros((0, sampling.max_new_tokens), np.int32), 0)
        if not sampling.greedy and rng is None:
            raise ValueError(f"{self.source}: sampling (temperature {sampling.temperature}) "
                             "needs an rng key")
        ids, mask, truncated = self.encode(texts, power_of_two_rows=power_of_two_rows)
        ids, mask = (sharding_lib.place_rows(x, self.mesh) for x in (ids, mask))
        out = generate(self.model, ids, mask, rng=rng, max_new_tokens=sampling.max_new_tokens,
                       min_new_tokens=sampling.min_new_tokens, greedy=sampling.greedy,
                       temperature=sampling.temperature or 1.0, top_k=sampling.top_k,
                       top_p=sampling.top_p)
        tokens = np.asarray(jax.device_get(out.tokens))[: len(texts)]
        decoded = [text_lib.normalize_whitespace(t) for t in self.tokenizer.decode_batch(tokens)]
        return GeneratedText(decoded, tokens, truncated)


# --------------------------------------------------------------------------- T5 judge


def _token_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """The tokenizer's ids for `text`, without EOS."""
    ids, mask = tokenizer.encode_batch([text], max_length=len(text) + 3)
    return ids[0, : int(mask[0].sum()) - 1].tolist()


def class_token_ids(tokenizer: Tokenizer, class_prefix: str, class_tokens: Sequence[str], *,
                    vocab_size: int, class_step: int | None = None, source: str = "judge"
                    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefix ids, class ids): the ids the judge writes before its class, and the one id of each
    class token right after them, as the judge's own tokenizer splits `class_prefix + token`.

    Raises:
      CheckpointError: a class token that is not exactly one vocabulary id there (several
        pieces, or <unk>), ids beyond the model's vocabulary, repeated class tokens, or a prefix
        whose length is not `class_step` (Delphi: 4).
    """
    if len(class_tokens) != 3 or len(set(class_tokens)) != 3:
        raise CheckpointError(f"{source}: class_tokens must be 3 distinct strings (bad, ok, good), "
                              f"got {list(class_tokens)}")
    prefix = _token_ids(tokenizer, class_prefix) if class_prefix else []
    if class_step is not None and len(prefix) != class_step:
        raise CheckpointError(
            f"{source}: the class prefix {class_prefix!r} tokenizes to {len(prefix)} ids {prefix}, "
            f"but the class is expected at decoder step {class_step}")
    class_ids = []
    for token in class_tokens:
        ids = _token_ids(tokenizer, class_prefix + token)
        if len(ids) != len(prefix) + 1 or ids[: len(prefix)] != prefix:
            raise CheckpointError(
                f"{source}: class token {token!r} is not one vocabulary id of the judge's "
                f"tokenizer after the prefix {class_prefix!r}: {class_prefix + token!r} tokenizes to {ids} "
                f"(the prefix alone to {prefix})")
        if ids[-1] == tokenizer.unk_id:
            raise CheckpointError(f"{source}: class token {token!r} is not in the judge's "
                                  f"vocabulary (it tokenizes to <unk>, id {ids[-1]})")
        class_ids.append(ids[-1])
    bad = [i for i in prefix + class_ids if not 0 <= i < vocab_size]
    if bad:
        raise CheckpointError(f"{source}: token ids {bad} are outside the model's vocabulary "
                              f"(vocab_size {vocab_size})")
    if len(set(class_ids)) != 3:
        raise CheckpointError(f"{source}: class tokens {list(class_tokens)} share ids {class_ids}")
    return tuple(prefix), tuple(class_ids)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _class_probabilities(graphdef, state, input_ids, attention_mask, decoder_ids, class_ids):
    """[b, s] inputs, decoder_ids [t] (start + prefix), class_ids [3] -> [b, 3] float32."""
    traces.note("class_probabilities")
    model: T5 = nnx.merge(graphdef, state)
    hidden = model.encode(input_ids, attention_mask)
    decoder_ids = jnp.broadcast_to(decoder_ids[None, :], (input_ids.shape[0],) + decoder_ids.shape)
    _, last = model.decode(decoder_ids, hidden, attention_mask, return_hidden=True)
    logits = model.logits(last[:, -1])  # [b, V]: the step after the prefix
    return jax.nn.softmax(jnp.take(logits, class_ids, axis=-1), axis=-1)


# Delphi's output after our tokenizer dropped <unk> (T5 has no "<"): "class>1/class> text>..".
_LENIENT_OUTPUT = re.compile(
    r"(?:<unk>|<)?\s*class>\s*(-?\d+)\s*(?:<unk>|<)?\s*/\s*class>\s*"
    r"(?:(?:<unk>|<)?\s*text>\s*(.*?)\s*(?:(?:<unk>|<)?\s*/\s*text>|$))?", re.DOTALL)


def parse_judgment(decoded: str) -> tuple[int | None, str]:
    """(class label or None, judgment text) of a decoded judge output.

    Accepts `text.parse_delphi_output`'s spellings and the one left when <unk> is dropped on
    decoding. An output without a class gives (None, the whole output), as the original's split
    on its separators did.
    """
    label, judgment = text_lib.parse_delphi_output(decoded)
    if label is not None:
        return label, judgment
    match = _LENIENT_OUTPUT.search(decoded)
    if match and int(match.group(1)) in text_lib.LABEL_TO_CLASS:
        return int(match.group(1)), text_lib.normalize_whitespace(match.group(2) or "")
    return None, text_lib.normalize_whitespace(decoded)


def judge_inputs(texts: Sequence[str], input_prefix: str) -> list[str]:
    """input_prefix + each text without the policy prefix ("question: "); an empty text raises
    `text.TextFormatError` naming its index."""
    texts = _check_texts(texts, "judge texts")
    out = []
    for i, t in enumerate(texts):
        body = text_lib.strip_policy_prefix(t)
        if not body:
            raise text_lib.TextFormatError(f"judge text {i}: field 'situation' is empty")
        out.append(input_prefix + body)
    return out


class Judge:
    """A T5 judge read through class tokens. `class_tokens` are in the order (bad, ok, good).

    Attributes: prefix_ids, class_ids (from the tokenizer), truncated_inputs (a running count).
    """

    kind = "t5"

    def __init__(self, seq2seq: Seq2SeqModel, *, input_prefix: str = text_lib.JUDGE_PREFIX,
                 class_prefix: str = text_lib.DELPHI_CLASS_PREFIX,
                 class_tokens: Sequence[str] = tuple(reversed(text_lib.DELPHI_CLASS_TOKENS)),
                 class_step: int | None = None, judgment: Sampling = Sampling(max_new_tokens=32)):
        self.seq2seq = seq2seq
        self.input_prefix = input_prefix
        self.class_prefix = class_prefix
        self.class_tokens = tuple(class_tokens)
        self.judgment_sampling = judgment
        self.prefix_ids, self.class_ids = class_token_ids(
            seq2seq.tokenizer, class_prefix, self.class_tokens,
            vocab_size=seq2seq.config.vocab_size, class_step=class_step, source=seq2seq.source)
        start = seq2seq.config.decoder_start_token_id
        self._decoder_ids = np.asarray((start,) + self.prefix_ids, np.int32)
        self.truncated_inputs = 0

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, tokenizer_path=None,
                        backend: str = "hf", dtype: str = "float32", max_input_length: int = 128,
                        batch_multiple: int = 8, mesh=None, rules=None, **kwargs) -> "Judge":
        """A Hugging Face T5 folder; `kwargs` as `Judge` (input_prefix, class_prefix, ...);
        `mesh`, `rules` as `Seq2SeqModel.from_pretrained`."""
        seq2seq = Seq2SeqModel.from_pretrained(
            path, tokenizer_path=tokenizer_path, backend=backend, dtype=dtype,
            max_input_length=max_input_length, batch_multiple=batch_multiple, mesh=mesh,
            rules=rules)
        return cls(seq2seq, **kwargs)

    def inputs(self, texts: Sequence[str]) -> list[str]:
        """The judge's input for each text: input_prefix + text without the policy prefix."""
        return judge_inputs(texts, self.input_prefix)

    def class_probabilities(self, texts: Sequence[str]) -> np.ndarray:
        """[n, 3] float32 P(bad, ok, good) of each text, in one jitted call."""
        inputs = self.inputs(texts)
        if not inputs:
            return np.zeros((0, 3), np.float32)
        ids, mask, truncated = self.seq2seq.encode(inputs)
        self.truncated_inputs += truncated
        graphdef, state = nnx.split(self.seq2seq.model)
        mesh = self.seq2seq.mesh
        probs = _class_probabilities(graphdef, state, sharding_lib.place_rows(ids, mesh),
                                     sharding_lib.place_rows(mask, mesh),
                                     jnp.asarray(self._decoder_ids),
                                     jnp.asarray(self.class_ids, jnp.int32))
        return np.asarray(jax.device_get(probs))[: len(inputs)]

    def judgment_text(self, texts: Sequence[str]) -> list[str]:
        """Delphi's judgment text of each text by greedy decoding (the answer generator's input).

        The text inside `<text>...</text>`; an output without that structure is returned whole.
        """
        inputs = self.inputs(texts)
        out = self.seq2seq.generate(inputs, self.judgment_sampling)
        self.truncated_inputs += out.truncated_inputs
        return [parse_judgment(t)[1] for t in out.texts]


# --------------------------------------------------------------------------- classifier judge


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _classifier_probabilities(graphdef, state, input_ids, attention_mask, columns):
    traces.note("classifier_probabilities")
    logits = nnx.merge(graphdef, state)(input_ids, attention_mask, jnp.zeros_like(input_ids))
    return jax.nn.softmax(jnp.take(logits, columns, axis=-1), axis=-1)


class ClassifierJudge:
    """An encoder sequence classifier with three labels behind the `Judge` interface.

    `encoder_labels` name the model's labels (config.json id2label, case-insensitive) for bad,
    ok and good. Texts are given without a prefix unless `input_prefix` is set.
    """

    kind = "encoder"

    def __init__(self, model, tokenizer, *, encoder_labels: Sequence[str] = text_lib.JUDGE_CLASSES,
                 input_prefix: str = "", max_input_length: int = 128, batch_multiple: int = 8,
                 source: str = "judge", mesh=None):
        labels = [label.lower() for label in model.config.labels]
        wanted = [label.lower() for label in encoder_labels]
        if len(labels) != 3 or len(set(wanted)) != 3 or sorted(labels) != sorted(wanted):
            raise CheckpointError(
                f"{source}: config.json id2label has labels {list(model.config.labels)}; a judge "
                f"needs exactly 3 labels named {list(encoder_labels)} (bad, ok, good)")
        if not 3 <= max_input_length <= model.config.max_tokens:
            raise ValueError(f"{source}: max_input_length {max_input_length} is outside "
                             f"[3, {model.config.max_tokens}] (max_position_embeddings)")
        self.columns = np.asarray([labels.index(w) for w in wanted], np.int32)
        self.model, self.tokenizer = model, tokenizer
        self.input_prefix, self.source = input_prefix, source
        self.max_input_length, self.mesh = int(max_input_length), mesh
        self.batch_multiple = math.lcm(int(batch_multiple), sharding_lib.row_shards(mesh))
        self.pad_token_id = model.config.pad_token_id
        self.truncated_inputs = 0

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, dtype: str = "float32",
                        max_input_length: int = 128, mesh=None, rules=None,
                        **kwargs) -> "ClassifierJudge":
        """A BERT / RoBERTa `...ForSequenceClassification` folder; `mesh`, `rules` as
        `Seq2SeqModel.from_pretrained`."""
        from clarifyjax.models.encoder_params import (load_encoder_tokenizer,
                                                      load_sequence_classifier)

        folder = check_folder(path)
        model = load_sequence_classifier(folder, dtype=dtype, mesh=mesh, rules=rules)
        return cls(model, load_encoder_tokenizer(folder, max_input_length),
                   max_input_length=max_input_length, source=str(folder / "config.json"),
                   mesh=mesh, **kwargs)

    def inputs(self, texts: Sequence[str]) -> list[str]:
        return judge_inputs(texts, self.input_prefix)

    def class_probabilities(self, texts: Sequence[str]) -> np.ndarray:
        """[n, 3] float32 P(bad, ok, good): the softmax over the model's three labels."""
        from clarifyjax.buckets import bucket_length, pad_sequences

        inputs = self.inputs(texts)
        if not inputs:
            return np.zeros((0, 3), np.float32)
        encodings = self.tokenizer.encode_batch(inputs)
        self.truncated_inputs += sum(1 for e in encodings if e.overflowing)
        length = bucket_length(max(len(e.ids) for e in encodings), cap=self.max_input_length)
        rows = padded_rows(len(inputs), self.batch_multiple)
        ids = pad_sequences([e.ids for e in encodings], len(inputs), length, self.pad_token_id)
        mask = pad_sequences([e.attention_mask for e in encodings], len(inputs), length, 0)
        graphdef, state = nnx.split(self.model)
        probs = _classifier_probabilities(
            graphdef, state, sharding_lib.place_rows(_pad_rows(ids, rows), self.mesh),
            sharding_lib.place_rows(_pad_rows(mask, rows), self.mesh), self.columns)
        return np.asarray(jax.device_get(probs))[: len(inputs)]

    def judgment_text(self, texts: Sequence[str]) -> list[str]:
        """A generic judgment for the argmax class ("it's bad", "it's okay", "it's good")."""
        labels = np.argmax(self.class_probabilities(texts), axis=-1)
        return [text_lib.DEFAULT_JUDGMENT_TEXT[text_lib.CLASS_TO_LABEL[text_lib.JUDGE_CLASSES[k]]]
                for k in labels]


def load_judge(path: str | os.PathLike, *, kind: str | None = None, dtype: str = "float32",
               backend: str = "hf", max_input_length: int = 128, batch_multiple: int = 8,
               input_prefix: str | None = None,
               class_prefix: str = text_lib.DELPHI_CLASS_PREFIX,
               class_tokens: Sequence[str] = tuple(reversed(text_lib.DELPHI_CLASS_TOKENS)),
               class_step: int | None = None, judgment: Sampling = Sampling(max_new_tokens=32),
               encoder_labels: Sequence[str] = text_lib.JUDGE_CLASSES, mesh=None, rules=None):
    """A `Judge` (T5 folder) or a `ClassifierJudge` (BERT / RoBERTa folder), told apart by
    config.json `model_type` unless `kind` ("t5" | "encoder") says. `input_prefix` None: the
    kind's default ("[moral_single]: " for a T5, none for a classifier). `mesh`, `rules`: place
    the parameters on a `sharding.process_mesh` (see `Seq2SeqModel.from_pretrained`)."""
    folder = check_folder(path)
    if kind is None:
        model_type = read_config(folder).get("model_type")
        kinds = {"t5": "t5", "mt5": "t5", "bert": "encoder", "roberta": "encoder"}
        if model_type not in kinds:
            raise CheckpointError(f"{folder / 'config.json'}: model_type {model_type!r} is neither "
                                  "a T5 judge nor a BERT/RoBERTa classifier judge")
        kind = kinds[model_type]
    if kind == "t5":
        return Judge.from_pretrained(
            folder, dtype=dtype, backend=backend, max_input_length=max_input_length,
            batch_multiple=batch_multiple, class_prefix=class_prefix, class_tokens=class_tokens,
            class_step=class_step, judgment=judgment, mesh=mesh, rules=rules,
            input_prefix=text_lib.JUDGE_PREFIX if input_prefix is None else input_prefix)
    if kind == "encoder":
        return ClassifierJudge.from_pretrained(
            folder, dtype=dtype, max_input_length=max_input_length, batch_multiple=batch_multiple,
            encoder_labels=encoder_labels, input_prefix=input_prefix or "", mesh=mesh, rules=rules)
    raise ValueError(f"judge kind must be 't5' or 'encoder', got {kind!r}")
