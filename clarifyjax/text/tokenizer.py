"""One tokenizer interface for T5 SentencePiece vocabularies, with two interchangeable backends:
``backend="hf"`` (Hugging Face ``T5TokenizerFast`` from a folder) and ``backend="tf_text"``
(tensorflow-text's ``SentencepieceTokenizer`` on its ``spiece.model``, imported only when asked).

    tok = Tokenizer.from_pretrained(folder, backend="hf")

EOS, truncation (explicit and counted) and padding live in `Tokenizer`, once, for both backends; a
text no backend can encode is a `TextEncodingError` naming it (`check_encodable`)."""
from __future__ import annotations

import dataclasses
import os
import re
import threading
from pathlib import Path
from typing import Literal
from collections.abc import Sequence

import numpy as np

from clarifyjax.core.buckets import DEFAULT_BUCKETS, bucket_length
from clarifyjax.models.safetensors_io import CheckpointError, check_folder
from clarifyjax.files.textfiles import atomic_write_bytes

SPM_FILE = "spiece.model"
HF_FILE = "tokenizer.json"
# Copied by `save_pretrained` when present, so that a model folder is self-contained.
TOKENIZER_FILES = (SPM_FILE, HF_FILE, "tokenizer_config.json", "special_tokens_map.json")
Backend = Literal["hf", "tf_text"]
_UNENCODABLE = re.compile("[\ud800-\udfff\x00]")


class TextEncodingError(ValueError):
    """A text that cannot be encoded; `index` is its position in the batch, `reason` says why."""

    def __init__(self, index: int, reason: str):
        super().__init__(f"text {index} of the batch {reason}")
        self.index, self.reason = index, reason


# A lone surrogate such as "\ud800" has no UTF-8 form, and a NUL reads as <unk> in T5's vocabulary
# (a sign of a binary or UTF-16 file); the error names the text's index and a short repr before the
# backend sees the batch, since the backends fail without saying which text.
def check_encodable(texts: Sequence[str]) -> None:
    """Raise `TextEncodingError` for the first text with a lone surrogate or a NUL character."""
    for i, text in enumerate(texts):
        found = _UNENCODABLE.search(text)
        if found:
            at = found.start()
            what = "a NUL character" if found.group() == "\x00" else "a lone surrogate"
            context = text[max(0, at - 20):at + 20]
            raise TextEncodingError(i, f"cannot be encoded: {what} ({found.group()!r}) at "
                                       f"character {at + 1}, in {context!r}")


@dataclasses.dataclass(frozen=True)
class EncodeStats:
    """What one `encode_batch_with_stats` call did.

    lengths: [batch] tokens per text including EOS, *before* truncation.
    truncated_rows: indices (in the batch) of the texts that were cut to `max_length`.
    """

    lengths: np.ndarray
    truncated_rows: tuple[int, ...]

    @property
    def truncated(self) -> int:
        return len(self.truncated_rows)


