"""The OpenAI-compatible HTTP layer (clarifyjax.serve.openai_api over clarifyjax.serve.http_server) with a
fake generator: the real `openai` client against uvicorn on 127.0.0.1, every refused request
with its OpenAI-style error body, request-size and queue limits, micro-batching of concurrent
requests, and a client that disconnects. The same server over a real model: test_generate_and_serve.py.
"""
from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from clarifyjax.serve.openai_api import OpenAIServer, ServerLimits
from clarifyjax.serve.http_server import BackgroundServer
from clarifyjax.text.generator import Completion, Sampling, per_prompt
from helpers.env import require
from helpers.serving import http_json

pytestmark = pytest.mark.reference


class FakeGenerator:
    """Completion j of prompt p is "<p>#j" (one token per character); records every call; can
    be held (the worker blocks until `release`)."""

    name = "fake"
    context_length = 40

    def __init__(self):
        self.calls: list[tuple[list, list[Sampling], list[int], int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def count_tokens(self, prompt) -> int:
        return len(prompt if isinstance(prompt, str) else prompt[-1]["content"])

    def complete(self, prompts, sampling, n=1, seed=None):
        sampling, n = per_prompt(sampling, len(prompts), "s"), per_prompt(n, len(prompts), "n")
        self.calls.append((list(prompts), sampling, n, seed))
        self.entered.set()
        assert self.gate.wait(20)
        out = []
        for p, s, k in zip(prompts, sampling, n):
            text = p if isinstance(p, str) else p[-1]["content"]
            row = []
            for j in range(k):
                full = f"{text}#{j}"[: s.max_new_tokens]
                row.append(Completion(full, tuple(ord(c) for c in full),
                                      tuple(-0.5 for _ in full), "length", tuple(full)))
            out.append(row)
        return out


@pytest.fixture()
def served():
    require("openai")
    generator = FakeGenerator()
    server = OpenAIServer(generator, limits=ServerLimits(max_n=4, max_tokens=32,
                                                         max_body_bytes=4096, max_batch_rows=8,
                                                         max_queued_rows=8, window_s=0.05))
    with BackgroundServer(server.app) as background:
        yield generator, server, background.url


def _client(url):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20)


def _post(url, path, body: bytes, timeout=20):
    return http_json(url, path, body, timeout=timeout)


def test_the_openai_client_gets_completions_chats_and_models(served):
    generator, _, url = served
    client = _client(url)
    assert [m.id for m in client.models.list().data] == ["fake"]
    out = client.completions.create(model="fake", prompt=["ab", "cd"], n=2, max_tokens=5,
                                    temperature=0.5, top_p=0.9, stop=["zz"], seed=7, logprobs=0,
                                    extra_body={"top_k": 3})
    assert [(c.index, c.text) for c in out.choices] == [(0, "ab#0"), (1, "ab#1"), (2, "cd#0"),
                                                        (3, "cd#1")]
    assert out.choices[0].logprobs.token_logprobs == [-0.5] * 4
    assert out.choices[0].logprobs.tokens == list("ab#0")
    assert out.usage.prompt_tokens == 4 and out.usage.completion_tokens == 16
    _, sampling, n, seed = generator.calls[-1]
    assert sampling[0] == Sampling(max_new_tokens=5, temperature=0.5, top_k=3, top_p=0.9,
                                   stop=("zz",)) and n == [2, 2] and seed == 7
    chat = client.chat.completions.create(
        model="fake", messages=[{"role": "system", "content": "s"},
                                {"role": "user", "content": "hello"}], logprobs=True)
    assert chat.choices[0].message.content == "hello#0"
    assert chat.choices[0].logprobs.content[0].token == "h"
    # a chat without max_tokens gets what the context leaves (40 - 5), up to the limit (32)
    assert generator.calls[-1][1][0].max_new_tokens == 32


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", b'{"prompt": "ab", ', 400, None),                      # malformed JSON
    ("/v1/completions", b'[1, 2]', 400, None),                                 # not an object
    ("/v1/completions", b'{"prompt": "ab", "foo": 1}', 400, "foo"),            # unknown field
    ("/v1/completions", b'{"prompt": "ab", "n": 5}', 400, "n"),                # n over the limit
    ("/v1/completions", b'{"prompt": "ab", "n": 0}', 400, "n"),
    ("/v1/completions", b'{"prompt": "' + b"x" * 30 + b'"}', 400, "prompt"),   # 30 + 16 > 40
    ("/v1/completions", b'{"prompt": "ab", "max_tokens": 33}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "ab", "temperature": -1}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": "ab", "stream": true}', 400, "stream"),
    ("/v1/completions", b'{"prompt": "ab", "logprobs": 3}', 400, "logprobs"),
    ("/v1/completions", b'{"prompt": [], "n": 1}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "ab", "model": "gpt-4"}', 404, "model"),
    ("/v1/completions", b'{"prompt": "ab", "prompt": "cd"}', 400, "prompt"),   # key twice
    ("/v1/completions", b'{"prompt": "ab", "top_p": NaN}', 400, None),
    ("/v1/completions", b'{"prompt": "' + b"x" * 5000 + b'"}', 413, None),     # body too large
    ("/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}]}', 400,
     "messages"),
    ("/v1/chat/completions", b'{"messages": "hi"}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "n": 2, '
                             b'"max_tokens": 1, "min_tokens": 2}', 400, None),
    # two spellings of one setting that disagree: neither is dropped silently
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
                             b'"max_tokens": 3, "max_completion_tokens": 4}', 400,
     "max_completion_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
                             b'"max_tokens": 30, "max_completion_tokens": 1}', 400,
     "max_completion_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
                             b'"max_completion_tokens": 0}', 400, "max_completion_tokens"),
    ("/v1/completions", b'{"prompt": "ab", "max_completion_tokens": 4}', 400,
     "max_completion_tokens"),  # a chat field
    # beyond the engines' int32, text no tokenizer encodes, more than the room left (issue 37)
    ("/v1/completions", b'{"prompt": "ab", "top_k": 2147483648}', 400, "top_k"),
    ("/v1/completions", b'{"prompt": "ab", "stop": "a\\u0000b"}', 400, "stop"),
    ("/v1/completions", b'{"prompt": "ab", "stop": ["\\udc80"]}', 400, "stop"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "' + b"x" * 20
     + b'"}], "min_tokens": 25}', 400, "min_tokens"),
])
def test_bad_requests_get_an_openai_style_error(served, path, body, status, param):
    generator, _, url = served
    code, answer = _post(url, path, body)
    assert code == status, answer
    error = answer["error"]
    assert error["message"] and error["type"] and ("param" in error)
    if param is not None:
        assert error["param"] == param, error
    if b"x" * 30 in body and code == 400:
        assert error["code"] == "context_length_exceeded"
    assert generator.calls == []  # refused before anything was queued


