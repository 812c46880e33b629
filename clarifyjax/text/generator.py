"""The one interface of every text generator: prompts in, `n` completions per prompt out.

A `TextGenerator` may be a local causal LM (`decoding.local_lm.LocalLM`), an OpenAI-compatible
endpoint or a file of earlier outputs; its users do not know which. A prompt is a `str` or a list
of chat messages; `Sampling` holds the settings (None: the generator's default, temperature 0:
greedy); a `Completion` is one text with its token ids, log-probs and finish reason. No JAX and no
model code here, so a web-service generator implements it cheaply."""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Protocol, runtime_checkable
from collections.abc import Mapping, Sequence

from clarifyjax.core.ranges import within

Message = Mapping[str, str]
Prompt = str | Sequence[Message]
ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 4  # as OpenAI's API


class SamplingError(ValueError):
    """An invalid `Sampling` setting: its `field` and what is wrong with it (`reason`)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"sampling: {field}: {reason}")
        self.field, self.reason = field, reason


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How one prompt is sampled; None = the generator's default. The one type of generation
    settings: config sections parse into it (`config.loader`, `_bounds`), the decoding loops take
    it as their static settings, per-row arrays stack it (`decoding.sampling.stack_rows`).

    max_new_tokens: most tokens generated (>= 1). min_new_tokens: no end of text before this many.
    temperature: 0 = greedy, else > 0. top_k: 0 = off. top_p: in (0, 1]. stop: strings that end
    the completion (not included in its text). max_total_tokens: prompt + new tokens, as
    transformers' `max_length` (`sage-jax run` turns it into max_new_tokens per prompt).
    """

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    max_total_tokens: int | None = None

    _bounds: ClassVar = {"max_new_tokens": ">= 1", "min_new_tokens": ">= 0",
                         "temperature": ">= 0", "top_k": ">= 0", "top_p": "(0, 1]",
                         "max_total_tokens": ">= 2"}
    _integers: ClassVar = ("max_new_tokens", "min_new_tokens", "top_k", "max_total_tokens")

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        problem = self.problem()
        if problem is not None:
            raise SamplingError(*problem)

    def problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) of the first invalid setting, or None."""
        for name, bound in self._bounds.items():
            value = getattr(self, name)
            integer = name in self._integers
            kind = (int,) if integer else (int, float)
            if value is not None and not (isinstance(value, kind) and not isinstance(value, bool)
                                          and within(value, bound)):
                expected = (("an integer " if integer else "a number ")
                            + ("in " if bound[0] in "[(" else "") + bound
                            + (" (0 = off)" if name == "top_k" else ""))
                return name, f"must be {expected}, got {value!r}"
        if (self.min_new_tokens is not None and self.max_new_tokens is not None
                and self.min_new_tokens > self.max_new_tokens):
            return "min_new_tokens", (f"{self.min_new_tokens} is more than max_new_tokens "
                                      f"({self.max_new_tokens})")
        if len(self.stop) > MAX_STOP_STRINGS:
            return "stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}"
        if not all(isinstance(s, str) and s for s in self.stop):
            return "stop", f"must be non-empty strings, got {list(self.stop)!r}"
        return None

    def with_defaults(self, defaults: Sampling) -> Sampling:
        """These settings, each None filled from `defaults` (stop strings are added)."""
        values = {f.name: getattr(self, f.name) if getattr(self, f.name) is not None
                  else getattr(defaults, f.name) for f in dataclasses.fields(self)}
        values["stop"] = tuple(dict.fromkeys(defaults.stop + self.stop))
        return Sampling(**values)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclasses.dataclass(frozen=True)
class Completion:
    """One completion: its text, token ids [n] and their log-probs [n], and "stop" or "length"."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    token_texts: tuple[str, ...] = ()  # each token's own text, where the generator knows it


@runtime_checkable
class TextGenerator(Protocol):
    """Prompts in, `n` completions per prompt out.

    `complete(prompts, sampling, n, seed)` returns one list of `n` completions per prompt, in the
    order of `prompts`. `sampling` is one `Sampling` for all prompts or one per prompt; `n` one
    count or one per prompt. The same call with the same `seed` gives the same completions (a
    local model: whatever else runs; a remote endpoint: as far as it promises).
    """

    name: str

    def complete(self, prompts: Sequence[Prompt], sampling: Sampling | Sequence[Sampling],
                 n: int | Sequence[int] = 1, seed: int | None = None
                 ) -> list[list[Completion]]:
        ...


@runtime_checkable
class TokenCounter(Protocol):
    """What a generator that knows its tokenizer adds: a server checks prompts against the
    context before queueing them, and reports token usage."""

    context_length: int

    def count_tokens(self, prompt: Prompt) -> int:
        """Tokens of `prompt` as the generator would feed it (a chat rendered); ValueError when
        it cannot be rendered or encoded."""
        ...


def per_prompt(value, count: int, name: str) -> list:
    """`value` repeated `count` times when it is one setting, else checked to have `count` items."""
    if isinstance(value, (Sampling, int)):
        return [value] * count
    values = list(value)
    if len(values) != count:
        raise ValueError(f"{name}: {len(values)} values for {count} prompts")
    return values


def check_messages(messages, where: str = "messages") -> list[dict[str, str]]:
    """A chat as a list of {"role", "content"} dicts (roles system/user/assistant, text content);
    ValueError naming `where`, the message index and the field otherwise."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError(f"{where}: must be a non-empty list of messages")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"{where}[{i}]: must be an object with role and content")
        extra = sorted(set(message) - {"role", "content", "name"})
        if extra:
            raise ValueError(f"{where}[{i}]: unknown field(s) {extra}")
        if message.get("role") not in ROLES:
            raise ValueError(f"{where}[{i}].role: must be one of {list(ROLES)}, got "
                             f"{message.get('role')!r}")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"{where}[{i}].content: must be a string")
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


def cut_at_stop(text: str, stop: Sequence[str]) -> int | None:
    """Where `text` is cut: the start of the earliest stop string in it, or None."""
    found = [at for at in (text.find(s) for s in stop) if at >= 0]
    return min(found) if found else None
