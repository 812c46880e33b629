"""A decoder-only question policy's text: the prompt each situation becomes (`prompt_format` chat:
the folder's chat template around one user message; plain: a template string), its token ids
right-padded as `data.TokenizedDataset` reads them, and the questions decoded up to EOS or the
template's end-of-turn token (`CausalPolicyText`)."""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from clarifyjax.files.tables import DataError
from clarifyjax.text.tokenizer import CausalTokenizer

PROMPT_FORMATS = ("chat", "plain")
# The instruction of each format ({situation}: the situation's text, as the data file gives it).
DEFAULT_TEMPLATES = {
    "chat": ("Ask one clarification question about the situation below: a question whose answer "
             "would help decide whether the action is right or wrong.\nSituation: {situation}"),
    "plain": "Situation: {situation}\nA clarification question about this situation:",
}


class CausalPolicyText:
    """The tokenizer side of a decoder-only policy (the `Tokenizer` interface the PPO loop reads:
    encode_batch, decode_batch, save_pretrained, vocab_size, eos_id).

    `prompt(situation)`: ``template`` with the situation in place of ``{situation}``, as it is
    (plain: BOS added when the tokenizer adds one) or as one user message rendered by the folder's
    chat template with its generation prompt (chat: the template writes its own BOS; rendered
    with ``enable_thinking=False``, so that a Qwen3 asks at once). `stop_ids`: the model's EOS
    ids (config.json and generation_config.json, which hold a chat model's end-of-turn token)
    and the tokenizer's; a question is the completion up to the first of them."""

    def __init__(self, folder: str | os.PathLike, prompt_format: str, template: str | None = None,
                 eos_ids: Sequence[int] = ()):
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {PROMPT_FORMATS}, got {prompt_format!r}")
        self.format = prompt_format
        self.template = DEFAULT_TEMPLATES[prompt_format] if template is None else template
        if "{situation}" not in self.template:
            raise ValueError(f"prompt template {self.template!r} has no {{situation}}")
        self.tokenizer = CausalTokenizer(folder)
        self.folder, self.vocab_size = self.tokenizer.folder, self.tokenizer.vocab_size
        self.eos_id, self.pad_id = self.tokenizer.eos_id, self.tokenizer.pad_id
        own = () if self.eos_id is None else (int(self.eos_id),)
        self.stop_ids = tuple(dict.fromkeys(tuple(int(i) for i in eos_ids) + own))
        self.prompt("a situation")  # a chat template that cannot render fails here, once

    def prompt(self, situation: str) -> str:
        """The text the policy continues for `situation`."""
        text = self.template.replace("{situation}", situation)
        if self.format == "plain":
            return text
        return self.tokenizer.render([{"role": "user", "content": text}], enable_thinking=False)

    def encode_batch(self, prompts: Sequence[str], max_length: int, pad_to: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Prompts (`prompt`'s texts) -> (ids, mask) [n, pad_to or the longest] int32, right-padded.
        A prompt is never cut (that would cut its generation prompt): one longer than
        `max_length` tokens is a DataError naming it."""
        rows = [self.tokenizer.encode(p, raw_bos=self.format == "plain") for p in prompts]
        for p, row in zip(prompts, rows):
            if len(row) > max_length:
                raise DataError(f"the policy's prompt {p!r} has {len(row)} tokens, more than "
                                f"policy.max_input_length = {max_length}")
        width = pad_to or max((len(r) for r in rows), default=1)
        ids = np.full((len(rows), width), self.pad_id, np.int32)
        mask = np.zeros((len(rows), width), np.int32)
        for i, row in enumerate(rows):
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
        return ids, mask

    def decode_batch(self, ids) -> list[str]:
        """The question of each row of generated ids [b, t]: its tokens before the first stop id,
        decoded without special tokens. A sampled NUL byte (byte-level vocabularies hold one)
        reads as U+FFFD, as invalid UTF-8 already does: the reward models refuse a NUL."""
        out = []
        for row in np.asarray(ids):
            ends = np.flatnonzero(np.isin(row, self.stop_ids))
            text = self.tokenizer.decode(row[:ends[0]] if ends.size else row).strip()
            out.append(text.replace("\x00", "\ufffd"))
        return out

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        self.tokenizer.save_pretrained(folder)
