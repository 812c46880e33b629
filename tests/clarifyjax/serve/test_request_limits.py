"""Request isolation (issue 37): one request cannot poison the batch it would join.

On a tiny random Llama (128 positions) made here, behind both batchers (continuous, with slots of
64 positions, and the window batcher):

* every request field beyond its type's or the engine's limit (integers past int32 or the
  server's limits, stop strings with a NUL or a lone surrogate, a chat's min_tokens beyond the
  room left) is a JSON 400 of one line naming the field and its limit, before anything is queued;
* one out-of-range request sent among ordinary ones, all held until they gather, is refused
  alone: the others get what they get alone;
* a request that makes an engine step fail fails alone (JSON 500); the others of its step are run
  again and get what they get alone;
* a chat's default max_tokens fits the slot length; `serve` refuses --slots and --slot-length
  beyond their limits in one line naming the option.
"""
from __future__ import annotations

import concurrent.futures
import types

import pytest

from clarifyjax.cli import main
from clarifyjax.decoding.local_lm import LocalLM
from clarifyjax.decoding.slots import SlotRequest
from clarifyjax.serve import command
from clarifyjax.serve.continuous import ContinuousBatcher, SlotSettings, check_memory
from clarifyjax.serve.http_server import BackgroundServer
from clarifyjax.serve.openai_api import OpenAIServer, ServerLimits
from clarifyjax.text.generator import Sampling
from helpers.serving import held_steps, http_json, wait_until
from helpers.tiny_models import tiny_llama_folder

pytestmark = pytest.mark.reference

