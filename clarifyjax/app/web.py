"""`clarifyjax web MODELS.yaml --host 127.0.0.1 --port N`: ClarifyDelphi as a web page.

The page (app/web_static/, nothing served from outside) runs the flow of `clarifyjax.app.clarifier`
through a JSON API, one endpoint per step (`ClarifyApp` lists them and their errors). The plumbing
(body limits, batching, the Host / Origin / Content-Type checks) is `clarifyjax.serve.http_server`'s."""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any
import contextlib

import jax

from clarifyjax.app.options import add_models_options, load_clarifier, load_models
from clarifyjax.core.commands import subcommand
from clarifyjax.serve.http_server import (
    ApiError, MicroBatcher, add_listen_options, check_keys, error_response, read_json_object, serve_forever,
)
from clarifyjax.app.clarifier import Session, SessionError, checked_text, run_steps
from clarifyjax.text.formats import TextFormatError

STATIC = Path(__file__).resolve().parent / "web_static"
MAX_BODY_BYTES = 64 * 1024
MAX_SITUATION_CHARS = 2000
MAX_ANSWER_CHARS = 1000
MAX_SESSIONS = 10000  # the oldest are forgotten beyond this


class ClarifyApp:
    """The sessions and the steps of the page's API, around one `clarify.Clarifier`: the steps
    of sessions that arrive together run as one `Clarifier.step` (`serving.MicroBatcher`, one
    row per session, in a worker thread, so the server keeps answering).

        POST /api/sessions                  {"situation": "..."}  -> 201 the session (turn 0 judged,
                                                                      the first question asked)
        GET  /api/sessions/{id}                                   -> the session
        POST /api/sessions/{id}/answer      {"answer": "..."}     -> the session, one turn more
        POST /api/sessions/{id}/skip        {} (or no body)       -> one turn more, the situation kept
        POST /api/sessions/{id}/another     {} (or no body)       -> another question for this turn

    A session is {"id", "situation", "max_turns", "done", "turns": [{"situation", "probabilities"
    [bad, ok, good], "judgment", "question", "answer", "fused", "skipped", "questions_asked"}]},
    kept in memory by a random id. Bad input is `http_server`'s error body, ``{"error": {"message",
    "type", "param", "code"}}``, with a 4xx status, never a stack trace: malformed JSON, a
    non-object, an unknown or missing field (400), an unknown session (404), a session that is busy
    or over (409), a body over `MAX_BODY_BYTES` (413), a text that is not a string, empty,
    invisible, too long or unencodable (422: the rule `ask` and `interact` follow)."""

    def __init__(self, clarifier, *, seed: int = 0, window_s: float = 0.01, max_batch: int = 32,
                 max_queued: int = 1024, max_sessions: int = MAX_SESSIONS):
        self.clarifier, self.max_sessions = clarifier, max_sessions
        self.sessions: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._key, self._batches = jax.random.key(seed), 0
        self.batcher = MicroBatcher(self._run_batch, window_s=window_s, max_batch_rows=max_batch,
                                    max_queued_rows=max_queued)

    def _run_batch(self, sessions: list) -> list:
        """In the batcher's one worker thread: one `Clarifier.step` for all `sessions`."""
        key, self._batches = jax.random.fold_in(self._key, self._batches), self._batches + 1
        try:
            run_steps(self.clarifier, sessions, key)
            return [None] * len(sessions)
        except TextFormatError:  # one session's text: the others must not fail with it
            pass
        except Exception:
            for s in sessions:
                s.fail()
            raise
        results = []
        for i, session in enumerate(sessions):
            try:
                run_steps(self.clarifier, [session], jax.random.fold_in(key, i))
                results.append(None)
            except TextFormatError as e:
                session.fail()
                results.append(ApiError(422, str(e)))
        return results

    def session(self, session_id: str):
        session = self.sessions.get(session_id)
        if session is None:
            raise ApiError(404, f"no session {session_id!r} (unknown, or forgotten: start again)",
                           code="unknown_session")
        return session

    async def start(self, situation: str):
        session = Session.start(situation)
        self.sessions[session.id] = session
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)
        try:
            await self.batcher.submit(session)
        except BaseException:  # a session that never started is not kept
            self.sessions.pop(session.id, None)
            raise
        return session

    async def act(self, session_id: str, action: str, answer: str | None = None):
        session = self.session(session_id)
        try:
            if action == "answer":
                session.answer(answer)
            elif action == "skip":
                session.skip()
            else:
                session.another_question()
        except SessionError as e:
            raise ApiError(409, str(e), code="session_state") from None
        await self.batcher.submit(session)
        return session


