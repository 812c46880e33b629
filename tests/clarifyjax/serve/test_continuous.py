"""Continuous batching (`serve.continuous.ContinuousBatcher` over `decoding.slots.SlotEngine`)
behind the OpenAI-compatible server, in this process, on a tiny random Llama made here:

* 64 concurrent clients with mixed settings (greedy and sampled, n = 1 or 2, stop strings,
  top-k, top-p, min_tokens, prompts of one or two prefill chunks) each get exactly what the same
  request gets alone: greedy ones what `LocalLM.complete` (today's `generate`) gives, sampled
  ones (seeded) what the same request sent alone to the server gives;
* a request that joins a running batch changes nothing of the running request's answer;
* requests with sampling settings never seen before compile no program (traces counted);
* the window batcher's limits hold (413, 503 with OpenAI error bodies), and a client that goes
  away frees its rows and stalls nobody.

One module-scoped server; the slots read the whole (128-position) cache at every step, so that
the run compiles four programs (one decoding step, prefill chunks of 1 and 4 rows, the choice of
the next tokens).
"""
from __future__ import annotations

import concurrent.futures
import json
import socket
import time

import pytest

from clarifyjax.core import traces
from clarifyjax.decoding import slots
from clarifyjax.decoding.local_lm import LocalLM
from clarifyjax.serve.continuous import ContinuousBatcher, SlotSettings
from clarifyjax.serve.http_server import BackgroundServer
from clarifyjax.serve.openai_api import OpenAIServer, ServerLimits
from clarifyjax.text.generator import Sampling
from helpers.serving import held_steps, http_json, wait_until
from helpers.tiny_models import tiny_llama_folder

pytestmark = pytest.mark.reference

PROMPTS = ["My friend lied", "Is it ok to cheat on a test when nobody at all would ever know",
           "Helping a stranger", "Breaking a promise", "Lying to my boss about being sick today",
           "Skipping class", "Telling the truth even when it hurts someone I care about", "Late"]
SETTINGS = SlotSettings(slots=8, chunk=32, prefill_rows=4, min_span=128)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # shared_prefix 0: `complete` runs one prompt's rows as any others (no prefix program),
    # so that the requests alone compile a program per prompt length, not per prefix too
    lm = LocalLM(tiny_llama_folder(tmp_path_factory, seed=3), batch_size=8,
                 shared_prefix=0).load()
    assert [len(lm.encode(p)) > SETTINGS.chunk for p in PROMPTS].count(True) >= 2
    batcher = ContinuousBatcher(lm, SETTINGS, max_queued_rows=256)
    server = OpenAIServer(lm, name="tiny", batcher=batcher,
                          limits=ServerLimits(max_n=4, max_tokens=24, max_queued_rows=256))
    with BackgroundServer(server.app) as background:
        yield lm, batcher, background.url


def _answer(url: str, body: dict) -> list[tuple]:
    status, out = http_json(url, "/v1/completions", body)
    assert status == 200, out
    return [(c["text"], c["finish_reason"],
             tuple(c["logprobs"]["token_logprobs"]) if c["logprobs"] else ())
            for c in out["choices"]]


def _mixed_requests(lm: LocalLM) -> list[dict]:
    """64 requests: greedy (some with a stop string found in their own answer, some n = 2) and
    seeded samples (top-k, top-p, min_tokens, temperatures above and below 1, n = 1 or 2)."""
    plain = lm.complete(PROMPTS, Sampling(max_new_tokens=16, temperature=0))
    requests = []
    for i in range(64):
        prompt, kind = PROMPTS[i % len(PROMPTS)], i % 4
        body = {"prompt": prompt, "logprobs": 0}
        if kind == 0:
            body |= {"temperature": 0, "max_tokens": 3 + i % 14}
        elif kind == 1:  # a stop string of several tokens: the requests alone share a program
            text = plain[i % len(PROMPTS)][0].text
            stop = next(text[4:j] for j in range(6, len(text) + 2)
                        if lm.stop_token_ids((text[4:j],)) == lm.eos_ids)
            body |= {"temperature": 0, "max_tokens": 16, "n": 2, "stop": [stop]}
        elif kind == 2:
            body |= {"temperature": 0.7, "top_k": 5, "max_tokens": 12, "seed": i}
        else:
            body |= {"temperature": 1.3, "top_p": 0.9, "max_tokens": 10, "min_tokens": 3,
                     "n": 2, "seed": 1000 + i}
        requests.append(body)
    return requests


def _alone(lm: LocalLM, body: dict) -> list[tuple]:
    """A greedy request's answer from `LocalLM.complete` alone (today's `generate`)."""
    sampling = Sampling(max_new_tokens=body["max_tokens"], temperature=0,
                        stop=tuple(body.get("stop", ())))
    [row] = lm.complete([body["prompt"]], sampling, n=body.get("n", 1))
    return [(c.text, c.finish_reason, c.logprobs) for c in row]