# The backend only turns text into pieces and back; appending EOS, truncating, padding and decoding
# live here, once, so the backends cannot drift apart (both give identical ids for the same
# spiece.model, tested on δ-CLARIFY). A text of more than max_length - 1 tokens keeps its first
# max_length - 1 and EOS, and is counted (per call in `EncodeStats`, in total in
# `truncation_count`). An empty or whitespace-only text is an error unless allowed.
class Tokenizer:
    """Text <-> padded id matrices. Build with `Tokenizer.from_pretrained(folder, backend=...)`.

    Attributes:
      pad_id, eos_id, unk_id: special ids of the vocabulary.
      vocab_size: size of the tokenizer's vocabulary (a model's embedding may be larger, e.g. 32128).
      truncation_count: texts truncated by this tokenizer so far, over all calls.
    """

    backend: str

    def __init__(self, folder: Path, *, pad_id: int, eos_id: int, unk_id: int | None,
                 vocab_size: int):
        self.folder = folder
        self.pad_id, self.eos_id, self.unk_id = int(pad_id), int(eos_id), unk_id
        self.vocab_size = int(vocab_size)
        self.truncation_count = 0
        self._dropped_on_decode = np.array(
            sorted({self.pad_id, self.eos_id} | ({unk_id} if unk_id is not None else set())))

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, backend: Backend = "hf") -> Tokenizer:
        """Load from a folder holding ``tokenizer.json`` and/or ``spiece.model``.

        Raises:
          CheckpointError: the folder is missing, or holds no file the backend can read.
        """
        folder = check_folder(path)
        if backend == "hf":
            if not (folder / HF_FILE).exists() and not (folder / SPM_FILE).exists():
                raise CheckpointError(f"{folder}: neither {HF_FILE} nor {SPM_FILE} found; "
                                      "not a tokenizer folder")
            return HFTokenizer(folder)
        if backend == "tf_text":
            if not (folder / SPM_FILE).exists():
                raise CheckpointError(f"{folder}: no {SPM_FILE}, which the tf_text backend needs")
            return TFTextTokenizer(folder)
        raise ValueError(f"unknown tokenizer backend {backend!r}; expected 'hf' or 'tf_text'")

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Copy the tokenizer files (each atomically) into `folder`, e.g. beside a model's weights."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            source = self.folder / name
            if source.exists() and source.resolve() != (folder / name).resolve():
                atomic_write_bytes(folder / name, source.read_bytes())
        return folder

    # -- backend hooks ----------------------------------------------------------------------------

    def _pieces(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text, without any special token."""
        raise NotImplementedError

    def _detokenize(self, rows: list[list[int]]) -> list[str]:
        """Text of each row of ordinary (non-special, in-vocabulary) ids."""
        raise NotImplementedError

    # -- encoding ---------------------------------------------------------------------------------

    def encode_batch(self, texts: Sequence[str], max_length: int, *,
                     pad_to: int | Literal["bucket"] | None = None,
                     allow_empty: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Encode, append EOS, truncate (counted) and pad. Returns ids, mask: int32 [batch, L].

        See `encode_batch_with_stats` for the arguments and the per-call truncation count.
        """
        ids, mask, _ = self.encode_batch_with_stats(texts, max_length, pad_to=pad_to,
                                                    allow_empty=allow_empty)
        return ids, mask

    def encode_batch_with_stats(self, texts: Sequence[str], max_length: int, *,
                                pad_to: int | Literal["bucket"] | None = None,
                                allow_empty: bool = False,
                                buckets: Sequence[int] = DEFAULT_BUCKETS
                                ) -> tuple[np.ndarray, np.ndarray, EncodeStats]:
        """Encode a batch of texts.

        Args:
          texts: the batch (a list of str, not one str).
          max_length: most tokens per row, EOS included; longer texts keep their first
            ``max_length - 1`` tokens plus EOS and are counted.
          pad_to: width L of the result: None -> `max_length`; an int >= `max_length`; or
            "bucket" -> `bucket_length` of the longest row over `buckets`, so that jitted
            shapes repeat.
          allow_empty: encode an empty / whitespace-only text as just EOS instead of raising.
        Returns:
          ids: int32 [batch, L], pad_id after EOS; mask: int32 [batch, L], 1 on tokens and EOS;
          stats: `EncodeStats` of this call.
        Raises:
          ValueError: an empty text (naming its index), or inconsistent lengths.
          TextEncodingError (a ValueError): a text with a lone surrogate or a NUL character.
          TypeError: `texts` is a str, or an item is not a str (naming its index).
        """
        if isinstance(texts, (str, bytes)):
            raise TypeError("encode_batch expects a sequence of texts, got a single string")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"text {i} of the batch is a {type(text).__name__}, not a str")
            if not allow_empty and not text.strip():
                raise ValueError(f"text {i} of the batch is empty ({text!r}); "
                                 "pass allow_empty=True to encode it as EOS alone")
        check_encodable(texts)
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 (one token and EOS), got {max_length}")

        pieces = self._pieces(texts) if texts else []
        lengths = np.array([len(p) + 1 for p in pieces], dtype=np.int64)  # + EOS
        truncated_rows = tuple(int(i) for i in np.flatnonzero(lengths > max_length))
        kept = np.minimum(lengths, max_length)

        if pad_to is None:
            width = max_length
        elif pad_to == "bucket":
            width = bucket_length(int(kept.max()) if len(kept) else 1, buckets)
        elif isinstance(pad_to, (int, np.integer)) and pad_to >= max_length:
            width = int(pad_to)
        else:
            raise ValueError(f"pad_to must be None, 'bucket' or an int >= max_length "
                             f"({max_length}), got {pad_to!r}")

        # Rows are laid out row-major, so the flat kept ids fill `mask` positions in order.
        mask = np.arange(width)[None, :] < kept[:, None]
        ids = np.full((len(texts), width), self.pad_id, dtype=np.int32)
        flat = [np.asarray(p[: n - 1] + [self.eos_id], dtype=np.int32) for p, n in zip(pieces, kept)]
        if flat:
            ids[mask] = np.concatenate(flat)
        self.truncation_count += len(truncated_rows)
        return ids, mask.astype(np.int32), EncodeStats(lengths, truncated_rows)

    # -- decoding ---------------------------------------------------------------------------------

    def decode_batch(self, ids) -> list[str]:
        """Text of each row of `ids` [batch, L]: up to the first EOS, pad / special ids dropped.

        Ids outside the tokenizer's vocabulary (a model's embedding is often larger) are dropped.
        """
        ids = np.asarray(ids)
        if ids.ndim != 2:
            raise ValueError(f"decode_batch expects ids of shape [batch, length], got {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"decode_batch expects integer ids, got dtype {ids.dtype}")
        ids = ids.astype(np.int64)
        is_eos = ids == self.eos_id
        # position of the first EOS (or L when none): everything from it on is dropped
        ends = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), ids.shape[1])
        keep = (np.arange(ids.shape[1])[None, :] < ends[:, None])
        keep &= ~np.isin(ids, self._dropped_on_decode) & (ids >= 0) & (ids < self.vocab_size)
        rows = [row[k].tolist() for row, k in zip(ids, keep)]
        return self._detokenize(rows) if rows else []

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self.folder)!r}, vocab_size={self.vocab_size}, "
                f"pad_id={self.pad_id}, eos_id={self.eos_id})")


