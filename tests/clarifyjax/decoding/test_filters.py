"""Tiny temperatures (issue 26, item 4): any temperature > 0 is safe. Sampling scales the logits
after subtracting each row's largest (`sampling.scale_by_temperature`), so down to the smallest
positive float (5e-324) and float32's subnormals the distribution is the argmax (ties shared),
never the id 0 that an overflow to NaN gave, and every log-prob is finite. Checked on the filter
itself, on `decoding.generate` (T5), and on a tiny Llama through `clarifyjax generate --logprobs`
(in this process) and the OpenAI-compatible server (`clarifyjax serve`'s app)."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clarifyjax.decoding import filter_logits, generate, sample_categorical
from clarifyjax.decoding.sampling import SMALLEST_TEMPERATURE, scale_by_temperature
from clarifyjax.models.t5 import T5Config
from helpers.t5_builders import FAMILIES, TINY, random_t5

# the smallest positive float, float32's smallest subnormal, subnormals, float32's smallest
# normal number and below/above it, and small normal ones
TINY_TEMPERATURES = [5e-324, 1e-320, 1.4e-45, 1e-40, 1.1e-38, SMALLEST_TEMPERATURE, 1e-30, 1e-12]


def _logits() -> np.ndarray:
    rng = np.random.RandomState(0)
    x = (rng.randn(5, 300) * 4).astype(np.float32)
    x[1, [7, 250]] = x[1].max() + 1.0          # two tied maxima: each gets half
    x[2, :100] = -np.inf                        # masked tokens (EOS before min_new_tokens)
    x[3] *= 1e4                                 # large logits: the old way overflowed sooner
    x[4] = np.float32(3.0)                      # a constant row: uniform at any temperature
    return x


def _check_argmax(log_probs: np.ndarray, maxima: np.ndarray, what) -> None:
    """Probability 1/ties on each largest logit, exactly 0 elsewhere, no NaN."""
    assert not np.isnan(log_probs).any(), what
    np.testing.assert_array_equal(np.exp(log_probs) > 0, maxima, err_msg=str(what))
    expected = -np.log(maxima.sum(-1, keepdims=True))
    np.testing.assert_allclose(np.where(maxima, log_probs, 0), np.where(maxima, expected, 0),
                               atol=1e-6, err_msg=str(what))


def test_tiny_temperatures_scale_to_the_argmax_and_only_it_is_drawn():
    x = _logits()
    maxima = x == x.max(-1, keepdims=True)
    for temperature in TINY_TEMPERATURES:
        scaled = scale_by_temperature(jnp.asarray(x), temperature)
        _check_argmax(np.asarray(jax.nn.log_softmax(scaled, -1)), maxima, temperature)
        draws = np.asarray(sample_categorical(jax.random.key(1), jnp.tile(scaled, (40, 1))))
        assert maxima[np.tile(np.arange(5), 40), draws].all(), temperature
        assert set(draws[1::5]) == {7, 250}  # both tied maxima are drawn


@pytest.mark.parametrize("temperature", [5e-324, 1e-40])
def test_top_k_and_top_p_at_tiny_temperatures(temperature):
    x = _logits()
    maxima = x == x.max(-1, keepdims=True)
    variants = ({}, {"top_k": 5}, {"top_p": 0.9}, {"top_k": 3, "top_p": 0.5})
    both = jax.jit(lambda v: [jax.nn.log_softmax(filter_logits(v, temperature=temperature, **kw))
                              for kw in variants])
    for kw, log_probs in zip(variants, both(jnp.asarray(x))):
        _check_argmax(np.asarray(log_probs), maxima, (temperature, kw))


def test_bfloat16_logits_and_huge_temperatures():
    x = _logits()
    got = scale_by_temperature(jnp.asarray(x, jnp.bfloat16), 1e-40)
    assert got.dtype == jnp.float32 and not np.isnan(np.asarray(got)).any()
    for temperature in (1e30, 1e300, float(np.finfo(np.float32).max)):  # T -> infinity: uniform
        lp = np.asarray(jax.nn.log_softmax(filter_logits(jnp.asarray(x), temperature=temperature)))
        finite = np.isfinite(x)
        np.testing.assert_allclose(lp[finite.all(-1)], -np.log(x.shape[1]), atol=1e-4)
        assert (np.isneginf(lp) == ~finite).all()
    # an ordinary temperature is unchanged by the shift: the reference's log-softmax of x / T
    ref = jax.nn.log_softmax(jnp.asarray(x[:3]) / 0.7, -1)
    np.testing.assert_allclose(np.asarray(jax.nn.log_softmax(filter_logits(
        jnp.asarray(x[:3]), temperature=0.7), -1)), np.asarray(ref), atol=2e-5)


@pytest.fixture(scope="module")
def t5_and_batch():
    model = random_t5(T5Config(**{**TINY, **FAMILIES["v1.1"]}), 5)
    rng = np.random.RandomState(5)
    ids = rng.randint(2, TINY["vocab_size"], (3, 9)).astype(np.int32)
    mask = (np.arange(9)[None] < np.array([[9], [4], [6]])).astype(np.int32)
    return model, jnp.asarray(ids * mask), jnp.asarray(mask)


def test_decoding_generate_at_tiny_temperatures_is_greedy(t5_and_batch):
    from clarifyjax.core import traces

    model, ids, mask = t5_and_batch
    greedy = generate(model, ids, mask, rng=None, max_new_tokens=8, min_new_tokens=8, greedy=True)
    before = traces.count("generate")
    for temperature in (5e-324, 1e-40, 1.4e-45):
        got = generate(model, ids, mask, rng=jax.random.key(3), max_new_tokens=8,
                       min_new_tokens=8, temperature=temperature)
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(greedy.tokens))
        assert len(set(np.asarray(got.tokens).ravel().tolist())) > 1  # not one repeated id
        np.testing.assert_array_equal(np.asarray(got.logprobs), 0.0)  # a point mass
    # below float32's smallest normal number every temperature is that one: one program
    assert traces.count("generate") == before + 1


# --------------------------------------------------------------------------- a tiny Llama

PROMPTS = ["My friend lied", "Is it ok to cheat", "Breaking a promise"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from helpers.tiny_models import tiny_llama_folder

    return tiny_llama_folder(tmp_path_factory, seed=3)


@pytest.mark.e2e
def test_generate_with_logprobs_at_tiny_temperatures_writes_the_greedy_text(llama, tmp_path,
                                                                            capsys):
    from clarifyjax import cli

    rows = [{"id": f"{t}-{i}", "prompt": p, "temperature": t}
            for t in (0, 1e-40, 5e-324) for i, p in enumerate(PROMPTS)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    status = cli.main(["generate", str(llama), "--input", str(prompts), "--out", str(out),
                       "--max-new-tokens", "6", "--min-new-tokens", "6", "--logprobs",
                       "--batch-size", "4", "--no-progress"])
    assert status == 0, capsys.readouterr().err
    got = {r["id"]: r["completions"][0] for r in map(json.loads, out.read_text().splitlines())}
    for i in range(len(PROMPTS)):
        greedy = got[f"0-{i}"]
        assert greedy["num_tokens"] == 6 and len(set(greedy["token_ids"])) > 1
        for t in (1e-40, 5e-324):
            tiny = got[f"{t}-{i}"]
            assert tiny["text"] == greedy["text"] and tiny["token_ids"] == greedy["token_ids"]
            assert tiny["logprobs"] == [0.0] * 6  # drawn with probability 1


def test_the_server_answers_a_tiny_temperature_with_the_greedy_text(llama):
    import urllib.request

    from clarifyjax.decoding.local_lm import LocalLM
    from clarifyjax.serve.http_server import BackgroundServer
    from clarifyjax.serve.openai_api import OpenAIServer

    def ask(url, temperature):
        body = json.dumps({"prompt": PROMPTS, "max_tokens": 6, "min_tokens": 6, "logprobs": 0,
                           "temperature": temperature}).encode()
        request = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
            return json.loads(response.read())["choices"]

    with BackgroundServer(OpenAIServer(LocalLM(llama, batch_size=4)).app) as server:
        greedy, tiny = ask(server.url, 0), ask(server.url, 1e-40)
    assert [c["text"] for c in tiny] == [c["text"] for c in greedy]
    assert all(c["text"] for c in tiny)  # min_tokens 6: never the empty text of id 0
    assert all(c["logprobs"]["token_logprobs"] == [0.0] * 6 for c in tiny)