PROMPTS = ["My friend lied", "Helping a stranger", "Breaking a promise", "Skipping class"]
SLOTS = SlotSettings(slots=8, length=64, chunk=32, prefill_rows=4, min_span=64)
CHAT = [{"role": "user", "content": "Is it wrong to lie?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(lm, the continuous batcher, {"continuous": url, "window": url}, the model folder)."""
    folder = tiny_llama_folder(tmp_path_factory, seed=3)
    lm = LocalLM(folder, batch_size=8, shared_prefix=0).load()
    batcher = ContinuousBatcher(lm, SLOTS, max_queued_rows=64)
    limits = ServerLimits(max_n=4, max_tokens=200, max_queued_rows=64)
    continuous = OpenAIServer(lm, name="tiny", batcher=batcher, limits=limits)
    window = OpenAIServer(lm, name="tiny", limits=limits)
    with BackgroundServer(continuous.app) as c, BackgroundServer(window.app) as w:
        yield lm, batcher, {"continuous": c.url, "window": w.url}, folder


def _alone(lm: LocalLM, prompt: str, max_tokens: int) -> str:
    [[completion]] = lm.complete([prompt], Sampling(max_new_tokens=max_tokens, temperature=0))
    return completion.text


# (body, path, the field named, words of the message: the limit)
BAD = [
    ({"prompt": "hi", "top_k": 2 ** 31, "temperature": 1}, "", "top_k", "2147483647"),
    ({"prompt": "hi", "top_k": -2}, "", "top_k", "[-1, 2147483647]"),
    ({"prompt": "hi", "max_tokens": 2 ** 31}, "", "max_tokens", "[1, 200]"),
    ({"prompt": "hi", "min_tokens": 2 ** 63}, "", "min_tokens", "[0, 200]"),
    ({"prompt": "hi", "min_tokens": 20}, "", "min_tokens", "max_tokens (16, the default)"),
    ({"prompt": "hi", "n": 2 ** 32}, "", "n", "[1, 4]"),
    ({"prompt": "hi", "seed": 2 ** 64, "temperature": 1}, "", "seed", "18446744073709551615"),
    ({"prompt": "hi", "stop": "a\x00b"}, "", "stop", "NUL"),
    ({"prompt": "hi", "stop": ["ok", "\ud800"]}, "", "stop", "stop[1] cannot be encoded: a lone"),
    ({"prompt": "hi", "user": 5}, "", "user", "string"),
    ({"messages": CHAT, "min_tokens": 120}, "chat/", "min_tokens", "tokens left after the"),
    ({"messages": CHAT, "max_tokens": 2 ** 40}, "chat/", "max_tokens", "[1, 200]"),
]


@pytest.mark.parametrize("mode", ["continuous", "window"])
@pytest.mark.parametrize("body,path,field,limit", BAD)
def test_a_field_beyond_its_limit_is_one_json_400_naming_it(served, mode, body, path, field,
                                                             limit):
    lm, batcher, urls, _ = served
    before = list(batcher.batches)
    status, answer = http_json(urls[mode], f"/v1/{path}completions", body)
    assert status == 400, answer
    error = answer["error"]
    assert error["param"] == field and limit in error["message"], error
    assert "\n" not in error["message"] and "Traceback" not in error["message"]
    assert batcher.batches == before  # refused before it joined a batch


def _poisoned_batch(batcher, url: str, poison: dict) -> tuple[list, tuple]:
    """Four ordinary greedy requests and `poison`, sent together while the engine's steps are
    held, so that they join one batch -> (the ordinary answers, the poison's (status, body))."""
    ordinary = [{"prompt": p, "max_tokens": 12, "temperature": 0} for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        with held_steps(batcher):
            answers = [pool.submit(http_json, url, "/v1/completions", body) for body in ordinary]
            wait_until(lambda: batcher.engine.queued >= 4, "the ordinary requests never queued")
            bad = pool.submit(http_json, url, "/v1/completions", poison)
            wait_until(lambda: bad.done() or batcher.engine.queued >= 5, "the poison never came")
        return [a.result() for a in answers], bad.result()


def test_one_out_of_range_request_among_ordinary_ones_is_refused_alone(served):
    lm, batcher, urls, _ = served
    answers, (status, bad) = _poisoned_batch(
        batcher, urls["continuous"], {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 1,
                                      "top_k": 2 ** 31})
    assert status == 400 and bad["error"]["param"] == "top_k", bad
    for prompt, (code, answer) in zip(PROMPTS, answers):
        assert code == 200, answer
        assert answer["choices"][0]["text"] == _alone(lm, prompt, 12)


def test_a_request_that_fails_inside_the_engine_fails_alone(served):
    """The poison passes every check, then raises in the engine's step (its stop check, after
    its first token): it gets a JSON 500, the four others of its step their own answers."""
    lm, batcher, urls, _ = served
    made = batcher._request

    def request(row, job, seed) -> SlotRequest:
        r = made(row, job, seed)
        if job.item.prompts == ["POISON"]:
            def stop_text(tokens):
                raise RuntimeError("a stop check that fails")
            r.stop_text = stop_text
        return r

    rerun = batcher.engine.rerun
    batcher._request = request
    try:
        answers, (status, bad) = _poisoned_batch(
            batcher, urls["continuous"], {"prompt": "POISON", "max_tokens": 12})
    finally:
        del batcher._request
    assert status == 500 and "a stop check that fails" in bad["error"]["message"], bad
    assert batcher.engine.rerun == rerun + 5  # the failed step held all five
    for prompt, (code, answer) in zip(PROMPTS, answers):
        assert code == 200, answer
        assert answer["choices"][0]["text"] == _alone(lm, prompt, 12)
    assert http_json(urls["continuous"], "/v1/completions", {"prompt": "POISON", "max_tokens": 3})[0] == 200


def test_the_engine_refuses_settings_its_arrays_cannot_hold(served):
    _, batcher, _, _ = served
    for sampling, seed in ((Sampling(max_new_tokens=2, temperature=1, top_k=2 ** 31), 0),
                           (Sampling(max_new_tokens=2, temperature=1), 2 ** 32)):
        with pytest.raises(ValueError, match="settings a slot cannot hold"):
            batcher.engine.add(SlotRequest((1, 5, 6), sampling, seed))
    assert batcher.engine.queued == 0


def test_a_chats_default_max_tokens_fits_its_slot(served):
    lm, _, urls, _ = served
    status, answer = http_json(urls["continuous"], "/v1/chat/completions",
                               {"messages": CHAT, "temperature": 0})
    assert status == 200, answer
    assert answer["usage"]["total_tokens"] <= SLOTS.length
    status, models = http_json(urls["continuous"], "/v1/models")
    assert status == 200 and models["data"][0]["max_model_len"] == SLOTS.length
    status, answer = http_json(urls["continuous"], "/v1/completions", {"prompt": "hi", "max_tokens": 100})
    assert status == 400 and "slot length of 64" in answer["error"]["message"], answer


def test_serve_bounds_slots_and_slot_length(served, capsys, monkeypatch):
    *_, folder = served

    def serve_forever(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr(command, "serve_forever", serve_forever)
    for extra, option in ((["--slots", "4097"], "--slots"), (["--slots", "0"], "--slots"),
                          (["--slot-length", "129"], "--slot-length")):
        capsys.readouterr()
        assert main(["serve", str(folder), "--port", "0", *extra]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and option in err, err
    # a KV cache that no machine holds: 4096 slots of 2^20 positions of a 7B model
    seven_b = types.SimpleNamespace(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bfloat16")
    with pytest.raises(ValueError, match="lower --slots or --slot-length"):
        check_memory(seven_b, 4096, 2 ** 20)
    check_memory(seven_b, 1, 64)
