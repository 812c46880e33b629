"""The project's web plumbing (Starlette + uvicorn), free of model code, shared by every server:
`ApiError` / `error_response` (OpenAI-style error bodies), `read_json_object` (a body read up to a
size limit, 413 while it arrives), `MicroBatcher` (requests of a short window run as one batch by
one worker thread; bounded in rows, so overload is 503 at once; a request whose client left is
dropped) and `serve_forever` / `BackgroundServer` (uvicorn on 127.0.0.1 by default, port 0 a free
one, every request through `guard.RequestGuard`)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import socket
import sys
import threading
import time
from typing import Any
from collections.abc import Callable, Sequence
import argparse

from clarifyjax.serve.guard import RequestGuard, RequestPolicy, host_name, origin
from clarifyjax.core.ranges import number_type

DEFAULT_HOST = "127.0.0.1"  # a server is reachable from this machine only, unless asked


class ApiError(Exception):
    """A request the server refuses: HTTP `status` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def error_response(error: ApiError):
    from starlette.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status)


async def read_json_object(request, *, max_bytes: int, empty_ok: bool = False) -> dict:
    """The request's body as a JSON object; ApiError 413 past `max_bytes`, 400 when it is not
    one JSON object (no NaN, no repeated key); {} for an empty body when `empty_ok`. A client
    that closes the connection before its whole body arrived is one line in the server's log
    (no traceback) and ApiError 499, which nobody reads."""
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, f"request body of {declared} bytes is over this server's limit of "
                            f"{max_bytes} bytes", code="request_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise ApiError(413, f"request body is over this server's limit of {max_bytes} "
                                    "bytes", code="request_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        print(f"clarifyjax: {request.method} {request.url.path}: the client closed the "
              f"connection after {size} of {declared or 'its'} bytes of the body; request "
              "dropped", file=sys.stderr, flush=True)
        raise ApiError(499, "the client closed the connection", code="client_closed") from None
    if empty_ok and not b"".join(chunks).strip():
        return {}

    def no_repeats(pairs):
        keys = [k for k, _ in pairs]
        twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        if twice is not None:
            raise ApiError(400, f"key {twice!r} appears twice in one object", param=twice)
        return dict(pairs)

    def no_constant(name):
        raise ApiError(400, f"{name} is not valid JSON")

    try:
        body = json.loads(b"".join(chunks).decode("utf-8"), object_pairs_hook=no_repeats,
                          parse_constant=no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got "
                            f"{type(body).__name__}")
    return body


def check_keys(body: dict, allowed: Sequence[str], required: Sequence[str] = ()) -> None:
    """ApiError 400 naming the first unknown or missing key."""
    unknown = [k for k in body if k not in allowed]
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r}; this endpoint takes "
                            f"{sorted(allowed)}", param=unknown[0])
    missing = [k for k in required if k not in body]
    if missing:
        raise ApiError(400, f"missing required field {missing[0]!r}", param=missing[0])


# --------------------------------------------------------------------------- batching


@dataclasses.dataclass
class _Pending:
    item: Any
    rows: int
    future: asyncio.Future
    arrived: float
    cancelled: bool = False


class MicroBatcher:
    """Gathers items submitted within `window_s` of the first waiting one (up to
    `max_batch_rows` rows) and runs `run_batch(items) -> results` (one result, or an exception
    to raise, per item) in one worker thread; the next batch gathers while one runs.

    An item larger than `max_batch_rows` runs alone. `submit` raises ApiError 503 when the queue
    would hold more than `max_queued_rows` rows, and 413 for an item larger than that.
    Counters: `batches` (rows of each batch run, newest last).
    """

    row_length: int | None = None  # positions a row may take: no limit of its own (the model's)

    def __init__(self, run_batch: Callable[[list], list], *, window_s: float = 0.01,
                 max_batch_rows: int = 64, max_queued_rows: int = 1024):
        self.run_batch, self.window_s = run_batch, window_s
        self.max_batch_rows, self.max_queued_rows = max_batch_rows, max_queued_rows
        self.batches: list[int] = []
        self._queue: list[_Pending] = []
        self._queued_rows = 0
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="batch")

    async def submit(self, item, rows: int = 1):
        if rows > self.max_queued_rows:
            raise ApiError(413, f"the request needs {rows} rows (prompts x n); this server "
                                f"queues at most {self.max_queued_rows}", code="too_many_rows")
        if self._queued_rows + rows > self.max_queued_rows:
            raise ApiError(503, f"the server is busy ({self._queued_rows} rows queued); retry "
                                "later", code="overloaded")
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._work())
        pending = _Pending(item, rows, loop.create_future(), time.monotonic())
        self._queue.append(pending)
        self._queued_rows += rows
        self._wakeup.set()
        try:
            return await pending.future
        except asyncio.CancelledError:
            pending.cancelled = True  # dropped if its batch has not started
            raise

    def _take(self) -> list[_Pending]:
        batch, rows = [], 0
        while self._queue:
            head = self._queue[0]
            if head.cancelled:
                self._queue.pop(0)
                self._queued_rows -= head.rows
                continue
            if batch and rows + head.rows > self.max_batch_rows:
                break
            batch.append(self._queue.pop(0))
            self._queued_rows -= head.rows
            rows += head.rows
        return batch

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                deadline = self._queue[0].arrived + self.window_s
                while (sum(p.rows for p in self._queue) < self.max_batch_rows
                       and time.monotonic() < deadline):
                    await asyncio.sleep(min(0.002, max(0.0, deadline - time.monotonic())))
                batch = self._take()
                if not batch:
                    continue
                self.batches.append(sum(p.rows for p in batch))
                try:
                    results = await loop.run_in_executor(
                        self._executor, self.run_batch, [p.item for p in batch])
                except Exception as e:  # the whole batch failed: every request hears why
                    results = [e] * len(batch)
                for p, result in zip(batch, results):
                    if p.future.done():
                        continue
                    if isinstance(result, BaseException):
                        p.future.set_exception(result)
                    else:
                        p.future.set_result(result)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)