# transformers 5's T5Tokenizer(vocab_file=...) silently ignores the file, so we always load from the
# folder (tokenizer.json or spiece.model).
def _first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


def _unreadable(folder: Path, error: Exception) -> CheckpointError:
    """The one line for a tokenizer folder transformers cannot load, whatever it raised."""
    return CheckpointError(f"{folder}: no tokenizer transformers can read ({_first_line(error)})")


class HFTokenizer(Tokenizer):
    """Hugging Face backend: ``T5TokenizerFast.from_pretrained(folder)``."""

    backend = "hf"

    def __init__(self, folder: Path):
        from transformers import T5TokenizerFast

        # extra_ids=0: no <extra_id_*> sentinels beyond what tokenizer.json itself declares, so a
        # bare spiece.model gives the same vocabulary as the tf_text backend.
        try:
            self._tok = T5TokenizerFast.from_pretrained(str(folder), extra_ids=0)
        except Exception as e:  # OSError, ValueError; a KeyError or the tokenizers' bare Exception on a bad file
            raise _unreadable(folder, e) from e
        pad, eos = self._tok.pad_token_id, self._tok.eos_token_id
        if pad is None or eos is None:
            raise CheckpointError(f"{folder}: the tokenizer defines no pad or eos token "
                                  f"(pad={pad}, eos={eos}); T5 needs both")
        super().__init__(folder, pad_id=pad, eos_id=eos, unk_id=self._tok.unk_token_id,
                         vocab_size=len(self._tok))

    def _pieces(self, texts: list[str]) -> list[list[int]]:
        return self._tok(texts, add_special_tokens=False)["input_ids"]

    def _detokenize(self, rows: list[list[int]]) -> list[str]:
        return self._tok.batch_decode(rows, skip_special_tokens=True,
                                      clean_up_tokenization_spaces=False)