def test_an_unexpected_error_is_a_json_500_and_a_traceback_in_the_log(served, capfd):
    generator, _, url = served

    def count_tokens(prompt):
        raise RuntimeError("a bug")

    generator.count_tokens = count_tokens
    code, answer = _post(url, "/v1/completions", b'{"prompt": "ab"}')
    assert code == 500 and answer["error"]["type"] == "server_error"
    assert answer["error"]["message"] == "/v1/completions: internal error: RuntimeError: a bug"
    assert "Traceback" in capfd.readouterr().err and generator.calls == []


def test_unknown_paths_and_methods_answer_in_the_same_format(served):
    _, _, url = served
    assert _post(url, "/v1/embeddings", b"{}")[0] == 404
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url + "/v1/completions", timeout=10)
    assert e.value.code == 405 and "error" in json.loads(e.value.read())


def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_concurrent_requests_share_batches_and_each_gets_its_own_answer(served):
    """The first batch holds the worker until the other requests wait, so that they must be
    gathered (8 requests: the queue holds 8 rows, more would be refused with 503)."""
    generator, server, url = served
    prompts = [f"p{i}" for i in range(8)]
    generator.gate.clear()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        # a client each: one client's connection pool could hold requests back
        answers = [pool.submit(lambda p: _client(url).completions.create(
            model="fake", prompt=p, max_tokens=8, temperature=0).choices[0].text, p)
            for p in prompts]
        _until(lambda: generator.entered.is_set() and (
            len(generator.calls[0][0]) + server.batcher._queued_rows == 8))
        generator.gate.set()
        texts = [a.result(timeout=20) for a in answers]
    assert texts == [f"{p}#0" for p in prompts]
    assert max(server.batcher.batches) > 1          # requests were gathered
    assert max(server.batcher.batches) <= 8         # never above max_batch_rows
    assert sum(server.batcher.batches) == 8 and len(generator.calls) <= 2