async def wait_unless_disconnected(request, awaitable, poll_s: float = 0.05):
    """Await `awaitable`; when the client disconnects first, cancel it (a `MicroBatcher` item
    not yet started is dropped) and raise ApiError 499."""
    task = asyncio.ensure_future(awaitable)
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll_s)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            raise ApiError(499, "the client closed the connection", code="client_closed")


# --------------------------------------------------------------------------- uvicorn


def bind(host: str = DEFAULT_HOST, port: int = 0) -> socket.socket:
    """A TCP socket bound to (host, port); port 0 takes a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def _uvicorn_server(app, sock: socket.socket, host: str, allowed_hosts: Sequence[str],
                    allowed_origins: Sequence[str]):
    """uvicorn serving `app` behind `guard.RequestGuard` (Host, Origin, Content-Type)."""
    import uvicorn


    policy = RequestPolicy.for_socket(sock, host, allowed_hosts=allowed_hosts,
                                      allowed_origins=allowed_origins)
    return uvicorn.Server(uvicorn.Config(RequestGuard(app, policy), log_level="warning",
                                         access_log=False, timeout_graceful_shutdown=5))


def serve_forever(app, host: str = DEFAULT_HOST, port: int = 0,
                  announce: Callable[[str], None] = print, *, allowed_hosts: Sequence[str] = (),
                  allowed_origins: Sequence[str] = ()) -> None:
    """Run `app` until SIGINT/SIGTERM; `announce(url)` once the server accepts connections.
    Requests pass `guard.RequestGuard` first: a Host of `host`'s address (or `allowed_hosts`),
    no other web page's Origin unless in `allowed_origins`, JSON POSTs."""
    sock = bind(host, port)
    server = _uvicorn_server(app, sock, host, allowed_hosts, allowed_origins)

    async def run():
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started:
            announce(url_of(sock))
        await serving

    asyncio.run(run())


class BackgroundServer:
    """`app` served by uvicorn in a thread of this process (tests, notebooks):

        with BackgroundServer(app) as server:
            requests.get(server.url + "/v1/models")
    """

    def __init__(self, app, host: str = DEFAULT_HOST, port: int = 0, *,
                 start_timeout_s: float = 30.0, allowed_hosts: Sequence[str] = (),
                 allowed_origins: Sequence[str] = ()):
        self.sock = bind(host, port)
        self.url = url_of(self.sock)
        self._server = _uvicorn_server(app, self.sock, host, allowed_hosts, allowed_origins)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self.sock]}, daemon=True)
        self._start_timeout_s = start_timeout_s

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server at {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.sock.close()

    def __exit__(self, *exc) -> None:
        self.stop()


def _checked(check: Callable[[str], str]) -> Callable[[str], str]:
    """An argparse type from a check that raises ValueError (argparse prints its message)."""
    def parse(value: str) -> str:
        try:
            return check(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = check.__name__
    return parse


def add_listen_options(p) -> None:
    """--host, --port, --allowed-host, --allow-origin and --window-ms of a server (an argparse
    parser): where it listens, which Host names and web page origins it answers
    (`guard.RequestGuard`), and how long a request waits for others to share its batch
    (`MicroBatcher`'s window)."""
    p.add_argument("--host", default=DEFAULT_HOST,
                   help="address to listen on (127.0.0.1: this machine only)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   type=_checked(host_name),
                   help="another name the Host header may give (repeat for more); the server "
                        "answers only its own address (and localhost on a loopback address), "
                        "which keeps DNS-rebinding pages out")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   type=_checked(origin),
                   help="a web page origin (scheme://host:port, or *) allowed to call this "
                        "server from a browser (CORS; repeat for more); none by default")
    p.add_argument("--port", type=number_type(int, "[0, 65535]"), default=8000,
                   help="0 = a free port (printed)")
    p.add_argument("--window-ms", type=number_type(float, "[0, 10000]"), default=10.0,
                   help="how long a request waits for others to share its batch")
