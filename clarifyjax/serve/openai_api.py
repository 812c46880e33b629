"""An OpenAI-compatible HTTP API over any `TextGenerator` (what `clarifyjax serve MODEL_DIR` runs):
``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``.

The request fields and their defaults are listed above `OpenAIServer`; a field it cannot honour
is accepted only at its neutral value, anything else bad is a 400 naming it. Requests are batched
by `ContinuousBatcher` (the default) or `MicroBatcher`."""
from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
import uuid
from collections.abc import Sequence
import argparse

from clarifyjax.serve.http_server import (ApiError, MicroBatcher, add_listen_options, check_keys,
                                error_response, read_json_object, wait_unless_disconnected)
from clarifyjax.text.generator import (MAX_STOP_STRINGS, Completion, Sampling, SamplingError,
                                TextGenerator, TokenCounter, check_messages)
from clarifyjax.text.tokenizer import TextEncodingError, check_encodable
from clarifyjax.core.ranges import number_type

INT32_MAX = 2 ** 31 - 1  # the engines hold top_k and min_tokens in int32 arrays
API_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for, and how much may wait."""

    max_n: int = 16
    max_tokens: int = 512         # also the default max_tokens of a chat request
    max_prompts: int = 64         # prompts in one /v1/completions request
    max_body_bytes: int = 1 << 20
    max_batch_rows: int = 64      # prompts x n of the requests gathered into one batch
    max_queued_rows: int = 1024   # more waiting: 503 at once
    window_s: float = 0.01        # how long the first waiting request waits for company


COMMON = ("model", "n", "max_tokens", "temperature", "top_p", "top_k", "min_tokens", "stop",
          "seed", "logprobs", "stream", "user", "presence_penalty", "frequency_penalty",
          "logit_bias")
COMPLETION_FIELDS = COMMON + ("prompt", "echo", "best_of", "suffix")
CHAT_FIELDS = COMMON + ("messages", "max_completion_tokens", "top_logprobs")
# Accepted only at these values: anything else would be silently ignored.
NEUTRAL = {"stream": (False, None), "echo": (False, None), "presence_penalty": (0, None),
           "frequency_penalty": (0, None), "logit_bias": (None,), "suffix": (None,),
           "top_logprobs": (0, None)}


@dataclasses.dataclass
class _Job:
    prompts: list
    sampling: Sampling
    n: int
    seed: int | None


def _int(body: dict, key: str, low: int, high: int | None = None, default=None):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ApiError(400, f"{key} must be an integer {bounds}, got {value!r}", param=key)
    return value


def _number(body: dict, key: str, low: float, high: float):
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ApiError(400, f"{key} must be a number in [{low}, {high}], got {value!r}",
                       param=key)
    return float(value)


def _stop(body: dict) -> tuple[str, ...]:
    """The stop strings: text a tokenizer can encode (no NUL, no lone surrogate: a model's
    output never holds them, and the tokenizer refuses them)."""
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)):
        raise ApiError(400, f"stop must be a non-empty string or a list of at most "
                            f"{MAX_STOP_STRINGS} of them", param="stop")
    try:
        check_encodable(stop)
    except TextEncodingError as e:
        raise ApiError(400, f"stop[{e.index}] {e.reason}", param="stop") from None
    return tuple(stop)


# Request fields: model, n, max_tokens (chat: also max_completion_tokens; both given must agree),
# temperature (0 = greedy), top_p, top_k (the OpenAI client sends it through extra_body), min_tokens,
# stop, seed, logprobs (completions: 0, the chosen tokens' log-probs; chat: true/false). Log-probs
# are of the distribution each token was drawn from (after temperature, top-k and top-p). Fields
# OpenAI defines but this server cannot honour (stream, echo, penalties, logit_bias, alternatives in
# top_logprobs) are accepted only at their neutral values; any other field is a 400 naming it, as
# are out-of-range values (integers within int32 and the server's limits, stop strings a tokenizer
# encodes), n over the limit and a prompt that does not fit the room (the context, or the slot
# length when shorter) with its max_tokens or min_tokens (context_length_exceeded), all before the
# request joins a batch. A sampling field left out is the model's default (its generation_config:
# greedy unless it samples), not OpenAI's temperature 1; max_tokens left out is 16 for completions
# (as OpenAI) and, for chats, what the room leaves, up to the server's limit.
# With the window batcher, a sampled request that gives a seed runs in a call of its own (its
# completions depend on its seed only); greedy and unseeded requests share a `complete` call.
class OpenAIServer:
    """The Starlette app (`.app`) serving `generator` under the model name `name`."""

    def __init__(self, generator: TextGenerator, *, name: str | None = None,
                 limits: ServerLimits = ServerLimits(), batcher=None):
        """`batcher`: what runs the requests, with `MicroBatcher`'s interface (`submit`,
        `close`, `row_length`), e.g. `serve.continuous.ContinuousBatcher`; None: a
        `MicroBatcher` of `limits`' window over `generator.complete`."""
        self.generator, self.limits = generator, limits
        if name is not None:
            model_name(name)
        self.name = name or generator.name
        self.counter = generator if isinstance(generator, TokenCounter) else None
        self.batcher = batcher or MicroBatcher(self._run_batch, window_s=limits.window_s,
                                               max_batch_rows=limits.max_batch_rows,
                                               max_queued_rows=limits.max_queued_rows)
        self._unseeded = 0
        self.app = self._build_app()

    # -- the app ----------------------------------------------------------------------------

    def _build_app(self):
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        def guarded(handler):
            async def endpoint(request):
                try:
                    return JSONResponse(await handler(request))
                except ApiError as e:
                    return error_response(e)
                except Exception as e:  # a bug: the log has its traceback, the client JSON
                    traceback.print_exc()
                    return error_response(ApiError(500, f"{request.url.path}: internal error: "
                                                        f"{type(e).__name__}: {e}"))
            return endpoint

        async def http_error(request, exc):
            return error_response(ApiError(exc.status_code, f"{request.method} "
                                           f"{request.url.path}: {exc.detail}"))

        routes = [Route("/v1/completions", guarded(self._completions), methods=["POST"]),
                  Route("/v1/chat/completions", guarded(self._chat), methods=["POST"]),
                  Route("/v1/models", guarded(self._models), methods=["GET"]),
                  Route("/health", guarded(self._health), methods=["GET"])]
        @contextlib.asynccontextmanager
        async def lifespan(app):
            yield
            self.batcher.close()

        return Starlette(routes=routes, exception_handlers={HTTPException: http_error},
                         lifespan=lifespan)

    async def _health(self, request) -> dict:
        return {"status": "ok"}

    async def _models(self, request) -> dict:
        card = {"id": self.name, "object": "model", "created": 0, "owned_by": "clarifyjax"}
        if self.counter is not None:
            card["max_model_len"] = self._room()[0]
        return {"object": "list", "data": [card]}

    # -- requests -----------------------------------------------------------------------------

    def _common(self, body: dict, default_max_tokens: int | None) -> tuple[Sampling, int, int]:
        """The sampling fields, each checked against its type's and the engines' limits."""
        model = body.get("model")
        if model is not None and model != self.name:
            raise ApiError(404, f"model {model!r} is not served here; this server serves "
                                f"{self.name!r}", param="model", code="model_not_found")
        for key, allowed in NEUTRAL.items():
            if body.get(key) not in allowed:
                raise ApiError(400, f"{key}={body[key]!r} is not supported by this server "
                                    f"(only {allowed[0]!r})", param=key)
        if not isinstance(body.get("user", ""), str):
            raise ApiError(400, "user must be a string", param="user")
        n = _int(body, "n", 1, self.limits.max_n, default=1)
        best_of = body.get("best_of")
        if best_of is not None and best_of != n:
            raise ApiError(400, "best_of is not supported (only equal to n)", param="best_of")
        given = _int(body, "max_tokens", 1, self.limits.max_tokens)
        newer = _int(body, "max_completion_tokens", 1, self.limits.max_tokens)
        if given is not None and newer is not None and given != newer:
            raise ApiError(400, f"max_tokens ({given}) and max_completion_tokens ({newer}) "
                                "disagree; give one of them", param="max_completion_tokens")
        max_tokens = next((v for v in (given, newer) if v is not None), default_max_tokens)
        min_tokens = _int(body, "min_tokens", 0, self.limits.max_tokens)
        if max_tokens is not None and (min_tokens or 0) > max_tokens:
            default = ", the default" if given is None and newer is None else ""
            raise ApiError(400, f"min_tokens ({min_tokens}) is more than max_tokens "
                                f"({max_tokens}{default})", param="min_tokens")
        top_k = _int(body, "top_k", -1, INT32_MAX)  # vLLM's "off" is -1, ours 0
        try:
            sampling = Sampling(max_new_tokens=max_tokens, min_new_tokens=min_tokens,
                                temperature=_number(body, "temperature", 0.0, 2.0),
                                top_k=None if top_k is None else max(top_k, 0),
                                top_p=_number(body, "top_p", 1e-9, 1.0), stop=_stop(body))
        except SamplingError as e:
            name = API_NAMES.get(e.field, e.field)
            raise ApiError(400, f"{name}: {e.reason}", param=name) from e
        seed = _int(body, "seed", -(2 ** 63), 2 ** 64 - 1)
        return sampling, n, seed

    def _room(self) -> tuple[int, str]:
        """Most positions a prompt and its new tokens may take, and what sets it: the model's
        context, or the batcher's rows when shorter (`--slot-length`)."""
        context = self.counter.context_length
        rows = self.batcher.row_length
        if rows is not None and rows < context:
            return rows, f"the server's slot length of {rows} positions"
        return context, f"the model's context length of {context} tokens"

    def _fit(self, prompts: Sequence, sampling: Sampling, field: str) -> tuple[Sampling, list]:
        """Prompt lengths, checked against the room (`_room`) with max_tokens (a chat request
        without max_tokens gets what is left of the room, up to the limit)."""
        if self.counter is None:
            return sampling, [0] * len(prompts)
        try:
            lengths = [self.counter.count_tokens(p) for p in prompts]
        except ValueError as e:
            raise ApiError(400, str(e), param=field) from e
        room, what = self._room()
        if sampling.max_new_tokens is None:
            left = room - max(lengths)
            if (sampling.min_new_tokens or 0) > left:
                raise ApiError(400, f"min_tokens ({sampling.min_new_tokens}) is more than the "
                                    f"{max(left, 0)} tokens left after the {max(lengths)} prompt "
                                    f"tokens in {what}", param="min_tokens",
                               code="context_length_exceeded")
            sampling = dataclasses.replace(sampling,
                                           max_new_tokens=max(1, min(left, self.limits.max_tokens)))
        for i, length in enumerate(lengths):
            if length + sampling.max_new_tokens > room:
                where = f"{field}[{i}]" if field == "prompt" and len(prompts) > 1 else field
                raise ApiError(400, f"{where}: {length} prompt tokens + max_tokens "
                                    f"{sampling.max_new_tokens} is more than {what}", param=field,
                               code="context_length_exceeded")
        return sampling, lengths

    async def _complete(self, request, job: _Job) -> list[list[Completion]]:
        return await wait_unless_disconnected(
            request, self.batcher.submit(job, rows=len(job.prompts) * job.n))

    async def _completions(self, request) -> dict:
        body = await read_json_object(request, max_bytes=self.limits.max_body_bytes)
        check_keys(body, COMPLETION_FIELDS, required=("prompt",))
        prompts = body["prompt"]
        prompts = [prompts] if isinstance(prompts, str) else prompts
        if (not isinstance(prompts, list) or not prompts
                or not all(isinstance(p, str) and p for p in prompts)):
            raise ApiError(400, "prompt must be a non-empty string or a list of them (token "
                                "ids are not accepted)", param="prompt")
        if len(prompts) > self.limits.max_prompts:
            raise ApiError(400, f"{len(prompts)} prompts; at most {self.limits.max_prompts} per "
                                "request", param="prompt")
        logprobs = _int(body, "logprobs", 0, 0)
        sampling, n, seed = self._common(body, default_max_tokens=16)
        sampling, lengths = self._fit(prompts, sampling, "prompt")
        results = await self._complete(request, _Job(prompts, sampling, n, seed))
        choices = [{"index": i * n + j, "text": c.text, "finish_reason": c.finish_reason,
                    "logprobs": None if logprobs is None else _completion_logprobs(c)}
                   for i, row in enumerate(results) for j, c in enumerate(row)]
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": self.name, "choices": choices,
                "usage": _usage(lengths, results)}

    async def _chat(self, request) -> dict:
        body = await read_json_object(request, max_bytes=self.limits.max_body_bytes)
        check_keys(body, CHAT_FIELDS, required=("messages",))
        try:
            messages = check_messages(body["messages"])
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from e
        logprobs = body.get("logprobs")
        if logprobs not in (None, True, False):
            raise ApiError(400, "logprobs must be true or false", param="logprobs")
        sampling, n, seed = self._common(body, default_max_tokens=None)
        sampling, lengths = self._fit([messages], sampling, "messages")
        results = await self._complete(request, _Job([messages], sampling, n, seed))
        choices = [{"index": j, "message": {"role": "assistant", "content": c.text},
                    "finish_reason": c.finish_reason,
                    "logprobs": {"content": _chat_logprobs(c)} if logprobs else None}
                   for j, c in enumerate(results[0])]
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": self.name, "choices": choices,
                "usage": _usage(lengths, results)}

    # -- batches ----------------------------------------------------------------------------

    def _run_batch(self, jobs: list[_Job]) -> list:
        """One `complete` call for the greedy and unseeded jobs together, one per seeded
        sampled job; a call that fails is retried job by job, so that only the culprit fails."""
        shared = [j for j in jobs if j.seed is None or j.sampling.greedy]
        groups = ([shared] if shared else []) + [[j] for j in jobs if j not in shared]
        results: dict[int, object] = {}
        for group in groups:
            try:
                outputs = self._call(group)
            except Exception:
                if len(group) == 1:
                    outputs = [_as_api_error(self._safe_call(group[0]))]
                else:
                    outputs = [_as_api_error(self._safe_call(j)) for j in group]
            results.update({id(j): out for j, out in zip(group, outputs)})
        return [results[id(j)] for j in jobs]

    def _call(self, group: list[_Job]) -> list[list[list[Completion]]]:
        prompts = [p for j in group for p in j.prompts]
        sampling = [j.sampling for j in group for _ in j.prompts]
        n = [j.n for j in group for _ in j.prompts]
        seed = group[0].seed if len(group) == 1 and group[0].seed is not None else None
        if seed is None:  # unseeded: a new seed per call, reproducible from the server's start
            seed, self._unseeded = 2 ** 32 + self._unseeded, self._unseeded + 1
        flat = self.generator.complete(prompts, sampling, n, seed)
        out, at = [], 0
        for j in group:
            out.append(flat[at: at + len(j.prompts)])
            at += len(j.prompts)
        return out

    def _safe_call(self, job: _Job):
        try:
            return self._call([job])[0]
        except Exception as e:
            return e


