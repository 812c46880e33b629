"""The text generators of `sage-jax run` that `clarifyjax` does not have, behind its one interface
(`clarifyjax.text.generator.TextGenerator`); the local one is `clarifyjax`'s `LocalLM` as it is.

`OpenAIGenerator`: any OpenAI-compatible endpoint (vLLM, a hosted API, `clarifyjax serve`), with
retries and the key kept out of every output. `RecordedGenerator`: the texts of an existing
long-format file (the published SaGE files), so published outputs go through the same stages.
A generator that cannot get an answer raises `GenerationError`; the pipeline keeps finished rows."""
from __future__ import annotations

import email.utils
import hashlib
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Mapping, Sequence

from clarifyjax.text.generator import Completion, Prompt, Sampling, per_prompt
from sage_jax.run.config import OPENAI_CHAT_ARGUMENTS, REQUEST_ARGUMENTS
from clarifyjax.files.tables import NOT_TEXT, DataError, read_rows, text_cell
from clarifyjax.files.textfiles import unencodable

# Backoff between retries of one request, in seconds: BACKOFF_BASE * 2**attempt, at most BACKOFF_CAP,
# and never less than the server's Retry-After. A Retry-After longer than the generator's time
# limit (`timeout_s`) is not waited for: the request fails at once, naming the endpoint.
BACKOFF_BASE = 1.0
BACKOFF_CAP = 30.0
# How long one call of a Python function may take by default (`CallableGenerator.timeout_s`).
FUNCTION_TIMEOUT_S = 300.0


class GenerationError(RuntimeError):
    """A generator gave up on a request; the message names the endpoint or file and why."""


def as_messages(prompt: Prompt) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


def prompt_seed(seed: int | None, index: int) -> int | None:
    if seed is None:
        return None
    return int.from_bytes(hashlib.sha256(f"{seed}/{index}".encode()).digest()[:4], "little") & 0x7FFFFFFF


def _completion(text: str, finish_reason: str | None) -> Completion:
    return Completion(text, (), (), finish_reason or "stop")


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
    return wait if retry_after is None else max(wait, retry_after)


def say_on_stderr(text: str) -> None:
    """Where a generator says why it waits when no progress line shows it."""
    print(f"sage-jax: {text}", file=sys.stderr, flush=True)