class TFTextTokenizer(Tokenizer):
    """tensorflow-text backend: ``SentencepieceTokenizer`` on the folder's ``spiece.model``."""

    backend = "tf_text"

    def __init__(self, folder: Path):
        import sentencepiece
        import tensorflow as tf  # heavy: imported only for this backend
        import tensorflow_text

        proto = (folder / SPM_FILE).read_bytes()
        try:
            spm = sentencepiece.SentencePieceProcessor(model_proto=proto)
        except Exception as e:  # sentencepiece raises RuntimeError/OSError on garbage
            raise CheckpointError(f"{folder / SPM_FILE}: not a SentencePiece model ({e})") from e
        if spm.pad_id() < 0 or spm.eos_id() < 0:
            raise CheckpointError(f"{folder / SPM_FILE}: no pad or eos piece "
                                  f"(pad_id={spm.pad_id()}, eos_id={spm.eos_id()}); T5 needs both")
        self._tf = tf
        # EOS is appended by `Tokenizer` itself, identically for both backends.
        self._spm = tensorflow_text.SentencepieceTokenizer(model=proto, add_eos=False)
        super().__init__(folder, pad_id=spm.pad_id(), eos_id=spm.eos_id(),
                         unk_id=spm.unk_id() if spm.unk_id() >= 0 else None,
                         vocab_size=spm.get_piece_size())

    def _pieces(self, texts: list[str]) -> list[list[int]]:
        return self._spm.tokenize(self._tf.constant(texts, dtype=self._tf.string)).to_list()

    def _detokenize(self, rows: list[list[int]]) -> list[str]:
        values = np.fromiter((i for row in rows for i in row), dtype=np.int32)
        ragged = self._tf.RaggedTensor.from_row_lengths(
            values, np.array([len(row) for row in rows], dtype=np.int64))
        return [b.decode("utf-8") for b in self._spm.detokenize(ragged).numpy().tolist()]


# --------------------------------------------------------------------------- causal LM prompts

# FastChat's `vicuna_v1.1` conversation (fastchat/conversation.py, register_conv_template(
# Conversation(name="vicuna_v1.1", system_message=VICUNA_V1_1_SYSTEM, roles=("USER",
# "ASSISTANT"), sep_style=SeparatorStyle.ADD_COLON_TWO, sep=" ", sep2="</s>"))): lmsys' Vicuna
# folders ship no chat template, and this is the prompt they were fine-tuned on.
VICUNA_V1_1_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                      "The assistant gives helpful, detailed, and polite answers to the user's "
                      "questions.")
# How chats are rendered: "model" = the folder's own template (tokenizer_config.json or
# chat_template.jinja, through transformers' apply_chat_template); "vicuna_v1.1" = FastChat's.
CHAT_TEMPLATES = ("model", "vicuna_v1.1")


def render_vicuna_v1_1(messages: Sequence[dict]) -> str:
    """FastChat's `Conversation.get_prompt` for ADD_COLON_TWO, with the assistant's turn opened:
    ``SYSTEM USER: q ASSISTANT: a</s>USER: q2 ASSISTANT:``. An optional first system message
    replaces the default system prompt; then user and assistant alternate, ending with a user."""
    system, turns = VICUNA_V1_1_SYSTEM, list(messages)
    if turns and turns[0]["role"] == "system":
        system, turns = turns[0]["content"], turns[1:]
    text, seps = system + " ", (" ", "</s>")
    for i, message in enumerate(turns):
        expected = ("user", "assistant")[i % 2]
        if message["role"] != expected:
            raise ValueError(f"messages[{i + len(messages) - len(turns)}].role: vicuna_v1.1 "
                             f"expects {expected!r} here (a system message first, then user and "
                             f"assistant in turn), got {message['role']!r}")
        text += ("USER", "ASSISTANT")[i % 2] + ": " + message["content"] + seps[i % 2]
    if len(turns) % 2 == 0:
        raise ValueError("messages: the last message must be the user's (vicuna_v1.1 opens the "
                         "assistant's turn after it)")
    return text + "ASSISTANT:"


