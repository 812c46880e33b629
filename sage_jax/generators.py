"""Text generators behind one small interface: prompts in, `n` texts per prompt out.

`Generator.generate(prompts, *, n, sampling, seeds)` returns, for each prompt, a list of `n`
continuations (the new text only, never the prompt). `seeds[i]` is prompt i's own seed, so what a
prompt gets does not depend on which other prompts share its batch: a resumed run, whose batches
differ, asks the same questions with the same seeds. A prompt is a string (raw completion) or a
tuple of chat messages (`{"role": ..., "content": ...}`).

Three kinds:

* `LocalGenerator`: a causal LM folder run by `clarifyjax.llm` (the local LLM runner); wrapped, not
  re-implemented here.
* `OpenAIGenerator`: any OpenAI-compatible endpoint (vLLM, a hosted API, `clarifyjax serve`)
  through the `openai` package: `/v1/completions` for string prompts, `/v1/chat/completions` for
  chat. At most `concurrency` requests in flight; a request that fails for a reason worth another
  try (429, 5xx, a time-out, a dropped connection) is retried up to `max_retries` times with
  exponential backoff that waits at least what the server's `Retry-After` asks. The API key comes
  from the environment variable the config names; it is never part of a message, a log line or an
  output (`describe` names the variable only).
* `RecordedGenerator`: the answers (or rules of thumb) of an existing long-format file (the
  published SaGE files), looked up by question id and paraphrase: published outputs go through the
  same scoring path as generated ones.

A generator that cannot get an answer after its retries raises `GenerationError` naming the
endpoint and the last error; the pipeline keeps the rows finished before it.
"""
from __future__ import annotations

import email.utils
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, Union

Message = Mapping[str, str]
Prompt = Union[str, Sequence[Message]]

# Backoff between retries of one request, in seconds: BACKOFF_BASE * 2**attempt, at most BACKOFF_CAP,
# and never less than the server's Retry-After (itself capped at RETRY_AFTER_CAP: a server asking
# for an hour would stall the run without a word).
BACKOFF_BASE = 1.0
BACKOFF_CAP = 30.0
RETRY_AFTER_CAP = 300.0


class GenerationError(RuntimeError):
    """A generator gave up on a request; the message names the endpoint or file and why."""


@dataclass(frozen=True)
class Sampling:
    """Decoding settings of one request. None: the model's own default (its
    generation_config.json for a local model; the server's default for an endpoint)."""

    max_new_tokens: int = 256
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None


class Generator(Protocol):
    def generate(self, prompts: Sequence[Prompt], *, n: int, sampling: Sampling,
                 seeds: Sequence[int], contexts: Sequence[Mapping] | None = None) -> list[list[str]]:
        """[len(prompts)] lists of n texts. `contexts[i]` describes prompt i's row (question id,
        paraphrase, ...): only a generator that looks answers up (RecordedGenerator) reads it."""

    def describe(self) -> dict:
        """What produced the texts, for the run's records (never a secret)."""


def as_text_prompt(prompt: Prompt) -> str:
    if not isinstance(prompt, str):
        raise GenerationError("this generator takes raw text prompts; the stage gave chat messages "
                              "(set api: chat, or a preset prompt without a chat template)")
    return prompt


def as_messages(prompt: Prompt) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


# ----------------------------------------------------------------------------- HTTP


