"""The local servers answer only their own pages (issue 26, item 9): `clarifyjax web`'s app (on
a fake clarifier: the guard runs before any model) behind `serve.guard.RequestGuard`, tried with
raw HTTP (any Host, Origin or Content-Type, as another site's page or a DNS-rebinding page sends
them), with allowed names and origins (CORS), with a client that closes mid-body, and from a page
of another site in a real headless Chromium. `clarifyjax serve`'s app: test_openai_api.py."""
from __future__ import annotations

import json

import pytest

from clarifyjax.serve.http_server import BackgroundServer
from helpers.browser import chromium_driver
from helpers.clarify_models import FakeClarifier
from helpers.serving import http_json


@pytest.fixture(scope="module")
def server():
    from clarifyjax.app import web

    app = web.build_app(FakeClarifier())
    with BackgroundServer(app) as running:
        yield running.url, app.state.clarify


def raw_request(url: str, method: str, path: str, headers: dict, body: bytes = b""):
    """(status, lowercase headers, body) of one request written by hand: any Host, Origin or
    Content-Type, as a browser on another site or a DNS-rebinding page would send it."""
    import http.client

    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for key, value in headers.items():
            connection.putheader(key, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_only_its_own_host_and_origin_and_json_bodies_are_answered(server):
    """Raw HTTP: a Host that is not the server's (DNS rebinding) is 400, another site's Origin
    403 (its preflight too), a POST that is not application/json 415; none of them starts a
    session. localhost, the server's own origin and JSON with a charset are answered."""
    url, state = server
    own = url.removeprefix("http://")
    port = own.rsplit(":", 1)[1]
    situation = json.dumps({"situation": "a page elsewhere started this"}).encode()
    json_type = {"Content-Type": "application/json"}
    refused = [  # (method, path, headers, status, code)
        ("GET", "/api/stats", {"Host": "evil.example"}, 400, "host_not_allowed"),
        ("GET", "/", {"Host": f"evil.example:{port}"}, 400, "host_not_allowed"),
        ("GET", "/api/stats", {"Host": f"127.0.0.1.nip.io:{port}"}, 400, "host_not_allowed"),
        ("GET", "/api/stats", {"Host": f"[::1]:{port}"}, 400, "host_not_allowed"),
        ("POST", "/api/sessions", {"Host": "rebind.attacker.test", **json_type}, 400,
         "host_not_allowed"),
        ("POST", "/api/sessions", {"Host": own, "Origin": "http://evil.example", **json_type},
         403, "origin_not_allowed"),
        ("POST", "/api/sessions", {"Host": own, "Origin": "http://127.0.0.1:1", **json_type},
         403, "origin_not_allowed"),  # the same name on another port is another origin
        ("POST", "/api/sessions", {"Host": own, "Origin": "null", **json_type}, 403,
         "origin_not_allowed"),  # a sandboxed frame or a file:// page
        ("GET", "/api/stats", {"Host": own, "Origin": "https://evil.example"}, 403,
         "origin_not_allowed"),
        ("OPTIONS", "/api/sessions", {"Host": own, "Origin": "http://evil.example",
                                      "Access-Control-Request-Method": "POST"}, 403,
         "origin_not_allowed"),
        ("POST", "/api/sessions", {"Host": own, "Content-Type": "text/plain"}, 415,
         "unsupported_media_type"),
        ("POST", "/api/sessions", {"Host": own, "Content-Type":
                                   "application/x-www-form-urlencoded"}, 415,
         "unsupported_media_type"),
        ("POST", "/api/sessions", {"Host": own, "Content-Type": "multipart/form-data; b=x"}, 415,
         "unsupported_media_type"),
        ("POST", "/api/sessions", {"Host": own}, 415, "unsupported_media_type"),
        ("POST", "/api/sessions", {"Host": own, "Content-Type": "application/jsonx"}, 415,
         "unsupported_media_type"),
    ]
    before = len(state.sessions)
    for method, path, headers, status, code in refused:
        got, answer_headers, body = raw_request(url, method, path, headers,
                                                situation if method == "POST" else b"")
        error = json.loads(body)["error"]
        assert (got, error["code"]) == (status, code), (method, path, headers, body)
        assert "access-control-allow-origin" not in answer_headers
    assert len(state.sessions) == before  # nothing was started
    for headers in ({"Host": f"localhost:{port}", **json_type},
                    {"Host": own, "Origin": url, **json_type},
                    {"Host": own, "Content-Type": "Application/JSON; charset=utf-8"}):
        got, answer_headers, body = raw_request(url, "POST", "/api/sessions", headers, situation)
        assert got == 201, (headers, body)
        assert "access-control-allow-origin" not in answer_headers  # same origin: no CORS
    assert len(state.sessions) == before + 3
    assert raw_request(url, "GET", "/", {"Host": f"LOCALHOST:{port}"})[0] == 200


def test_allowed_names_and_origins_are_answered_with_cors():
    from clarifyjax.app import web

    with BackgroundServer(web.build_app(FakeClarifier()), allowed_hosts=["clarify.lan"],
                          allowed_origins=["http://tools.lan:3000"]) as running:
        url = running.url
        own = url.removeprefix("http://")
        body = json.dumps({"situation": "from the tools page"}).encode()
        status, headers, _ = raw_request(url, "OPTIONS", "/api/sessions", {
            "Host": own, "Origin": "http://tools.lan:3000",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        assert status == 204 and headers["access-control-allow-origin"] == "http://tools.lan:3000"
        assert "POST" in headers["access-control-allow-methods"]
        assert "Content-Type" in headers["access-control-allow-headers"]
        status, headers, answer = raw_request(url, "POST", "/api/sessions", {
            "Host": "clarify.lan:80", "Origin": "http://tools.lan:3000",
            "Content-Type": "application/json"}, body)
        assert status == 201 and headers["access-control-allow-origin"] == "http://tools.lan:3000"
        assert json.loads(answer)["situation"] == "from the tools page"
        assert raw_request(url, "POST", "/api/sessions", {
            "Host": own, "Origin": "http://tools.lan:3001",
            "Content-Type": "application/json"}, body)[0] == 403


def test_a_client_that_closes_mid_body_is_one_line_in_the_log(server, capfd):
    import socket
    import time

    url, state = server
    host, port = url.removeprefix("http://").rsplit(":", 1)
    before = len(state.sessions)
    capfd.readouterr()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST /api/sessions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: "
                     "application/json\r\nContent-Length: 5000\r\n\r\n".encode()
                     + b'{"situation": "cut sh')
    deadline = time.monotonic() + 30
    err = ""
    while "closed the connection" not in err and time.monotonic() < deadline:
        time.sleep(0.05)
        err += capfd.readouterr().err
    assert "Traceback" not in err and "ClientDisconnect" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "POST /api/sessions" in lines[0] and "21 of 5000" in lines[0]
    assert len(state.sessions) == before
    assert http_json(url, "/api/stats")[0] == 200  # and the server goes on


EVIL_PAGE = """<!doctype html><title>another site</title><p>nothing to see</p>"""
# Run in the other site's page: what it can do to the ClarifyDelphi server at arguments[0].
ATTACK = """
const target = arguments[0], friendly = arguments[1], done = arguments[arguments.length - 1];
const out = {};
async function attempt(name, run) {
  try { out[name] = await run(); } catch (e) { out[name] = "blocked: " + e.name; }
}
(async () => {
  await attempt("json", async () => (await fetch(target + "/api/sessions", {method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({situation: "csrf with json"})})).status);
  await attempt("plain", async () => (await fetch(target + "/api/sessions", {method: "POST",
      mode: "no-cors", headers: {"Content-Type": "text/plain"},
      body: JSON.stringify({situation: "csrf as text"})})).type);
  await attempt("read", async () => (await fetch(target + "/api/stats")).status);
  await attempt("allowed", async () => {
    const r = await fetch(friendly + "/api/sessions", {method: "POST",
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify({situation: "allowed page"})});
    return r.status + " " + (await r.json()).situation;
  });
  done(out);
})();
"""


@pytest.mark.child
def test_a_page_of_another_site_cannot_drive_the_server_in_a_real_browser(server, tmp_path):
    """Chromium opens a page of another site (http://evil.test, resolved to this machine by
    --host-resolver-rules): its JSON POST is stopped at the preflight, its text/plain "simple"
    POST is sent but refused (no session starts), it cannot read the API, and the server's own
    page under that name (DNS rebinding) is refused; a server started with --allow-origin for
    that site answers it."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    from clarifyjax.app import web

    url, state = server
    evil_app = Starlette(routes=[Route("/", lambda request: HTMLResponse(EVIL_PAGE))])
    with BackgroundServer(evil_app, allowed_hosts=["evil.test"]) as evil:
        evil_origin = "http://evil.test:" + evil.url.rsplit(":", 1)[1]
        with BackgroundServer(web.build_app(FakeClarifier()),
                              allowed_origins=[evil_origin]) as friendly:
            driver = chromium_driver(tmp_path / "profile",
                                     ["--host-resolver-rules=MAP evil.test 127.0.0.1"])
            try:
                driver.set_script_timeout(60)
                driver.get(evil_origin + "/")
                assert "another site" in driver.title
                before = len(state.sessions)
                out = driver.execute_async_script(ATTACK, url, friendly.url)
                rebound = url.replace("127.0.0.1", "evil.test")
                driver.get(rebound + "/")
                rebound_page = driver.page_source
            finally:
                driver.quit()
    assert out["json"].startswith("blocked"), out    # the preflight was refused
    assert out["plain"] == "opaque", out             # sent, and refused by the server ...
    assert out["read"].startswith("blocked"), out    # nothing readable
    assert len(state.sessions) == before             # ... so no session started
    assert out["allowed"] == "201 allowed page", out  # --allow-origin: the page may call it
    assert "host_not_allowed" in rebound_page and "ClarifyDelphi" not in rebound_page


def test_the_names_a_server_answers_follow_the_address_it_is_bound_to():
    import socket

    from clarifyjax.serve.guard import RequestPolicy, host_name, origin
    from clarifyjax.serve.http_server import bind

    def policy(address, listen="", **kwargs):
        sock = bind(address, 0)
        try:
            return RequestPolicy.for_socket(sock, listen, **kwargs)
        finally:
            sock.close()

    loopback = policy("127.0.0.1")
    assert all(loopback.host_allowed(h) for h in ("127.0.0.1:8000", "localhost", "LOCALHOST.:1",
                                                  None))  # no Host: HTTP/1.0, not a browser
    assert not any(loopback.host_allowed(h) for h in (
        "127.0.0.1.nip.io", "[::1]:8000", "0.0.0.0", "", "evil.test", "localhost.evil.test",
        socket.gethostname() + ".invalid"))
    everywhere = policy("0.0.0.0")
    assert all(everywhere.host_allowed(h) for h in ("10.1.2.3:8", "[::1]:8", "localhost",
                                                    socket.gethostname()))
    assert not any(everywhere.host_allowed(h) for h in ("evil.test", "10.1.2.3.evil.test"))
    named = policy("127.0.0.1", "localhost", allowed_hosts=["Clarify.LAN."])
    assert named.host_allowed("clarify.lan:80") and not named.host_allowed("lan")
    assert named.cross_origin("http://127.0.0.1:5", "127.0.0.1:5") is False  # its own
    assert named.cross_origin("http://127.0.0.1:6", "127.0.0.1:5") is None   # another port
    assert policy("127.0.0.1", allowed_origins=["*"]).cross_origin("http://x.test", "a") is True
    for bad in ("http://x", "x/y", "", "a b"):
        with pytest.raises(ValueError, match="not a host name"):
            host_name(bad)
    for bad in ("http://a/b", "ftp://a", "a.test", "http://a?x", "null", ""):
        with pytest.raises(ValueError, match="not an origin"):
            origin(bad)
    assert origin("HTTP://Tools.LAN:3000/") == "http://tools.lan:3000" and origin("*") == "*"