def test_seeded_sampled_requests_run_alone(served):
    generator, server, url = served
    client = _client(url)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: client.completions.create(
            model="fake", prompt=f"q{i}", max_tokens=4, temperature=1.0, seed=i), range(4)))
    assert sorted(call[3] for call in generator.calls) == [0, 1, 2, 3]
    assert all(len(call[0]) == 1 for call in generator.calls)


def _send_and_close(url: str, body: bytes, queued) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                     f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        _until(queued)  # the request is read and queued, then the client goes away


def test_a_disconnected_client_neither_stalls_nor_runs(served):
    """Request A holds the worker; B is queued, then its client disconnects; when A finishes,
    B is dropped unrun and C is answered at once. A request that overflows the queue is refused
    with 503 rather than waiting."""
    generator, server, url = served
    generator.gate.clear()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        first = pool.submit(_post, url, "/v1/completions", b'{"prompt": "A", "max_tokens": 4}')
        assert generator.entered.wait(10)
        _send_and_close(url, b'{"prompt": "B", "max_tokens": 4}',
                        lambda: server.batcher._queued_rows == 1)
        crowd = pool.submit(_post, url, "/v1/completions",
                            b'{"prompt": "C", "max_tokens": 4, "n": 4}')
        # C waits too (B's row stays counted until the worker skips it)
        _until(lambda: server.batcher._queued_rows == 5)
        # 5 rows are queued (B's and C's); 8 more do not fit max_queued_rows = 8
        code, answer = _post(url, "/v1/completions",
                             b'{"prompt": ["D", "E"], "max_tokens": 4, "n": 4}')
        assert code == 503 and answer["error"]["code"] == "overloaded"
        # the server notices B's client left (it polls every 50 ms) before A's batch ends
        _until(lambda: any(p.cancelled for p in server.batcher._queue))
        generator.gate.set()
        assert first.result(timeout=20)[1]["choices"][0]["text"] == "A#0"
        code, answer = crowd.result(timeout=20)
    assert code == 200 and [c["text"] for c in answer["choices"]] == [f"C#{j}" for j in range(4)]
    assert [call[0] for call in generator.calls] == [["A"], ["C"]]  # B never ran


def test_max_tokens_spellings_that_agree_and_model_names_that_cannot_be_served(served):
    generator, _, url = served
    code, answer = _post(url, "/v1/chat/completions",
                         b'{"messages": [{"role": "user", "content": "hello"}], '
                         b'"max_tokens": 3, "max_completion_tokens": 3}')
    assert code == 200 and answer["choices"][0]["message"]["content"] == "hel"
    for name in ("", "   ", " tiny", "tiny\n", "ti\x00ny"):
        with pytest.raises(ValueError, match="model name"):
            OpenAIServer(generator, name=name)


def test_the_server_answers_only_its_own_host_origin_and_json(served):
    """Raw HTTP against `clarifyjax serve`'s app: DNS rebinding (another Host), another site's
    Origin and a text/plain POST are refused before anything is queued."""
    import http.client

    generator, _, url = served
    own = url.removeprefix("http://")
    body = b'{"prompt": "ab", "max_tokens": 2}'
    cases = [({"Host": "evil.example", "Content-Type": "application/json"}, 400),
             ({"Host": own, "Origin": "http://evil.example", "Content-Type": "application/json"},
              403),
             ({"Host": own, "Content-Type": "text/plain"}, 415),
             ({"Host": own, "Content-Type": "application/x-www-form-urlencoded"}, 415),
             ({"Host": own}, 415)]
    host, port = own.rsplit(":", 1)
    for headers, status in cases:
        connection = http.client.HTTPConnection(host, int(port), timeout=20)
        connection.request("POST", "/v1/completions", body, headers)
        response = connection.getresponse()
        assert response.status == status and json.loads(response.read())["error"]["message"]
        connection.close()
    assert generator.calls == []
    assert _post(url, "/v1/completions", body)[0] == 200


def test_a_client_that_closes_mid_body_is_one_line_in_the_log(served, capfd):
    generator, _, url = served
    host, port = url.removeprefix("http://").split(":")
    capfd.readouterr()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: "
                     "application/json\r\nContent-Length: 900\r\n\r\n".encode() + b'{"prompt": "a')
    err = ""
    deadline = time.monotonic() + 20
    while "closed the connection" not in err and time.monotonic() < deadline:
        time.sleep(0.05)
        err += capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "POST /v1/completions" in lines[0], err
    assert "Traceback" not in err and generator.calls == []