def retry_after_seconds(headers) -> float | None:
    """The wait a response asks for: `retry-after-ms`, or `Retry-After` as seconds or an HTTP date."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


def backoff_seconds(attempt: int, retry_after: float | None) -> float:
    wait = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** attempt)
    if retry_after is not None:
        wait = max(wait, min(retry_after, RETRY_AFTER_CAP))
    return wait


def read_api_key(variable: str | None) -> str:
    """The key from environment variable `variable` (None: a local server that wants none)."""
    if variable is None:
        return "none"
    key = os.environ.get(variable, "")
    if not key.strip():
        raise GenerationError(f"api_key_env: environment variable {variable} is not set or empty")
    return key.strip()


class OpenAIGenerator:
    """An OpenAI-compatible endpoint; see the module docstring for retries and the key."""

    def __init__(self, *, base_url: str, model: str, api: str = "completions", api_key_env: str | None = None,
                 concurrency: int = 8, timeout_s: float = 120.0, max_retries: int = 5, sleep=time.sleep):
        import openai

        if api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', got {api!r}")
        self.base_url, self.model, self.api = base_url, model, api
        self.api_key_env, self.concurrency, self.timeout_s, self.max_retries = (
            api_key_env, concurrency, timeout_s, max_retries)
        self._sleep = sleep
        # The client's own retries are off: ours honour Retry-After and are counted per request.
        self._client = openai.OpenAI(base_url=base_url, api_key=read_api_key(api_key_env),
                                     timeout=timeout_s, max_retries=0)
        self._openai = openai
        self.retries = 0  # requests retried so far (all threads)
        self._lock = threading.Lock()

    def describe(self) -> dict:
        return {"kind": "openai", "base_url": self.base_url, "model": self.model, "api": self.api,
                "api_key_env": self.api_key_env}

    def _retryable(self, error: Exception) -> bool:
        o = self._openai
        if isinstance(error, (o.APITimeoutError, o.APIConnectionError, o.RateLimitError)):
            return True
        return isinstance(error, o.APIStatusError) and (error.status_code >= 500 or error.status_code == 408)

    def _once(self, prompt: Prompt, n: int, sampling: Sampling, seed: int) -> list[str]:
        extra = {} if sampling.top_k is None else {"top_k": sampling.top_k}
        common = dict(model=self.model, n=n, seed=seed, max_tokens=sampling.max_new_tokens,
                      extra_body=extra or None)
        if sampling.temperature is not None:
            common["temperature"] = sampling.temperature
        if sampling.top_p is not None:
            common["top_p"] = sampling.top_p
        if self.api == "completions":
            response = self._client.completions.create(prompt=as_text_prompt(prompt), **common)
            texts = [c.text or "" for c in sorted(response.choices, key=lambda c: c.index)]
        else:
            response = self._client.chat.completions.create(messages=as_messages(prompt), **common)
            texts = [c.message.content or "" for c in sorted(response.choices, key=lambda c: c.index)]
        if len(texts) != n:
            raise GenerationError(f"{self.base_url}: asked for {n} choices, the server returned {len(texts)}")
        return texts

    def _request(self, prompt: Prompt, n: int, sampling: Sampling, seed: int) -> list[str]:
        for attempt in range(self.max_retries + 1):
            try:
                return self._once(prompt, n, sampling, seed)
            except self._openai.OpenAIError as e:
                if not self._retryable(e) or attempt == self.max_retries:
                    status = getattr(e, "status_code", None)
                    tries = f"after {attempt + 1} attempt{'s' if attempt else ''}"
                    raise GenerationError(
                        f"{self.base_url} ({self.api}, model {self.model}): "
                        f"{type(e).__name__}{f' {status}' if status else ''} {tries}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''}") from None
                with self._lock:
                    self.retries += 1
                response = getattr(e, "response", None)
                self._sleep(backoff_seconds(attempt, retry_after_seconds(getattr(response, "headers", None))))
        raise AssertionError("unreachable")

    def generate(self, prompts, *, n, sampling, seeds, contexts=None):
        if len(prompts) <= 1 or self.concurrency == 1:
            return [self._request(p, n, sampling, s) for p, s in zip(prompts, seeds)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(lambda ps: self._request(ps[0], n, sampling, ps[1]), zip(prompts, seeds)))


# ----------------------------------------------------------------------------- recorded outputs


class RecordedGenerator:
    """Texts of an existing long-format file (one row per paraphrase; the SaGE release's columns),
    looked up by (question id, paraphrase). A row the file lacks is a `GenerationError` naming it."""

    def __init__(self, path, *, column: str, question_id_column: str = "question_id",
                 paraphrase_column: str = "paraphrased"):
        from clarifyjax.tables import DataError, read_rows

        self.path, self.column = str(path), column
        header, rows = read_rows(path)
        missing = [c for c in (question_id_column, paraphrase_column, column) if c not in header]
        if missing:
            raise DataError(f"{path}: missing column{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(map(repr, missing))} (the file has: {', '.join(header)})")
        self._texts: dict[tuple[str, str], list[str]] = {}
        for _line, row in rows:
            key = (row[question_id_column].strip(), row[paraphrase_column].strip())
            self._texts.setdefault(key, []).append(row[column])

    def describe(self) -> dict:
        return {"kind": "file", "path": self.path, "column": self.column}

    def generate(self, prompts, *, n, sampling, seeds, contexts=None):
        if contexts is None:
            raise GenerationError(f"{self.path}: recorded outputs are looked up by question and paraphrase; "
                                  "this stage gives neither")
        out = []
        for context in contexts:
            key = (str(context["question_id"]), str(context["paraphrase"]).strip())
            texts = self._texts.get(key)
            if texts is None:
                raise GenerationError(f"{self.path}: no row for question {key[0]} with paraphrase {key[1][:80]!r}")
            # Repeated rows of one paraphrase (the release has some) are its samples, in file order.
            out.append([texts[(int(context.get("sample", 0)) + i) % len(texts)] for i in range(n)])
        return out


# ----------------------------------------------------------------------------- local


class LocalGenerator:
    """A causal LM folder run on this machine by `clarifyjax.llm` (batched, on the run's mesh)."""

    def __init__(self, folder, *, batch_size: int = 16, chat_template: bool = False, dtype: str = "float32"):
        from clarifyjax import llm

        self.folder, self.chat_template = str(folder), chat_template
        self._runner = llm.load_runner(folder, batch_size=batch_size, dtype=dtype)
        self.defaults = dict(getattr(self._runner, "generation_defaults", {}) or {})

    def describe(self) -> dict:
        return {"kind": "local", "folder": self.folder, "chat_template": self.chat_template,
                "generation_defaults": self.defaults}

    def generate(self, prompts, *, n, sampling, seeds, contexts=None):
        texts = [self._runner.render_chat(as_messages(p)) if self.chat_template else as_text_prompt(p)
                 for p in prompts]
        return self._runner.generate(texts, n=n, max_new_tokens=sampling.max_new_tokens,
                                     temperature=sampling.temperature, top_k=sampling.top_k,
                                     top_p=sampling.top_p, seeds=list(seeds))
