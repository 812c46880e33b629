"""The moral judge: P(bad, ok, good) of a text, `[batch, 3]` float32 (`text.JUDGE_CLASSES`).

`Judge`: a T5 read through class tokens, as Delphi (input "[moral_single]: " + text, target
"<class>{1|0|-1}</class> <text>{judgment}</text>"); how it reads them is above the class.
`ClassifierJudge`: a BERT / RoBERTa / DeBERTa three-label classifier, same interface. Both read
`text.judge_input`'s inputs and run one jitted forward per bucketed batch; `load_judge` picks one."""
from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clarifyjax.core import sharding, traces
from clarifyjax.text import formats
from clarifyjax.core.buckets import bucket_length, pad_rows, pad_sequences, padded_rows
from clarifyjax.models.safetensors_io import CheckpointError, check_folder, read_config
from clarifyjax.models.t5 import T5
from clarifyjax.decoding.seq2seq import Seq2SeqModel
from clarifyjax.text.generator import Sampling
from clarifyjax.files.textfiles import check_texts
from clarifyjax.text.tokenizer import Tokenizer
from clarifyjax.models.hf import load_classifier, load_encoder_tokenizer

DELPHI_CLASS_STEP = 4  # `▁ <unk> class >` in T5's vocabulary: Delphi reads the class at step 4


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


class _BatchedJudge:
    """What both judges share: their inputs (`text.judge_input` with the judge's `input_prefix`)
    and one jitted forward over a batch of them, rows padded and split over `mesh`. A subclass
    gives `_encode(inputs) -> (ids, mask, truncated)` and `_forward(ids, mask) -> [rows, 3]`."""

    input_prefix: str
    mesh = None
    truncated_inputs: int

    def inputs(self, texts: Sequence[str], *, allow_empty: bool = False) -> list[str]:
        """The judge's input for each text: input_prefix + text without the policy prefix; an
        empty text raises `text.TextFormatError` naming its index, unless `allow_empty`."""
        return [formats.judge_input(t, prefix=self.input_prefix, allow_empty=allow_empty,
                                    where=f"judge text {i}")
                for i, t in enumerate(check_texts(texts, "judge texts"))]

    def class_probabilities(self, texts: Sequence[str], *, allow_empty: bool = False
                            ) -> np.ndarray:
        """[n, 3] float32 P(bad, ok, good) of each text, in one jitted call (`allow_empty`: an
        empty text is judged as the input prefix alone, as the original judged an empty fusion
        output)."""
        inputs = self.inputs(texts, allow_empty=allow_empty)
        if not inputs:
            return np.zeros((0, 3), np.float32)
        ids, mask, truncated = self._encode(inputs)
        self.truncated_inputs += truncated
        probs = self._forward(*(sharding.place_rows(x, self.mesh) for x in (ids, mask)))
        return np.asarray(jax.device_get(probs))[: len(inputs)]


