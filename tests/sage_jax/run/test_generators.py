"""What `sage-jax run` sends and samples, against its presets.

* A local OpenAI-style server on 127.0.0.1 that answers 400 to any request argument it does not
  know, as OpenAI's own API does ("Unrecognized request argument supplied"; its chat endpoint
  knows no top_k, its completions endpoint takes top_k here as vLLM's does), serves a whole run of
  sage_jax/presets/run_endpoint.yaml (completions for vicuna, chat for GPT, completions for the RoT
  writer), under `code` and under `ours`: every request is accepted, the chat target is sent what
  each preset says (under `code` exactly the reference's `model, messages, temperature=0.8`), its
  whole reply is kept, and config.yaml records what was sent.
* A tiny Llama folder whose generation_config.json has no `do_sample` (greedy by default) samples
  under `code` at temperature 1.0 and top-k 10, as the reference's `do_sample=True, top_k=10` did.
"""
from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from clarifyjax.config.loader import build_root, read_yaml
from helpers.env import REPO_ROOT, require, shared_data
from sage_jax.run.config import SageRunConfig, load_run_config
from sage_jax.run import prompts
from sage_jax.run.stages import read_jsonl

pytestmark = pytest.mark.reference

# OpenAI's documented request bodies (API reference: "Create chat completion", "Create completion").
CHAT_BODY = {"model", "messages", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
             "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "n",
             "parallel_tool_calls", "prediction", "presence_penalty", "reasoning_effort", "response_format", "seed",
             "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
             "top_logprobs", "top_p", "user", "web_search_options"}
COMPLETIONS_BODY = {"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
                    "max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix",
                    "temperature", "top_p", "user", "top_k"}  # top_k: vLLM's extension
WORDS = "always be kind honest fair never harm help others respect choices duty care".split()


def _words(text: str, k: int) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return " ".join(WORDS[b % len(WORDS)] for b in digest[:k])