def check_timeout(timeout_s, at: str = "timeout_s") -> float:
    """A time limit in seconds: a number in (0, 86400] (a day), else ValueError naming `at`."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 86400:
        raise ValueError(f"{at}: must be a number of seconds in (0, 86400], got {timeout_s!r}")
    return float(timeout_s)


def map_in_threads(fn: Callable, items: Sequence, workers: int) -> list:
    """[fn(x) for x in items], up to `workers` at once. The first failure is raised as soon as
    the calls already running end: the calls not yet started are dropped, not made."""
    if len(items) <= 1 or workers == 1:
        return [fn(x) for x in items]
    pool = ThreadPoolExecutor(max_workers=min(workers, len(items)))
    try:
        return list(pool.map(fn, items))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def read_api_key(variable: str | None) -> str:
    """The key from environment variable `variable` (None: a local server that wants none)."""
    if variable is None:
        return "none"
    key = os.environ.get(variable, "")
    if not key.strip():
        raise GenerationError(f"api_key_env: environment variable {variable} is not set or empty")
    return key.strip()


def reply_completions(body: str, api: str, endpoint: str) -> list[Completion]:
    """The completions of an endpoint's reply body, in `index` order; a `GenerationError` naming
    `endpoint` for a body that is not JSON, has no `choices` list, or holds a text that is not a
    string or not encodable (a lone surrogate such as "\\ud800", which no tokenizer or file takes)."""
    try:
        reply = json.loads(body)
    except ValueError:
        raise GenerationError(f"{endpoint}: the reply is not JSON ({body[:80]!r})") from None
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise GenerationError(f"{endpoint}: the reply has no `choices` list of objects ({body[:80]!r})")
    out = []
    for i, c in enumerate(sorted(choices, key=lambda c: c.get("index") or 0)):
        field = "text" if api == "completions" else "message.content"
        if api == "chat" and not isinstance(c.get("message"), dict):
            raise GenerationError(f"{endpoint}: choice {i} has no `message` object ({str(c)[:80]!r})")
        text = c.get("text") if api == "completions" else c["message"].get("content")
        if text is not None and not isinstance(text, str):
            raise GenerationError(f"{endpoint}: choice {i}'s {field} is {type(text).__name__} "
                                  f"{text!r:.60}, not a string")
        at = unencodable(text or "")
        if at is not None:
            raise GenerationError(f"{endpoint}: choice {i}'s {field} holds {text[at]!r} (a lone surrogate) at "
                                  f"character {at + 1}, which is not text")
        out.append(_completion(text or "", c.get("finish_reason")))
    return out


# `/v1/completions` for string prompts, `/v1/chat/completions` for chats. Only the request arguments
# in `accepts` are sent (OpenAI answers one it does not know, such as top_k, with a 400 no retry
# helps; `config.OPENAI_CHAT_ARGUMENTS` is the default for chat), and of those only the ones a
# `Sampling` sets; n only when above 1. At most `concurrency` requests in flight; a request that
# fails for a reason worth another try (429, 408, 5xx, a time-out, a dropped connection) is retried
# up to `max_retries` times with exponential backoff of at least the server's `Retry-After`; each
# wait is said through `on_wait` ("waiting 8 s: endpoint URL answered 429 ..."; a stage shows it
# on its progress line). A request that gets no answer for `timeout_s` seconds (connecting,
# sending, reading) is a time-out; a `Retry-After` longer than `timeout_s` fails the request at
# once. Prompt i of a call seeded s is sent with seed hash(s, i). The API key comes from the
# environment variable the config names; it is never in a message, a log line or an output
# (`describe` names the variable). After its retries it raises `GenerationError` naming the
# endpoint and the last error.
class OpenAIGenerator:
    """An OpenAI-compatible endpoint; retries and the key: see above."""

    def __init__(self, *, base_url: str, model: str, api: str = "completions", api_key_env: str | None = None,
                 concurrency: int = 8, timeout_s: float = 120.0, max_retries: int = 5, sleep=time.sleep,
                 accepts: Sequence[str] | None = None):
        import openai

        if api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', got {api!r}")
        if accepts is None:
            accepts = OPENAI_CHAT_ARGUMENTS if api == "chat" else REQUEST_ARGUMENTS
        unknown = [a for a in accepts if a not in REQUEST_ARGUMENTS]
        if unknown:
            raise ValueError(f"accepts: {unknown[0]!r} is not one of {', '.join(REQUEST_ARGUMENTS)}")
        self.accepts = tuple(accepts)
        self.base_url, self.model, self.api = base_url, model, api
        self.api_key_env, self.concurrency, self.timeout_s, self.max_retries = (
            api_key_env, concurrency, check_timeout(timeout_s), max_retries)
        self._sleep = sleep
        self.on_wait: Callable[[str], None] = say_on_stderr  # a stage points it at its progress line
        # The client's own retries are off: ours honour Retry-After and are counted per request.
        self._client = openai.OpenAI(base_url=base_url, api_key=read_api_key(api_key_env),
                                     timeout=timeout_s, max_retries=0)
        self._openai = openai
        self.retries = 0  # requests retried so far (all threads)
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.model

    def describe(self) -> dict:
        return {"kind": "openai", "base_url": self.base_url, "model": self.model, "api": self.api,
                "api_key_env": self.api_key_env, "accepts": list(self.accepts)}

    def _retryable(self, error: Exception) -> bool:
        o = self._openai
        if isinstance(error, (o.APITimeoutError, o.APIConnectionError, o.RateLimitError)):
            return True
        return isinstance(error, o.APIStatusError) and (error.status_code >= 500 or error.status_code == 408)

    def arguments(self, n: int, sampling: Sampling, seed: int | None) -> dict:
        """The request's arguments besides the prompt: those of `accepts` that are set."""
        if n != 1 and "n" not in self.accepts:
            raise GenerationError(f"{self.base_url}: {n} samples per prompt need the argument n, which the "
                                  f"endpoint does not accept (accepts: {list(self.accepts)})")
        values = {"max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                  "top_p": sampling.top_p, "top_k": sampling.top_k or None,  # 0: off, not sent
                  "seed": seed, "stop": list(sampling.stop) or None, "n": n if n != 1 else None}
        return {k: v for k, v in values.items() if v is not None and k in self.accepts}

    def _once(self, prompt: Prompt, n: int, sampling: Sampling, seed: int | None) -> list[Completion]:
        common = dict(model=self.model, **self.arguments(n, sampling, seed))
        if "top_k" in common:  # not an argument of the openai client: vLLM's extension, in the body
            common["extra_body"] = {"top_k": common.pop("top_k")}
        if self.api == "completions":
            if not isinstance(prompt, str):
                raise GenerationError(f"{self.base_url}: api completions takes text prompts; this stage "
                                      "gives chat messages (set api: chat)")
            raw = self._client.completions.with_raw_response.create(prompt=prompt, **common)
        else:
            raw = self._client.chat.completions.with_raw_response.create(messages=as_messages(prompt), **common)
        out = reply_completions(raw.text, self.api, f"{self.base_url} ({self.api}, model {self.model})")
        if len(out) != n:
            raise GenerationError(f"{self.base_url}: asked for {n} choices, the server returned {len(out)}")
        return out

    def _why(self, error: Exception) -> str:
        """Why a request is tried again, for the progress line."""
        status = getattr(error, "status_code", None)
        if status:
            return f"endpoint {self.base_url} answered {status}"
        if isinstance(error, self._openai.APITimeoutError):
            return f"endpoint {self.base_url} gave no answer within timeout_s {self.timeout_s:g} s"
        return f"endpoint {self.base_url} could not be reached ({type(error).__name__})"

    def _request(self, prompt: Prompt, n: int, sampling: Sampling, seed: int | None) -> list[Completion]:
        where = f"{self.base_url} ({self.api}, model {self.model})"
        for attempt in range(self.max_retries + 1):
            try:
                return self._once(prompt, n, sampling, seed)
            except self._openai.OpenAIError as e:
                status = getattr(e, "status_code", None)
                if not self._retryable(e) or attempt == self.max_retries:
                    tries = f"after {attempt + 1} attempt{'s' if attempt else ''}"
                    raise GenerationError(
                        f"{where}: {type(e).__name__}{f' {status}' if status else ''} {tries}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''}") from None
                asked = retry_after_seconds(getattr(getattr(e, "response", None), "headers", None))
                if asked is not None and asked > self.timeout_s:
                    raise GenerationError(
                        f"{where}: answered {status} and asked to wait {asked:.0f} s (Retry-After), longer than "
                        f"its time limit timeout_s {self.timeout_s:g} s; not waiting (raise timeout_s to wait "
                        "that long, or run again later)") from None
                with self._lock:
                    self.retries += 1
                wait = backoff_seconds(attempt, asked)
                self.on_wait(f"waiting {wait:.3g} s: {self._why(e)}"
                             f"{f' (Retry-After {asked:.3g} s)' if asked is not None else ''}; retry {attempt + 1} of "
                             f"{self.max_retries}")
                self._sleep(wait)
        raise AssertionError("unreachable")

    def complete(self, prompts: Sequence[Prompt], sampling: Sampling | Sequence[Sampling], n: int | Sequence[int] = 1,
                 seed: int | None = None) -> list[list[Completion]]:
        jobs = list(zip(prompts, per_prompt(n, len(prompts), "n"), per_prompt(sampling, len(prompts), "sampling"),
                        (prompt_seed(seed, i) for i in range(len(prompts)))))
        return map_in_threads(lambda job: self._request(*job), jobs, self.concurrency)


