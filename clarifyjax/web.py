"""`clarifyjax web MODELS.yaml --host 127.0.0.1 --port N`: ClarifyDelphi as a web page.

The page (clarifyjax/web_static/: HTML, JS and CSS served by the project, nothing from outside)
runs the flow of `clarifyjax.clarify` through a JSON API, one endpoint per step:

    POST /api/sessions                  {"situation": "..."}  -> 201 the session (turn 0 judged,
                                                                  the first question asked)
    GET  /api/sessions/{id}                                   -> the session
    POST /api/sessions/{id}/answer      {"answer": "..."}     -> the session, one turn more
    POST /api/sessions/{id}/skip                              -> one turn more, the situation kept
    POST /api/sessions/{id}/another                           -> another question for this turn

A session is {"id", "situation", "max_turns", "done", "turns": [{"situation", "probabilities"
[bad, ok, good], "judgment", "question", "answer", "fused", "skipped", "questions_asked"}]}.
Sessions live in the server's memory by a random id (`clarify.Session`); the steps of the
sessions whose requests arrive together run as one batch (`StepBatcher`: one `Clarifier.step`
per model call, in a worker thread, so the server keeps answering). Bad input is a JSON
``{"error": "..."}`` with a 4xx status, never a stack trace: malformed JSON or a non-object
(400), an unknown session (404), a session that is busy or over (409), a body over
`MAX_BODY_BYTES` (413), an empty, too long or unencodable text (422). The server binds
127.0.0.1 unless told otherwise.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import json
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from clarifyjax.cli import add_models_options, load_clarifier, load_models, subcommand
from clarifyjax.ranges import number_type

STATIC = Path(__file__).resolve().parent / "web_static"
MAX_BODY_BYTES = 64 * 1024
MAX_SITUATION_CHARS = 2000
MAX_ANSWER_CHARS = 1000
MAX_SESSIONS = 10000  # the oldest are forgotten beyond this


class WebError(Exception):
    """An HTTP error answered as {"error": message} with `status`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class StepBatcher:
    """Gathers the pending steps of sessions that arrive within `window_s` of each other (up to
    `max_batch`) and runs them as one `run_batch(sessions)` call in a worker thread.

    `sizes` records each batch's size (tests and the /api/stats endpoint read it)."""

    def __init__(self, run_batch: Callable[[list], None], *, window_s: float = 0.01,
                 max_batch: int = 32):
        self.run_batch, self.window_s, self.max_batch = run_batch, window_s, max_batch
        self.sizes: list[int] = []
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clarify-step")

    async def submit(self, session) -> None:
        """Run `session`'s pending step (with others that arrive together); raises what the
        batch raised."""
        loop = asyncio.get_running_loop()
        if self._queue is None:
            self._queue = asyncio.Queue()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work())
        done = loop.create_future()
        await self._queue.put((session, done))
        await done

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(self.window_s)  # let the requests that arrive together join
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            self.sizes.append(len(batch))
            try:
                await loop.run_in_executor(self._pool, self.run_batch, [s for s, _ in batch])
            except Exception as e:  # each waiting request answers it
                for _, done in batch:
                    if not done.done():
                        done.set_exception(e)
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


class ClarifyApp:
    """The sessions and the steps of the page's API, around one `clarify.Clarifier`."""

    def __init__(self, clarifier, *, seed: int = 0, window_s: float = 0.01, max_batch: int = 32,
                 max_sessions: int = MAX_SESSIONS):
        import jax

        self.clarifier, self.max_sessions = clarifier, max_sessions
        self.sessions: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._key, self._batches = jax.random.key(seed), 0
        self._lock = threading.Lock()
        self.batcher = StepBatcher(self._run_batch, window_s=window_s, max_batch=max_batch)

    def _run_batch(self, sessions: list) -> None:
        import jax

        from clarifyjax.clarify import run_steps

        with self._lock:
            key, self._batches = jax.random.fold_in(self._key, self._batches), self._batches + 1
        try:
            run_steps(self.clarifier, sessions, key)
        except Exception:
            for s in sessions:
                s.fail()
            raise

    def session(self, session_id: str):
        session = self.sessions.get(session_id)
        if session is None:
            raise WebError(404, f"no session {session_id!r} (unknown, or forgotten: start again)")
        return session

    async def start(self, situation: str):
        from clarifyjax.clarify import Session

        session = Session.start(situation)
        self.sessions[session.id] = session
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)
        await self._step(session)
        return session

    async def act(self, session_id: str, action: str, answer: str | None = None):
        from clarifyjax.clarify import SessionError

        session = self.session(session_id)
        try:
            if action == "answer":
                session.answer(answer)
            elif action == "skip":
                session.skip()
            else:
                session.another_question()
        except SessionError as e:
            raise WebError(409, str(e)) from None
        await self._step(session)
        return session

    async def _step(self, session) -> None:
        from clarifyjax.text import TextFormatError

        try:
            await self.batcher.submit(session)
        except TextFormatError as e:
            raise WebError(422, str(e)) from None