class CausalTokenizer:
    """A decoder-only model's tokenizer (`transformers.AutoTokenizer`, offline from the folder)
    and its prompts: a raw prompt (a str) is tokenized as `transformers` does by default (BOS
    added when the tokenizer adds one, as SaGE's `pipeline` calls do); a chat (a list of
    messages) is rendered with `chat_template` and gets exactly one BOS.

    Attributes: bos_id, eos_id (None when the tokenizer has none), pad_id (pad, else eos, else
    0: only a filler), vocab_size, has_chat_template.
    """

    def __init__(self, folder: str | os.PathLike):
        from transformers import AutoTokenizer

        self.folder = check_folder(folder)
        try:
            self._tok = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        except Exception as e:  # OSError, ValueError; a KeyError or the tokenizers' bare Exception on a bad file
            raise _unreadable(self.folder, e) from e
        # A fast tokenizer is not safe to call from two threads at once ("Already borrowed"): a
        # server counts prompt tokens in its event loop while its worker thread generates.
        self._lock = threading.Lock()
        tok = self._tok
        self.bos_id, self.eos_id = tok.bos_token_id, tok.eos_token_id
        self.pad_id = next((i for i in (tok.pad_token_id, tok.eos_token_id) if i is not None), 0)
        self.vocab_size = len(tok)
        self.has_chat_template = bool(getattr(tok, "chat_template", None))

    def render(self, prompt, chat_template: str = "model", **variables) -> str:
        """The text a prompt becomes: a str as it is, a chat through `chat_template` (the model's
        template also reads `variables`, e.g. Qwen3's ``enable_thinking``; others ignore them)."""
        if isinstance(prompt, str):
            return prompt
        if chat_template == "vicuna_v1.1":
            return render_vicuna_v1_1(prompt)
        if chat_template != "model":
            raise ValueError(f"unknown chat template {chat_template!r}; expected one of "
                             f"{list(CHAT_TEMPLATES)}")
        if not self.has_chat_template:
            raise ValueError(f"{self.folder}: the tokenizer has no chat template; give prompts "
                             "as text, or choose the built-in template vicuna_v1.1")
        try:
            with self._lock:
                return self._tok.apply_chat_template(list(prompt), tokenize=False,
                                                     add_generation_prompt=True, **variables)
        except Exception as e:  # jinja2's errors, or the template's own raise_exception(...)
            raise ValueError(f"{self.folder}: its chat template cannot render these messages "
                             f"({_first_line(e)})") from e

    def encode(self, prompt, chat_template: str = "model", raw_bos: bool = True) -> list[int]:
        """Token ids of a prompt. A model's chat template writes its own BOS (as
        `apply_chat_template(tokenize=True)` leaves special tokens out), so it is not added twice;
        a vicuna_v1.1 chat gets the tokenizer's default special tokens, as FastChat tokenizes it,
        and so does a raw prompt unless `raw_bos` is False (transformers' text-generation
        `pipeline` tokenized raw prompts with `add_special_tokens=False` until 4.43)."""
        text = self.render(prompt, chat_template)
        check_encodable([text])
        own_template = not isinstance(prompt, str) and chat_template == "model"
        special = not own_template and (raw_bos or not isinstance(prompt, str))
        with self._lock:
            return list(self._tok(text, add_special_tokens=special)["input_ids"])

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        """Write the tokenizer's files into `folder` (a trained model's export)."""
        with self._lock:
            self._tok.save_pretrained(str(folder))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids, special tokens left out."""
        with self._lock:
            return self._tok.decode(list(ids), skip_special_tokens=True,
                                    clean_up_tokenization_spaces=False)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each id's own text (for per-token log-probs)."""
        with self._lock:
            return [self._tok.decode([i], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False) for i in ids]