def test_64_concurrent_clients_each_get_what_they_get_alone(served):
    lm, batcher, url = served
    requests = _mixed_requests(lm)
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda body: _answer(url, body), requests))
    assert max(batcher.batches[-64:]) == 2 and batcher.engine.joined_running > 0
    stopped = 0
    for body, got in zip(requests, answers):
        if body["temperature"] == 0:
            expected = _alone(lm, body)
            stopped += body.get("stop") is not None and got[0][1] == "stop"
        else:  # seeded: the same request alone to the same server
            expected = _answer(url, body)
            assert len(got[0][2]) >= body.get("min_tokens", 0)
        # the same texts and finish reasons; log-probs to float rounding (a prefill chunk of
        # four rows and one of one row round differently)
        assert [g[:2] for g in got] == [e[:2] for e in expected], body
        for g, e in zip(got, expected):
            assert g[2] == pytest.approx(e[2], abs=1e-5)
    assert stopped >= 4  # the stop strings did cut answers short


def test_a_request_joining_a_running_batch_changes_nothing(served):
    lm, batcher, url = served
    long = {"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0, "logprobs": 0}
    alone = _answer(url, long)
    joined = batcher.engine.joined_running
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = pool.submit(_answer, url, long)
        deadline = time.monotonic() + 60
        while batcher.engine.decoding == 0:  # the long one has its first token
            assert time.monotonic() < deadline and not running.done()
            time.sleep(0.001)
        others = [pool.submit(_answer, url, {"prompt": p, "max_tokens": 8, "temperature": 0.9,
                                             "seed": 5, "n": 2}) for p in PROMPTS[2:5]]
        assert running.result() == alone  # tokens, finish and log-probs, exactly
        assert all(len(o.result()) == 2 for o in others)
    assert batcher.engine.joined_running >= joined + 3


def test_new_sampling_settings_compile_nothing(served):
    lm, _, url = served
    _answer(url, {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})   # 1-row prefill
    _answer(url, {"prompt": PROMPTS[:4], "max_tokens": 4, "temperature": 0})  # 4 rows at once
    names = ("slots_decode", "slots_prefill", "slots_choose")
    programs = (slots.decode_program, slots.prefill_program, slots.choose_program)
    before = [traces.count(n) for n in names]
    sizes = [p._cache_size() for p in programs]
    assert min(before) >= 1
    new = [{"temperature": 0.31, "top_k": 7, "seed": 1},
           {"temperature": 1.7, "top_p": 0.42, "seed": 2, "n": 3},
           {"temperature": 0.05, "top_k": 250, "top_p": 0.5, "min_tokens": 4, "stop": ["q"]},
           {"temperature": 1e-30, "top_k": 1}, {"temperature": 2.0, "min_tokens": 6}]
    for i, settings in enumerate(new):
        _answer(url, {"prompt": PROMPTS[i], "max_tokens": 6, **settings})
        _answer(url, {"prompt": PROMPTS[4:], "max_tokens": 6, **settings})
    assert [traces.count(n) for n in names] == before
    assert [p._cache_size() for p in programs] == sizes


def test_limits_and_a_client_that_goes_away(served):
    lm, batcher, url = served
    batcher.max_queued_rows = 12
    try:
        status, body = http_json(url, "/v1/completions", {"prompt": PROMPTS[:4], "n": 4, "max_tokens": 4})
        assert status == 413 and body["error"]["code"] == "too_many_rows"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # 12 rows: 8 run, 4 wait
            with held_steps(batcher):
                big = pool.submit(_answer, url, {"prompt": PROMPTS[:3], "n": 4,
                                                 "max_tokens": 24, "temperature": 0})
                wait_until(lambda: batcher.engine.queued >= 4, "the 12 rows never queued")
                status, body = http_json(url, "/v1/completions", {"prompt": PROMPTS[:3], "n": 3, "max_tokens": 4})
                assert status == 503 and body["error"]["code"] == "overloaded"
            assert len(big.result()) == 12
    finally:
        batcher.max_queued_rows = 256
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps({"prompt": PROMPTS[6], "max_tokens": 24, "n": 4,
                          "temperature": 0}).encode()
    cancelled = batcher.cancelled_rows
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the slots busy: the next ones wait
        with held_steps(batcher):  # (and none finishes before its client is seen to be gone)
            busy = pool.submit(_answer, url, {"prompt": PROMPTS[:2], "n": 4, "max_tokens": 24,
                                              "temperature": 0})
            for _ in range(2):  # closed before the answer
                with socket.create_connection((host, int(port)), timeout=10) as sock:
                    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + url[7:].encode()
                                 + b"\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            wait_until(lambda: batcher.cancelled_rows >= cancelled + 8,
                       f"rows of closed connections not dropped: {batcher.cancelled_rows}")
        assert len(busy.result()) == 8
        wait_until(lambda: batcher.engine.idle, "the engine never went idle")
    assert batcher.cancelled_rows == cancelled + 8
    body = {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0}
    assert [a[:2] for a in _answer(url, body)] == [e[:2] for e in _alone(lm, body)]