def _text_field(body: dict, name: str, limit: int) -> str:
    from clarifyjax.tokenizer import TextEncodingError, check_encodable

    if name not in body:
        raise WebError(422, f"field {name!r} is missing")
    value = body[name]
    if not isinstance(value, str):
        raise WebError(422, f"field {name!r} must be a string, got {type(value).__name__}")
    text = " ".join(value.split())
    if not text:
        raise WebError(422, f"field {name!r} is empty")
    if len(text) > limit:
        raise WebError(422, f"field {name!r} has {len(text)} characters; at most {limit}")
    try:
        check_encodable([text])
    except TextEncodingError as e:
        raise WebError(422, f"field {name!r}: {e.reason}") from None
    return text


async def _json_body(request, *, required: bool = True) -> dict:
    """The request's JSON object, read up to MAX_BODY_BYTES."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise WebError(413, f"the request body has {length} bytes; at most {MAX_BODY_BYTES}")
    data = b""
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY_BYTES:
            raise WebError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    if not data.strip():
        if required:
            raise WebError(400, "the request body is empty; send a JSON object")
        return {}
    try:
        body = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise WebError(400, "the request body is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise WebError(400, f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}"
                       ) from None
    if not isinstance(body, dict):
        raise WebError(400, f"the request body must be a JSON object, got "
                       f"{type(body).__name__}")
    return body


def build_app(clarifier, *, seed: int = 0, window_s: float = 0.01, max_batch: int = 32):
    """The Starlette application of the page and its API (`app.state.clarify`: the `ClarifyApp`)."""
    import contextlib

    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    state = ClarifyApp(clarifier, seed=seed, window_s=window_s, max_batch=max_batch)

    async def index(request):
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def create(request):
        body = await _json_body(request)
        situation = _text_field(body, "situation", MAX_SITUATION_CHARS)
        session = await state.start(situation)
        return JSONResponse(session.to_dict(), status_code=201)

    async def show(request):
        return JSONResponse(state.session(request.path_params["id"]).to_dict())

    def action(name: str):
        async def endpoint(request):
            state.session(request.path_params["id"])  # 404 before reading the body
            body = await _json_body(request, required=name == "answer")
            answer = _text_field(body, "answer", MAX_ANSWER_CHARS) if name == "answer" else None
            session = await state.act(request.path_params["id"], name, answer)
            return JSONResponse(session.to_dict())
        return endpoint

    async def stats(request):
        sizes = state.batcher.sizes
        return JSONResponse({"sessions": len(state.sessions), "batches": len(sizes),
                             "largest_batch": max(sizes, default=0)})

    async def web_error(request, exc: WebError):
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    async def http_error(request, exc: HTTPException):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    async def server_error(request, exc: Exception):
        print(f"clarifyjax web: {request.method} {request.url.path}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return JSONResponse({"error": "the server failed on this request (see its log)"},
                            status_code=500)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        state.batcher.close()

    routes = [
        Route("/", index),
        Route("/api/sessions", create, methods=["POST"]),
        Route("/api/sessions/{id}", show, methods=["GET"]),
        Route("/api/sessions/{id}/answer", action("answer"), methods=["POST"]),
        Route("/api/sessions/{id}/skip", action("skip"), methods=["POST"]),
        Route("/api/sessions/{id}/another", action("another"), methods=["POST"]),
        Route("/api/stats", stats, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        WebError: web_error, HTTPException: http_error, Exception: server_error})
    app.state.clarify = state
    return app


class ServerThread:
    """uvicorn serving `app` in a thread (tests, the README's screenshot): port 0 picks a free
    port; `url` once started; `stop()` shuts it down."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout_s: float = 30.0) -> str:
        import time

        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the web server did not start")
            time.sleep(0.02)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


def _web_options(p: argparse.ArgumentParser) -> None:
    add_models_options(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (127.0.0.1: this machine only)")
    p.add_argument("--port", type=number_type(int, "[0, 65535]"), default=8000,
                   help="0: any free port")
    p.add_argument("--batch-window-ms", type=number_type(float, "[0, 1000]"), default=10.0,
                   help="how long a step waits for others to join its batch")


@subcommand("web", "ClarifyDelphi as a web page: a situation, its judgment as P(bad, ok, good) "
            "bars, the questions and your answers, three turns", _web_options)
def run_web(args: argparse.Namespace) -> int:
    import uvicorn

    cfg = load_models(args)
    clarifier = load_clarifier(args, cfg)
    app = build_app(clarifier, seed=args.seed, window_s=args.batch_window_ms / 1000)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    server = uvicorn.Server(config)
    print(f"ClarifyDelphi: http://{args.host}:{args.port}/ (Ctrl-C stops)", flush=True)
    server.run()
    return 0