# ----------------------------------------------------------------------------- recorded outputs


class RecordedGenerator:
    """Texts of an existing long-format file (one row per paraphrase; the SaGE release's columns),
    returned for the prompt `prompt_of(row)` each row would have been given. Several rows with one
    prompt (the release repeats some paraphrases) are that prompt's samples, in file order: the
    i-th time a stage asks for a prompt it gets its i-th text (after the last, the first again),
    counted by the stage from its batch files (`complete_from`), so a resumed stage gets what an
    uninterrupted one got. A prompt the file lacks is a `GenerationError` naming it."""

    def __init__(self, path, *, column: str, prompt_of: Callable[[Mapping[str, str]], Prompt]):
        self.path, self.column = str(path), column
        header, rows = read_rows(path)
        if column not in header:
            raise DataError(f"{path}: missing column {column!r} (the file has: {', '.join(header)})")
        self._texts: dict[str, list[str]] = {}
        for line, row in rows:
            texts = {k: v for k, v in row.items() if v is not None and v is not NOT_TEXT}
            try:
                prompt = prompt_of(texts)
            except KeyError as e:  # a field the row lacks, or a JSON array or object: named
                text_cell(row, e.args[0], f"{path}:{line}")
                raise
            self._texts.setdefault(_prompt_key(prompt), []).append(text_cell(row, column, f"{path}:{line}"))

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def describe(self) -> dict:
        return {"kind": "file", "path": self.path, "column": self.column}

    def complete(self, prompts, sampling, n=1, seed=None):
        """Each prompt's first texts (a prompt given twice in the call: its next ones the second
        time); the same call gives the same texts."""
        counts, served = per_prompt(n, len(prompts), "n"), []
        seen: dict[str, int] = {}
        for prompt, count in zip(prompts, counts):
            key = _prompt_key(prompt)
            served.append(seen.get(key, 0))
            seen[key] = served[-1] + count
        return self.complete_from(prompts, served, counts)

    def complete_from(self, prompts, served: Sequence[int], n=1) -> list[list[Completion]]:
        """Prompt i's texts after its first `served[i]` (`stages.Recorded`)."""
        out = []
        for prompt, first, count in zip(prompts, served, per_prompt(n, len(prompts), "n")):
            texts = self._texts.get(_prompt_key(prompt))
            if texts is None:
                shown = prompt if isinstance(prompt, str) else prompt[-1]["content"]
                raise GenerationError(f"{self.path}: no row gives the prompt {shown.strip()[-120:]!r}")
            out.append([_completion(texts[(first + i) % len(texts)], "stop") for i in range(count)])
        return out


