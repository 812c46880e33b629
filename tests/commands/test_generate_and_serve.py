"""`clarifyjax generate` and `clarifyjax serve` on a tiny random Llama made here, as commands.

* generate: killed with kill -9 in the middle of the file, then run again, it writes the same
  file as an uninterrupted run with the same seed (sampled and greedy rows, n = 2), every id
  once, in input order.
* serve: the real `openai` client on 127.0.0.1; greedy completions and chats equal what
  `generate` wrote; 32 concurrent clients each get their own answer; each malformed request gets
  an OpenAI-style 4xx; a client that disconnects stalls nobody. Every wait is bounded and the
  server is stopped by the fixture.

The commands share the run's JAX compilation cache: `LocalLM` pads every batch to --batch-size
rows, and every prompt here (the chat's included) has 19-24 tokens, one length bucket, so the
uninterrupted `generate` (run in this process: `cli.main`, what `python -m clarifyjax` calls)
compiles one greedy and one sampled program, and the killed and resumed runs (subprocesses)
load them (the server, a subprocess too, batches continuously and compiles its own).
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from helpers.env import REPO_ROOT, require
from helpers.serving import http_json
from helpers.compile_cache import inherited_xla_flags
from helpers.tiny_models import tiny_llama_folder

pytestmark = [pytest.mark.slow, pytest.mark.child, pytest.mark.reference]

PROMPTS = ["My friend lied to me about it", "Is it ok to cheat on a test",
           "Helping a stranger in the rain", "Breaking a promise to my sister",
           "Lying to my boss about being sick", "Skipping class to see a movie",
           "Telling the truth when it hurts", "Is lying ok to spare feelings",
           "I broke a vase and hid it", "Being late to a friend's wedding"]
CHAT = [{"role": "user", "content": "Lie?"}]
MAX_NEW = 12
COMMON = ["--batch-size", "8", "--chat-template", "model"]


def _env() -> dict:
    """A command's environment: one device, the run's compile flags and compilation cache."""
    env = dict(os.environ, XLA_FLAGS=inherited_xla_flags())
    env.update(PYTHONPATH=str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               HF_HUB_OFFLINE="1")
    return env


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    require("openai")
    folder = tiny_llama_folder(tmp_path_factory, seed=3)
    work = tmp_path_factory.mktemp("llm_cli")
    # 21 chunks of one row: the kill lands after the first, with 20 left to go
    rows = [{"id": f"r{i}", "prompt": p, **({"temperature": 0} if i % 2 == 0 else {})}
            for i, p in enumerate(PROMPTS + PROMPTS[::-1])]
    rows.append({"id": "chat", "messages": CHAT, "temperature": 0})
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder, work, prompts, rows, _env()


def _generate_command(setup, out) -> list[str]:
    folder, _, prompts, _, _ = setup
    return [sys.executable, "-m", "clarifyjax", "generate", str(folder), "--input", str(prompts),
            "--out", str(out), "--n", "2", "--seed", "11", "--max-new-tokens", str(MAX_NEW),
            "--temperature", "0.8", "--top-k", "20", "--chunk-rows", "1", "--logprobs",
            "--no-progress", *COMMON]


@pytest.fixture(scope="module")
def reference(setup):
    """An uninterrupted run of `generate`: {id: record}, and the file's bytes. It runs in this
    process (`cli.main` with the command's arguments), which saves an interpreter's start."""
    from clarifyjax import cli

    out = setup[1] / "reference.jsonl"
    command = _generate_command(setup, out)
    assert command[1:3] == ["-m", "clarifyjax"]
    assert cli.main(command[3:]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return {r["id"]: r for r in records}, out.read_bytes()


def test_generate_killed_with_kill_9_resumes_to_the_same_file(setup, reference):
    folder, work, _, rows, env = setup
    out = work / "killed.jsonl"
    partial = work / f".{out.name}.partial"
    proc = subprocess.Popen(_generate_command(setup, out), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not list(partial.glob("chunk-*.npz")):  # the first chunk is done: kill it now
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no chunk was written in 240 s"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    finished = len(list(partial.glob("chunk-*.npz")))
    assert not out.exists() and 1 <= finished < len(rows), finished  # killed mid-file

    again = subprocess.run(_generate_command(setup, out), env=env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed:" in again.stdout and not partial.exists()
    assert out.read_bytes() == reference[1]
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == [r["id"] for r in rows]
    # the seed was used: sampled rows differ between their two samples, greedy ones do not
    by_id = reference[0]
    assert all(len({c["text"] for c in by_id[r["id"]]["completions"]}) == 1
               for r in rows if r.get("temperature") == 0)
    assert any(len({tuple(c["token_ids"]) for c in by_id[r["id"]]["completions"]}) == 2
               for r in rows if "temperature" not in r)


@pytest.fixture(scope="module")
def server(setup, reference):
    """`clarifyjax serve` on 127.0.0.1, port 0; its base URL. Stopped at the end."""
    folder, work, _, _, env = setup
    proc = subprocess.Popen(
        [sys.executable, "-m", "clarifyjax", "serve", str(folder), "--port", "0", "--max-n", "4",
         "--max-tokens", "32", "--window-ms", "20", "--name", "tiny", *COMMON],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    announced = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("serving "):
                announced.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert announced.wait(240), "the server did not start:\n" + "".join(lines)[-3000:]
        url = lines[-1].split(" at ")[1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        yield url, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _client(url):
    import openai

    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)


def _greedy(client, prompt: str) -> str:
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_NEW,
                                     temperature=0).choices[0].text


def test_the_openai_client_gets_what_generate_wrote(server, setup, reference):
    url, _ = server
    records, _ = reference
    client = _client(url)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    greedy = [r for r in setup[3] if r.get("temperature") == 0 and "prompt" in r]
    out = client.completions.create(model="tiny", prompt=[r["prompt"] for r in greedy[:3]],
                                    max_tokens=MAX_NEW, temperature=0, n=2, logprobs=0)
    expected = [records[r["id"]]["completions"][0] for r in greedy[:3]]
    assert [c.text for c in out.choices] == [e["text"] for e in expected for _ in range(2)]
    assert out.choices[0].logprobs.token_logprobs == pytest.approx(
        expected[0]["logprobs"], abs=1e-5)
    chat = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=MAX_NEW,
                                          temperature=0)
    assert chat.choices[0].message.content == records["chat"]["completions"][0]["text"]
    assert chat.choices[0].finish_reason == records["chat"]["completions"][0]["finish_reason"]
    # sampling through the server: a seed repeats, n samples differ
    ask = dict(model="tiny", prompt=PROMPTS[1], max_tokens=MAX_NEW, temperature=0.8, n=3,
               seed=5, extra_body={"top_k": 20})
    first, second = (client.completions.create(**ask) for _ in range(2))
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert len({c.text for c in first.choices}) > 1


def test_32_concurrent_clients_each_get_their_own_answer(server, setup, reference):
    url, _ = server
    records, _ = reference
    greedy = [r for r in setup[3] if r.get("temperature") == 0 and "prompt" in r]
    client = _client(url)
    single = {r["prompt"]: _greedy(client, r["prompt"]) for r in greedy}  # one at a time
    asked = [greedy[i % len(greedy)]["prompt"] for i in range(32)]
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(_greedy, _client(url), p) for p in asked]
        answers = [f.result(timeout=120) for f in futures]
    elapsed = time.monotonic() - started
    assert answers == [single[p] for p in asked]
    assert [single[r["prompt"]] for r in greedy] == [
        records[r["id"]]["completions"][0]["text"] for r in greedy]
    assert elapsed < 120, elapsed


@pytest.mark.parametrize("body,param,code", [
    (b'{"model": "tiny", "prompt": "a",', None, None),                     # malformed JSON
    (b'{"model": "tiny", "prompt": "a", "best_friend": 1}', "best_friend", None),
    (b'{"model": "tiny", "prompt": "a", "n": 5}', "n", None),              # --max-n 4
    (b'{"model": "tiny", "prompt": "' + b"lie " * 200 + b'"}', "prompt",
     "context_length_exceeded"),                                            # 128 positions
])
def test_bad_requests_get_a_4xx_with_an_openai_error_body(server, body, param, code):
    url, _ = server
    status, answer = http_json(url, "/completions", body)
    assert status == 400 and answer["error"]["message"]
    assert answer["error"]["param"] == param and answer["error"]["code"] == code


def test_a_client_that_disconnects_mid_request_stalls_nobody(server, setup, reference):
    url, proc = server
    host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
    body = json.dumps({"model": "tiny", "prompt": PROMPTS[2], "max_tokens": MAX_NEW,
                       "temperature": 0}).encode()
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                         + body)
        # closed before the answer
    started = time.monotonic()
    prompt = setup[3][0]["prompt"]
    assert _greedy(_client(url), prompt) == reference[0]["r0"]["completions"][0]["text"]
    assert time.monotonic() - started < 60 and proc.poll() is None
