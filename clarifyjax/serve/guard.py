"""Which requests the project's local servers answer (`clarifyjax serve`, `clarifyjax web`): an ASGI
middleware (`RequestGuard`) in front of every app `http_server` serves, so that a web page open
elsewhere cannot drive them: its Host, Origin and Content-Type checks are listed above
`RequestPolicy`."""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import socket
from collections.abc import Iterable

_ORIGIN = re.compile(r"^https?://[^/\s?#@]+$", re.IGNORECASE)
_NAME = re.compile(r"^[A-Za-z0-9._:\[\]-]+$")
ANY = "*"


def _name_of(host: str) -> str:
    """The name part of a Host header value or a URL's authority, lowercased: "[::1]:80" ->
    "::1", "Example.COM.:8000" -> "example.com"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if _is_ip(host):  # "::1" is an address, not "::" and a port
        return host
    name, sep, port = host.rpartition(":")
    return (name if sep and port.isdigit() else host).rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def host_name(value: str) -> str:
    """An ``--allowed-host`` value, checked: a name or address without a scheme or a path."""
    if not value.strip() or not _NAME.match(value.strip()):
        raise ValueError(f"{value!r} is not a host name (give a name such as myhost.local, "
                         "without http:// or a path)")
    return _name_of(value)


def origin(value: str) -> str:
    """An ``--allow-origin`` value, checked: ``*`` or scheme://host[:port], no path."""
    value = value.strip().rstrip("/")
    if value != ANY and not _ORIGIN.match(value):
        raise ValueError(f"{value!r} is not an origin (give scheme://host:port, such as "
                         "http://localhost:3000, or *)")
    return value.lower()


# * Host. The Host header must name the address the server is bound to (127.0.0.1 gives
#   127.0.0.1; a loopback address also localhost; the --host name when one was given; every
#   interface, 0.0.0.0 or ::, any IP address and this machine's names), or a name added with
#   --allowed-host. Anything else is 400, so a DNS-rebinding page (its own name resolving to
#   127.0.0.1) gets no answer to read. A request without a Host header (HTTP/1.0) passes.
# * Origin. A request whose Origin is another origin than the server's own (scheme, name and port of
#   its Host) is 403, and so is its CORS preflight, unless --allow-origin lists it (or gives *): then
#   the answer carries Access-Control-Allow-Origin for it, and a preflight is answered 204. A request
#   without an Origin (curl, the OpenAI client, the page's own GETs) passes.
# * Content-Type. A POST must say application/json (a charset may follow), else 415: an HTML form or
#   a "simple" cross-site request (text/plain) is never read as JSON, even where no browser sends an
#   Origin. Refusals are the OpenAI-style error body.
@dataclasses.dataclass(frozen=True)
class RequestPolicy:
    """hosts: the names and addresses a Host header may give (lowercase); any_address: the
    server listens on every interface, so any IP address is its own; origins: the other origins
    allowed to call it from a browser (``*``: any)."""

    hosts: frozenset[str]
    any_address: bool = False
    origins: frozenset[str] = frozenset()

    @classmethod
    def for_socket(cls, sock: socket.socket, listen_host: str = "", *,
                   allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()
                   ) -> RequestPolicy:
        """The policy of a server on `sock` (bound), started with ``--host listen_host``."""
        address = _name_of(str(sock.getsockname()[0]))
        hosts = {address} | {host_name(h) for h in allowed_hosts}
        wildcard = ipaddress.ip_address(address).is_unspecified
        if listen_host and not _is_ip(_name_of(listen_host)):
            hosts.add(_name_of(listen_host))
        if wildcard or ipaddress.ip_address(address).is_loopback:
            hosts.add("localhost")
        if wildcard:
            hosts |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        return cls(frozenset(hosts), wildcard, frozenset(origin(o) for o in allowed_origins))

    def host_allowed(self, host: str | None) -> bool:
        if host is None:
            return True
        name = _name_of(host)
        return name in self.hosts or (self.any_address and _is_ip(name))

    def cross_origin(self, request_origin: str, host: str | None) -> bool | None:
        """False: `request_origin` is the server's own; True: another one that is allowed;
        None: another one that is not."""
        authority = request_origin.partition("://")[2].lower()
        if host is not None and authority == host.strip().lower():
            return False
        return True if ANY in self.origins or request_origin.lower() in self.origins else None


class RequestGuard:
    """ASGI middleware: `app`'s HTTP requests checked against `policy` (the rules are above
    `RequestPolicy`)."""

    def __init__(self, app, policy: RequestPolicy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host, request_origin = headers.get("host"), headers.get("origin")
        if not self.policy.host_allowed(host):
            return await _refuse(send, 400, f"Host {host!r} is not a name of this server (it "
                                 f"answers {sorted(self.policy.hosts)}); start it with "
                                 "--allowed-host NAME to add one", "host_not_allowed")
        cors = []
        if request_origin is not None:
            cross = self.policy.cross_origin(request_origin, host)
            if cross is None:
                return await _refuse(send, 403, f"requests from the web page origin "
                                     f"{request_origin!r} are refused (another site); start the "
                                     "server with --allow-origin ORIGIN to allow one",
                                     "origin_not_allowed")
            if cross:
                cors = [(b"access-control-allow-origin", request_origin.encode("latin-1")),
                        (b"vary", b"Origin")]
        method = scope["method"]
        if method == "OPTIONS" and cors and "access-control-request-method" in headers:
            return await _answer(send, 204, b"", cors + [
                (b"access-control-allow-methods", b"GET, POST"),
                (b"access-control-allow-headers", b"Content-Type, Authorization"),
                (b"access-control-max-age", b"600")])
        if method in ("POST", "PUT", "PATCH"):
            kind = headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind != "application/json":
                return await _refuse(send, 415, f"{method} {scope['path']}: Content-Type must be "
                                     f"application/json, got {kind or 'none'!r}",
                                     "unsupported_media_type", cors)
        if not cors:
            return await self.app(scope, receive, send)

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + cors}
            await send(message)

        return await self.app(scope, receive, send_with_cors)


async def _answer(send, status: int, body: bytes, headers: list) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": headers + [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send, status: int, message: str, code: str, headers: list = ()) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()
    await _answer(send, status, body, list(headers) + [(b"content-type", b"application/json")])
