"""Issue 37, class 4: nothing waits forever or in silence. A Python function (`sage_jax.score`'s
`get_response`) and an endpoint each have a time limit with a finite default (`timeout_s`); a
`Retry-After` longer than it fails the request at once, naming the endpoint; every wait is said on
the stage's progress line (or on stderr when no bar is shown). Each test is bounded to a few
seconds: the functions here hang on an event, and the endpoint is a stdlib HTTP server on
127.0.0.1 that answers 429 with `Retry-After: 10000`.
"""
from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time

import pytest

from clarifyjax.text.generator import Sampling
from helpers.env import require
from sage_jax.run import generators
from sage_jax.run.generators import CallableGenerator, GenerationError
from sage_jax.run.stages import Stage, StageError, Task

QUESTION = "Is it ever right to lie to a friend?"
PARAPHRASES = [f"{QUESTION[:-1]}, {w}?" for w in ("really", "truly", "honestly", "ever", "at all")]


@contextlib.contextmanager
def endpoint(answer):
    """(base URL, requests seen) of /v1/completions on 127.0.0.1 answering request n with
    `answer(n) -> (status, headers, json)`."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            status, headers, payload = answer(len(seen))
            body = json.dumps(payload).encode()
            self.send_response(status)
            for key, value in {"Content-Type": "application/json", "Content-Length": str(len(body)),
                               **headers}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


def choice(text: str) -> dict:
    return {"id": "x", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]}


SLOW_DOWN = (429, {"Retry-After": "10000"}, {"error": {"message": "slow down"}})


def test_a_retry_after_longer_than_the_time_limit_fails_at_once_naming_the_endpoint():
    require("openai")
    waits = []
    with endpoint(lambda n: SLOW_DOWN) as (url, seen):
        gen = generators.OpenAIGenerator(base_url=url, model="m", max_retries=3, sleep=waits.append)
        assert gen.timeout_s == 120.0  # the default limit
        started = time.monotonic()
        with pytest.raises(GenerationError) as e:
            gen.complete(["q"], Sampling(max_new_tokens=4), 1, seed=0)
    assert time.monotonic() - started < 5 and len(seen) == 1 and waits == []  # asked once, never waited
    message = str(e.value)
    assert message.startswith(f"{url} (completions, model m): answered 429 and asked to wait 10000 s "
                              "(Retry-After), longer than its time limit timeout_s 120 s; not waiting"), message
    assert "\n" not in message


def stage(tmp_path) -> Stage:
    return Stage("answer", tmp_path / "stage", [Task(("q1", 0, "m", 0), "q")], fingerprint={}, max_attempts=1,
                 batch_size=4, seed=0)


def judge(tasks, texts, previous):
    return [{"ok": True, "reason": None, "answer": t} for t in texts]


@pytest.mark.parametrize("quiet", [False, True])
def test_a_wait_for_an_endpoint_is_said_on_the_progress_line(tmp_path, capsys, quiet):
    require("openai")
    waits = []
    once = (429, {"Retry-After": "1"}, {"error": {"message": "slow down"}})
    with endpoint(lambda n: once if n == 1 else (200, {}, choice("fine"))) as (url, seen):
        gen = generators.OpenAIGenerator(base_url=url, model="m", max_retries=3, sleep=waits.append)
        rows = stage(tmp_path).run(lambda: gen, judge, sampling=Sampling(max_new_tokens=4), quiet=quiet,
                                   describe=" (m)")
    assert [r["answer"] for r in rows] == ["fine"] and waits == [1.0] and len(seen) == 2
    said = f"waiting 1 s: endpoint {url} answered 429 (Retry-After 1 s); retry 1 of 3"
    err = capsys.readouterr().err
    if quiet:  # no bar: one line of its own
        assert f"sage-jax: stage answer (m): {said}\n" in err, err
    else:  # the bar's postfix
        assert f"{said}]" in err, err


def test_a_function_that_never_answers_is_abandoned_after_its_time_limit():
    release, calls = threading.Event(), []

    def hangs(text):
        calls.append(text)
        release.wait(30)
        return "too late"

    gen = CallableGenerator(hangs, name="get_response", timeout_s=0.5, concurrency=4)
    assert CallableGenerator(hangs, name="f").timeout_s == generators.FUNCTION_TIMEOUT_S == 300.0
    started = time.monotonic()
    try:
        with pytest.raises(GenerationError, match=r"^get_response: the function gave no answer within timeout_s "
                                                  r"0.5 s; the call was abandoned \(a Python function cannot be "
                                                  r"stopped\) and is not retried$"):
            gen.complete([f"q{i}" for i in range(16)], Sampling())
        elapsed = time.monotonic() - started
    finally:
        release.set()
    # one round of four calls, not four rounds: the calls not yet started were dropped
    assert elapsed < 1.8 and len(calls) < 16, (elapsed, calls)


def test_a_function_that_raises_says_why_the_run_waits(capsys):
    calls = []

    def busy_once(text):
        calls.append(text)
        if len(calls) == 1:
            raise ValueError("busy")
        return "an answer"

    gen = CallableGenerator(busy_once, name="get_response", sleep=lambda s: None)
    assert gen.complete(["q"], Sampling()) == [[generators._completion("an answer", "stop")]]
    assert "sage-jax: waiting 1 s: get_response raised ValueError: busy; retry 1 of 5\n" in capsys.readouterr().err


def test_sage_jax_score_stops_on_a_get_response_that_hangs(tmp_path, embedder):
    import sage_jax

    release = threading.Event()

    def get_response(question):
        release.wait(30)
        return "too late"

    started = time.monotonic()
    try:
        with pytest.raises(StageError, match="get_response: the function gave no answer within timeout_s 0.5 s"):
            sage_jax.score([QUESTION], get_response, use_rots=False, paraphrases={QUESTION: PARAPHRASES},
                           embedder=embedder, timeout_s=0.5, out=tmp_path / "run")
    finally:
        release.set()
    assert time.monotonic() - started < 10


def test_what_sage_jax_score_cannot_call_is_refused_at_once(tmp_path):
    import sage_jax

    started = time.monotonic()
    with pytest.raises(TypeError, match=r"^get_response: must be a function of one str that returns a str, "
                                        r"got str$"):
        sage_jax.score([QUESTION], "gpt-3.5-turbo", out=tmp_path / "a")
    with pytest.raises(TypeError, match=r"^get_response: must be a function of one str that returns a str, "
                                        r"got int$"):  # was called, and retried with backoff for 32 s
        sage_jax.score([QUESTION], 42, use_rots=False, paraphrases={QUESTION: PARAPHRASES}, out=tmp_path / "a")
    with pytest.raises(TypeError, match=r"^rot_writer: must be a causal LM folder or a function of the prompt, "
                                        r"got int$"):
        sage_jax.score([QUESTION], len, paraphrases={QUESTION: PARAPHRASES}, rot_writer=5, out=tmp_path / "b")
    for bad in (0, -1.0, float("nan"), float("inf"), "60", True):
        with pytest.raises(ValueError, match=r"^timeout_s: must be a number of seconds in \(0, 86400\]"):
            sage_jax.score([QUESTION], len, use_rots=False, paraphrases={QUESTION: PARAPHRASES}, timeout_s=bad,
                           out=tmp_path / "c")
    assert time.monotonic() - started < 2  # not retried with backoff
    assert not (tmp_path / "a").exists()