def _as_api_error(result):
    if isinstance(result, ApiError) or not isinstance(result, BaseException):
        return result
    if isinstance(result, ValueError):
        return ApiError(400, str(result))
    return ApiError(500, f"generation failed: {type(result).__name__}: {result}")


def _usage(lengths: Sequence[int], results: list[list[Completion]]) -> dict:
    prompt = int(sum(lengths))
    completion = sum(len(c.token_ids) for row in results for c in row)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _token_texts(c: Completion) -> list[str]:
    return list(c.token_texts) or [str(t) for t in c.token_ids]


def _completion_logprobs(c: Completion) -> dict:
    texts = _token_texts(c)
    offsets, at = [], 0
    for t in texts:
        offsets.append(at)
        at += len(t)
    return {"tokens": texts, "token_logprobs": [float(x) for x in c.logprobs],
            "top_logprobs": None, "text_offset": offsets}


def _chat_logprobs(c: Completion) -> list[dict]:
    return [{"token": t, "logprob": float(x), "bytes": list(t.encode("utf-8")),
             "top_logprobs": []} for t, x in zip(_token_texts(c), c.logprobs)]


def model_name(name: str) -> str:
    """A served model's name, checked: printed text that requests can repeat (not empty, no
    spaces at its ends, no control characters); ValueError otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a model name must be non-empty text, got {name!r}")
    if name != name.strip() or any(not c.isprintable() for c in name):
        raise ValueError(f"a model name may not hold control characters or start or end with "
                         f"spaces, got {name!r}")
    return name


def _model_name_option(value: str) -> str:
    try:
        return model_name(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_server_options(p) -> None:
    """`clarifyjax serve`'s address and `ServerLimits` options (an argparse parser)."""
    add_listen_options(p)
    p.add_argument("--name", default=None, type=_model_name_option,
                   help="the model's name in the API (default: the folder name)")
    p.add_argument("--max-n", type=number_type(int, "[1, 1024]"), default=16)
    p.add_argument("--max-tokens", type=number_type(int, ">= 1"), default=512,
                   help="most new tokens a request may ask for (and a chat's default)")
    p.add_argument("--max-queued-rows", type=number_type(int, ">= 1"), default=1024,
                   help="rows (prompts x n) waiting beyond which requests get 503")