def _prompt_key(prompt: Prompt) -> str:
    return json.dumps(prompt if isinstance(prompt, str) else [dict(m) for m in prompt], sort_keys=True)


# ----------------------------------------------------------------------------- a Python function


class CallableGenerator:
    """A Python function `fn(text) -> str` as a generator (`sage_jax.score`'s `get_response`, the
    reference library's callable). `argument_of(prompt)` is the text the function is given (the
    paraphrase, for answers; the prompt itself otherwise). Up to `concurrency` calls run at once
    in threads; a call that raises is tried again up to `max_retries` times, after
    `backoff_seconds(attempt)` (said through `on_wait`); then `GenerationError` names the function
    and its last error. Each call runs in a thread of its own: one that has not returned after
    `timeout_s` seconds is abandoned (a Python thread cannot be stopped: it runs on unseen, and its
    answer is dropped) and is a `GenerationError`, not retried. One sample per prompt (the
    function takes no seed)."""

    def __init__(self, fn: Callable[[str], str], *, name: str, argument_of: Callable[[Prompt], str] | None = None,
                 concurrency: int = 8, max_retries: int = 5, timeout_s: float = FUNCTION_TIMEOUT_S,
                 sleep=time.sleep):
        if not callable(fn):
            raise TypeError(f"{name}: must be a function of one str that returns a str, got {type(fn).__name__}")
        self.fn, self._name, self.concurrency, self.max_retries = fn, name, concurrency, max_retries
        self.timeout_s = check_timeout(timeout_s)
        self.argument_of = argument_of or (lambda prompt: prompt)
        self._sleep = sleep
        self.on_wait: Callable[[str], None] = say_on_stderr  # a stage points it at its progress line

    @property
    def name(self) -> str:
        return self._name

    def describe(self) -> dict:
        return {"kind": "callable", "name": self._name}

    def _call_once(self, argument: str) -> tuple[object, Exception | None]:
        """(what the function returned, what it raised) of one call, given `timeout_s` seconds."""
        box: dict = {}

        def call() -> None:
            try:
                box["text"] = self.fn(argument)
            except Exception as e:  # handed to the caller's thread
                box["error"] = e

        worker = threading.Thread(target=call, name=f"sage-jax {self._name}", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise GenerationError(f"{self._name}: the function gave no answer within timeout_s {self.timeout_s:g} s; "
                                  "the call was abandoned (a Python function cannot be stopped) and is not retried")
        if "text" not in box and "error" not in box:  # it raised a BaseException (SystemExit) in its thread
            return None, RuntimeError("the call ended without returning")
        return box.get("text"), box.get("error")

    def _call(self, prompt: Prompt) -> Completion:
        argument = self.argument_of(prompt)
        for attempt in range(self.max_retries + 1):
            text, e = self._call_once(argument)
            if e is not None:  # the caller's function: any failure is worth another try
                detail = f"{type(e).__name__}{': ' + str(e).splitlines()[0][:200] if str(e) else ''}"
                if attempt == self.max_retries:
                    raise GenerationError(f"{self._name}: the function raised {type(e).__name__} after "
                                          f"{attempt + 1} attempts: {str(e).splitlines()[0][:200] if str(e) else ''}")
                wait = backoff_seconds(attempt, None)
                self.on_wait(f"waiting {wait:.3g} s: {self._name} raised {detail}; retry {attempt + 1} of "
                             f"{self.max_retries}")
                self._sleep(wait)
                continue
            if not isinstance(text, str):
                raise GenerationError(f"{self._name}: the function returned {type(text).__name__}, not a str")
            return _completion(text, "stop")
        raise AssertionError("unreachable")

    def complete(self, prompts, sampling, n=1, seed=None):
        if any(count != 1 for count in per_prompt(n, len(prompts), "n")):
            raise GenerationError(f"{self._name}: a function gives one answer per call; samples must be 1")
        return [[c] for c in map_in_threads(self._call, prompts, self.concurrency)]