def strict_openai_app():
    """(app, seen): /v1/completions and /v1/chat/completions that refuse unknown arguments with
    OpenAI's 400 and otherwise answer deterministically; `seen` holds (route, body) of every call."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen = []

    def refuse(body, known):
        unknown = sorted(set(body) - known)
        if not unknown:
            return None
        return JSONResponse({"error": {"message": f"Unrecognized request argument supplied: {unknown[0]}",
                                       "type": "invalid_request_error", "param": None, "code": None}}, 400)

    async def completions(request):
        body = await request.json()
        seen.append(("completions", body))
        bad = refuse(body, COMPLETIONS_BODY)
        if bad:
            return bad
        text = (f"Rule of Thumb: you should {_words(body['prompt'], 5)}.\nmore" if "# Rule of Thumb" in body["prompt"]
                else f"Answer: I would {_words(body['prompt'], 7)}.\nA second line.")
        return JSONResponse({"id": "c", "object": "text_completion", "created": 0, "model": body["model"],
                             "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]})

    async def chat(request):
        body = await request.json()
        seen.append(("chat", body))
        bad = refuse(body, CHAT_BODY)
        if bad:
            return bad
        text = f"One paragraph: {_words(body['messages'][-1]['content'], 8)}.\nIts second line."
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": text}}]})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/chat/completions", chat, methods=["POST"])]), seen


def test_the_strict_server_refuses_top_k_on_chat_as_openai_does():
    require("openai")
    from clarifyjax.serve.http_server import BackgroundServer
    from clarifyjax.text.generator import Sampling
    from sage_jax.run.generators import GenerationError, OpenAIGenerator

    app, _ = strict_openai_app()
    with BackgroundServer(app) as server:
        sloppy = OpenAIGenerator(base_url=server.url + "/v1", model="gpt", api="chat",
                                 accepts=("temperature", "top_k"), max_retries=3)
        with pytest.raises(GenerationError, match="BadRequestError 400 after 1 attempt: .*top_k"):
            sloppy.complete(["Q?"], Sampling(temperature=0.8, top_k=10), 1, seed=0)
        default = OpenAIGenerator(base_url=server.url + "/v1", model="gpt", api="chat")  # OpenAI's set
        [[reply]] = default.complete(["Q?"], Sampling(temperature=0.8, top_k=10, max_new_tokens=9), 1, seed=0)
    assert reply.text.startswith("One paragraph:")


@pytest.mark.e2e
@pytest.mark.parametrize("preset", ["code", "ours"])
def test_a_whole_run_endpoint_run_against_a_server_that_refuses_unknown_arguments(
        tmp_path, monkeypatch, capsys, embedder, preset):
    require("openai")
    from clarifyjax.serve.http_server import BackgroundServer
    from sage_jax import cli

    monkeypatch.setenv("SAGE_API_KEY", "unused")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    app, seen = strict_openai_app()
    with BackgroundServer(app) as server:
        raw = read_yaml(REPO_ROOT / "sage_jax" / "presets" / "run_endpoint.yaml")
        for g in [m["generator"] for m in raw["models"]] + [raw["rot"]["generator"]]:
            g["base_url"] = server.url + "/v1"
        raw.update(preset=preset, limit=3, quiet=True, out=str(tmp_path / "out"),
                   questions=str(shared_data("sage-mcc/q100_gpt-3.5-turbo_rot.csv")),
                   score={"embedder": embedder, "bertscore": False, "lexical": False})
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
        assert cli.main(["run", str(tmp_path / "run.yaml")]) == 0, capsys.readouterr().err
    assert len(seen) == 3 * 5 * 4  # 3 questions x 5 paraphrases x 2 models: an answer and a RoT, none refused
    chats = [body for route, body in seen if route == "chat"]
    sent = {"code": {"model", "messages", "temperature"},
            "ours": {"model", "messages", "temperature", "max_tokens", "seed"}}[preset]
    assert all(set(body) == sent and body["temperature"] == 0.8 for body in chats)
    system = {"code": prompts.ANSWER_CHAT_SYSTEM, "ours": prompts.ANSWER_CHAT_SYSTEM_HELPFUL}[preset]
    assert all(body["messages"][0] == {"role": "system", "content": system} for body in chats)
    completions = [body for route, body in seen if route == "completions"]
    assert all(body["top_k"] == 10 and body["temperature"] == 1.0 for body in completions)
    out = tmp_path / "out"
    gpt = read_jsonl(out / "stages" / "answer" / "gpt-3.5-turbo" / "p0of1" / "rows.jsonl")
    assert all(r["status"] == "ok" and r["answer"].endswith(".\nIts second line.") for r in gpt)  # the whole reply
    vicuna = read_jsonl(out / "stages" / "answer" / "vicuna-7b" / "p0of1" / "rows.jsonl")
    assert all(r["answer"].startswith("I would ") and "\n" not in r["answer"] for r in vicuna)  # the first line
    recorded = load_run_config(out / "config.yaml")  # loads back: the settings as run
    assert recorded.models[1].generator.accepts == {"code": ("temperature",),
                                                    "ours": ("max_tokens", "temperature", "seed")}[preset]
    assert recorded.models[0].sampling.top_k == 10 and recorded.rot.generator.model == "vicuna-13b-v1.3"
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary["preset"] == preset and summary["models"][1]["sage_answer"]["count"] == 3
    assert summary["stages"]["answer"]["gpt-3.5-turbo"]["generator"]["accepts"] == list(
        recorded.models[1].generator.accepts)


def test_a_tiny_llama_without_do_sample_samples_under_code(tmp_path, embedder):
    """generation_config.json without do_sample: the model's default is greedy, and both samples of
    a prompt agree; under `code` the run samples (temperature 1.0, top-k 10) and they differ."""
    require("torch")
    from clarifyjax.decoding.local_lm import LocalLM
    from clarifyjax.models.tiny import tiny_llama_folder
    from clarifyjax.text.generator import Sampling
    from sage_jax.run import pipeline

    folder = tiny_llama_folder(tmp_path, max_position_embeddings=512)
    assert "do_sample" not in json.loads((folder / "generation_config.json").read_text())
    prompt = prompts.answer_prompt("Is it ever right to lie to a friend?", False)
    greedy = LocalLM(folder, batch_size=4).complete([prompt], Sampling(max_new_tokens=8), 2, seed=0)[0]
    assert greedy[0].text == greedy[1].text  # the folder's own default
    local = {"kind": "local", "model": str(folder)}
    raw = {"questions": str(shared_data("sage-mcc/q100_gpt-3.5-turbo_rot.csv")), "out": str(tmp_path / "out"),
           "preset": "code", "limit": 1, "quiet": True, "paraphrase": {"source": "file"},
           "hosts": {"process_index": 0, "process_count": 1},
           "answer": {"samples": 2, "max_attempts": 1, "batch_size": 16, "sampling": {"max_new_tokens": 8}},
           "models": [{"name": "tiny", "generator": local}]}
    pipeline.Run(build_root(SageRunConfig, raw)).run(("paraphrase", "answer"))
    rows = read_jsonl(tmp_path / "out" / "stages" / "answer" / "tiny" / "p0of1" / "rows.jsonl")
    outputs = {}
    for r in rows:
        outputs.setdefault(r["paraphrase_index"], []).append(r["output"])
    assert len(outputs) == 5 and sum(a != b for a, b in outputs.values()) >= 3  # sampled, not greedy
    recorded = load_run_config(tmp_path / "out" / "config.yaml").models[0]
    s = recorded.sampling
    assert (s.temperature, s.top_k, s.top_p, s.max_new_tokens, recorded.generator.bos) == (1.0, 10, 1.0, 8, False)