def _text_field(body: dict, name: str, limit: int) -> str:
    """`body[name]`: a text by the rule `ask` and `interact` follow (`clarifier.checked_text`:
    a string, not empty or invisible, no NUL), of at most `limit` characters (ApiError 422
    otherwise, naming the field)."""
    check_keys(body, (name,), (name,))
    try:
        text = checked_text(body[name], f"field {name!r}")
    except SessionError as e:
        raise ApiError(422, str(e), param=name) from None
    if len(text) > limit:
        raise ApiError(422, f"field {name!r} has {len(text)} characters; at most {limit}",
                       param=name)
    return text


def build_app(clarifier, *, seed: int = 0, window_s: float = 0.01, max_batch: int = 32):
    """The Starlette application of the page and its API (`app.state.clarify`: the
    `ClarifyApp`)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles


    state = ClarifyApp(clarifier, seed=seed, window_s=window_s, max_batch=max_batch)

    def guarded(handler, status: int = 200):
        async def endpoint(request):
            try:
                return JSONResponse((await handler(request)).to_dict(), status_code=status)
            except ApiError as e:
                return error_response(e)
            except Exception as e:  # logged here; the client gets no trace
                print(f"clarifyjax web: {request.method} {request.url.path}: "
                      f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
                return error_response(ApiError(500, "the server failed on this request (see "
                                                    "its log)"))
        return endpoint

    async def index(request):
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def create(request):
        body = await read_json_object(request, max_bytes=MAX_BODY_BYTES)
        return await state.start(_text_field(body, "situation", MAX_SITUATION_CHARS))

    async def show(request):
        return state.session(request.path_params["id"])

    def act(action: str):  # answer {"answer"}; skip and another: {} or no body, no field
        async def handler(request):
            state.session(request.path_params["id"])  # 404 before reading the body
            body = await read_json_object(request, max_bytes=MAX_BODY_BYTES,
                                          empty_ok=action != "answer")
            text = _text_field(body, "answer", MAX_ANSWER_CHARS) if action == "answer" else None
            check_keys(body, ("answer",) if action == "answer" else ())
            return await state.act(request.path_params["id"], action, text)
        return handler

    async def stats(request):
        return JSONResponse({"sessions": len(state.sessions),
                             "batches": len(state.batcher.batches),
                             "largest_batch": max(state.batcher.batches, default=0)})

    async def http_error(request, exc: HTTPException):
        return error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: "
                                                        f"{exc.detail}"))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        state.batcher.close()

    routes = [
        Route("/", index),
        Route("/api/sessions", guarded(create, 201), methods=["POST"]),
        Route("/api/sessions/{id}", guarded(show), methods=["GET"]),
        *(Route(f"/api/sessions/{{id}}/{action}", guarded(act(action)), methods=["POST"])
          for action in ("answer", "skip", "another")),
        Route("/api/stats", stats, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error})
    app.state.clarify = state
    return app


def _web_options(p: argparse.ArgumentParser) -> None:
    add_models_options(p)
    add_listen_options(p)


@subcommand("web", "ClarifyDelphi as a web page: a situation, its judgment as P(bad, ok, good) "
            "bars, the questions and your answers, three turns", _web_options)
def run_web(args: argparse.Namespace) -> int:
    cfg = load_models(args)
    clarifier = load_clarifier(args, cfg)
    app = build_app(clarifier, seed=args.seed, window_s=args.window_ms / 1000)
    serve_forever(app, args.host, args.port,
                  announce=lambda url: print(f"ClarifyDelphi at {url}/ (Ctrl-C stops)",
                                             flush=True),
                  allowed_hosts=args.allowed_host, allowed_origins=args.allow_origin)
    return 0

