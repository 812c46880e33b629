"""What the server tests share: a JSON request that returns (status, body) whatever the status,
the continuous batcher's steps held while requests gather, and a wait for a condition."""
from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request


def http_json(url: str, path: str, body: dict | bytes | None = None,
              timeout: float = 120) -> tuple[int, dict]:
    """(HTTP status, the JSON answer: a result or an error) of a POST of `body` to url + path (a
    dict sent as JSON, bytes as they are) or, with no body, of a GET."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url + path, data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@contextlib.contextmanager
def held_steps(batcher):
    """The batcher's decode steps wait while the block runs (released at its end, or after 60 s):
    requests queue, and none finishes, whatever the machine's load, until the test has checked
    what happens while they wait."""
    gate, step = threading.Event(), batcher.engine.step

    def held():
        gate.wait(60)
        return step()

    batcher.engine.step = held
    try:
        yield
    finally:
        gate.set()
        del batcher.engine.step  # the engine's own method again


def wait_until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)