# The original (allenai/clarifydelphi, `DelphiScorer.score_batch`) greedily generated 200 tokens and
# read the softmax over the vocabulary at decoder step 4 (after `▁ <unk> class >`) in the columns of
# "1", "0", "-1"; the reward then normalized those three numbers. Here the prefix is teacher-forced:
# one decoder pass over [start, prefix...], and the class tokens' logits at the last position are
# softmaxed over those tokens only, which equals the normalized columns of the full softmax. The
# prefix ids come from the judge's own tokenizer; each class token must be exactly one vocabulary id
# right after the prefix, or loading fails naming the token.
class Judge(_BatchedJudge):
    """A T5 judge read through class tokens. `class_tokens` are in the order (bad, ok, good).

    Attributes: prefix_ids, class_ids (from the tokenizer), truncated_inputs (a running count).
    """

    kind = "t5"

    def __init__(self, seq2seq: Seq2SeqModel, *, input_prefix: str = formats.JUDGE_PREFIX,
                 class_prefix: str = formats.DELPHI_CLASS_PREFIX,
                 class_tokens: Sequence[str] = tuple(reversed(formats.DELPHI_CLASS_TOKENS)),
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
                        batch_multiple: int = 8, mesh=None, rules=None,
                        precision: str = "default", **kwargs) -> Judge:
        """A Hugging Face T5 folder; `kwargs` as `Judge` (input_prefix, class_prefix, ...);
        `mesh`, `rules`, `precision` as `Seq2SeqModel.from_pretrained`."""
        seq2seq = Seq2SeqModel.from_pretrained(
            path, tokenizer_path=tokenizer_path, backend=backend, dtype=dtype,
            max_input_length=max_input_length, batch_multiple=batch_multiple, mesh=mesh,
            rules=rules, precision=precision)
        return cls(seq2seq, **kwargs)

    @property
    def mesh(self):
        return self.seq2seq.mesh

    def _encode(self, inputs: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
        return self.seq2seq.encode(inputs)

    def _forward(self, ids, mask) -> jax.Array:
        graphdef, state = nnx.split(self.seq2seq.model)
        return _class_probabilities(graphdef, state, ids, mask, jnp.asarray(self._decoder_ids),
                                    jnp.asarray(self.class_ids, jnp.int32))

    def judgment_text(self, texts: Sequence[str], sampling: Sampling | None = None) -> list[str]:
        """Delphi's judgment text of each text by greedy decoding (the answer generator's input),
        as `sampling` says (None: the judge's own `judgment`; the reward pipeline passes its
        ``judgment_max_length``).

        The text inside `<text>...</text>`; an output without that structure is returned whole.
        """
        inputs = self.inputs(texts)
        out = self.seq2seq.generate(inputs, sampling or self.judgment_sampling)
        self.truncated_inputs += out.truncated_inputs
        return [formats.parse_delphi_output(t, keep_unparsed=True)[1] for t in out.texts]


# --------------------------------------------------------------------------- classifier judge


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _classifier_probabilities(graphdef, state, input_ids, attention_mask, columns):
    traces.note("classifier_probabilities")
    logits = nnx.merge(graphdef, state)(input_ids, attention_mask, jnp.zeros_like(input_ids))
    return jax.nn.softmax(jnp.take(logits, columns, axis=-1), axis=-1)


class ClassifierJudge(_BatchedJudge):
    """An encoder sequence classifier with three labels behind the `Judge` interface.

    `encoder_labels` name the model's labels (config.json id2label, case-insensitive) for bad,
    ok and good. Texts are given without a prefix unless `input_prefix` is set.
    """

    kind = "encoder"

    def __init__(self, model, tokenizer, *, encoder_labels: Sequence[str] = formats.JUDGE_CLASSES,
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
        self.batch_multiple = math.lcm(int(batch_multiple), sharding.row_shards(mesh))
        self.pad_token_id = model.config.pad_token_id
        self.truncated_inputs = 0

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, dtype: str = "float32",
                        max_input_length: int = 128, mesh=None, rules=None,
                        precision: str = "default", **kwargs) -> ClassifierJudge:
        """A BERT, RoBERTa or DeBERTa-v2/v3 `...ForSequenceClassification` folder
        (`hf.load_classifier`); `mesh`, `rules`, `precision` as `Seq2SeqModel.from_pretrained`."""
        folder = check_folder(path)
        model = load_classifier(folder, dtype=dtype, mesh=mesh, rules=rules, precision=precision)
        return cls(model, load_encoder_tokenizer(folder, max_input_length),
                   max_input_length=max_input_length, source=str(folder / "config.json"),
                   mesh=mesh, **kwargs)

    def _encode(self, inputs: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
        encodings = self.tokenizer.encode_batch(inputs)
        length = bucket_length(max(len(e.ids) for e in encodings), cap=self.max_input_length)
        rows = padded_rows(len(inputs), self.batch_multiple)
        ids = pad_sequences([e.ids for e in encodings], len(inputs), length, self.pad_token_id)
        mask = pad_sequences([e.attention_mask for e in encodings], len(inputs), length, 0)
        return (pad_rows(ids, rows), pad_rows(mask, rows),
                sum(1 for e in encodings if e.overflowing))

    def _forward(self, ids, mask) -> jax.Array:
        graphdef, state = nnx.split(self.model)
        return _classifier_probabilities(graphdef, state, ids, mask, self.columns)

    def judgment_text(self, texts: Sequence[str], sampling: Sampling | None = None) -> list[str]:
        """A generic judgment for the argmax class ("it's bad", "it's okay", "it's good");
        `sampling` is unused (nothing is decoded)."""
        labels = np.argmax(self.class_probabilities(texts), axis=-1)
        return [formats.DEFAULT_JUDGMENT_TEXT[formats.CLASS_TO_LABEL[formats.JUDGE_CLASSES[k]]]
                for k in labels]


def load_judge(path: str | os.PathLike, *, kind: str | None = None, dtype: str = "float32",
               backend: str = "hf", max_input_length: int = 128, batch_multiple: int = 8,
               input_prefix: str | None = None,
               class_prefix: str = formats.DELPHI_CLASS_PREFIX,
               class_tokens: Sequence[str] = tuple(reversed(formats.DELPHI_CLASS_TOKENS)),
               class_step: int | None = None, judgment: Sampling = Sampling(max_new_tokens=32),
               encoder_labels: Sequence[str] = formats.JUDGE_CLASSES, mesh=None, rules=None,
               precision: str = "default"):
    """A `Judge` (T5 folder) or a `ClassifierJudge` (BERT / RoBERTa / DeBERTa folder), told apart by
    config.json `model_type` unless `kind` ("t5" | "encoder") says. `input_prefix` None: the
    kind's default ("[moral_single]: " for a T5, none for a classifier). `mesh`, `rules`: place
    the parameters on a `sharding.process_mesh` (see `Seq2SeqModel.from_pretrained`);
    `precision`: of the model's matmuls."""
    folder = check_folder(path)
    if kind is None:
        model_type = read_config(folder).get("model_type")
        kinds = {"t5": "t5", "mt5": "t5", "bert": "encoder", "roberta": "encoder",
                 "deberta-v2": "encoder"}
        if model_type not in kinds:
            raise CheckpointError(f"{folder / 'config.json'}: model_type {model_type!r} is neither "
                                  "a T5 judge nor a BERT/RoBERTa/DeBERTa classifier judge")
        kind = kinds[model_type]
    if kind == "t5":
        return Judge.from_pretrained(
            folder, dtype=dtype, backend=backend, max_input_length=max_input_length,
            batch_multiple=batch_multiple, class_prefix=class_prefix, class_tokens=class_tokens,
            class_step=class_step, judgment=judgment, mesh=mesh, rules=rules, precision=precision,
            input_prefix=formats.JUDGE_PREFIX if input_prefix is None else input_prefix)
    if kind == "encoder":
        return ClassifierJudge.from_pretrained(
            folder, dtype=dtype, max_input_length=max_input_length, batch_multiple=batch_multiple,
            encoder_labels=encoder_labels, input_prefix=input_prefix or "", mesh=mesh, rules=rules,
            precision=precision)
    raise ValueError(f"judge kind must be 't5' or 'encoder', got {kind!r}")
