"""Serving Prometheus metrics over HTTP: on loopback by default, behind a token elsewhere.

A worker (AGENTTEST_METRICS_PORT) and the fleet exporter (`agenttest-submit metrics`)
both serve /metrics. What they serve names agents, suites and costs, so, as the viewer
does, they listen on 127.0.0.1 unless told otherwise, and another address needs a token:
every scrape must then carry it, as `Authorization: Bearer TOKEN` (Prometheus's
`authorization` setting) or as the password of Basic auth (`basic_auth`).

prometheus_client's own `start_http_server` has no such check, so its WSGI app
(`make_wsgi_app`, public) is served here by the standard library's WSGI server, wrapped
in the check.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

DEFAULT_HOST = "127.0.0.1"

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or `localhost`); a name may resolve to any
    address, so it is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class MetricsEndpoint:
    """Where metrics are served: an address, a port (0: any free one), and the token a
    scrape must carry (None: none, allowed on loopback only)."""

    host: str
    port: int
    token: str | None = None

    def problem(self) -> str | None:
        """Why this endpoint must not be served, said for the user; None when it may."""
        if self.token is None and not is_loopback(self.host):
            return (
                f"{self.host} is not a loopback address: anyone who can reach it could read "
                "the metrics; give a token, or serve on 127.0.0.1"
            )
        return None


class MetricsServer:
    """A running metrics endpoint: its address, and `close()`."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server, self._thread = server, thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve_metrics(registry: Any, endpoint: MetricsEndpoint) -> MetricsServer:
    """Serve `registry` (a prometheus_client CollectorRegistry) at `endpoint` on a
    thread of its own. Refuses (ValueError, with the reason) an endpoint that must not be
    served; an address that cannot be bound raises OSError."""
    refused = endpoint.problem()
    if refused is not None:
        raise ValueError(refused)
    from prometheus_client import make_wsgi_app

    app: WsgiApp = make_wsgi_app(registry)
    if endpoint.token is not None:
        app = _requiring(endpoint.token, app)
    host = endpoint.host.strip("[]")
    server_class = _Server6 if ":" in host else _Server
    server = make_server(host, endpoint.port, app, server_class, _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="agenttest-metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)


def authorized(header: str, token: str) -> bool:
    """Whether an Authorization header carries `token`, as a bearer token or as the
    password of Basic auth (compared in constant time)."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.strip().encode(), token.encode())
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        _, _, password = decoded.partition(":")
        return hmac.compare_digest(password.encode(), token.encode())
    return False


def _requiring(token: str, app: WsgiApp) -> WsgiApp:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if authorized(environ.get("HTTP_AUTHORIZATION", ""), token):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("WWW-Authenticate", 'Basic realm="agenttest", charset="UTF-8"'),
            ],
        )
        return [b"a token is required\n"]

    return guarded


class _Server(ThreadingMixIn, WSGIServer):
    # A scrape that hangs must not keep the process from exiting.
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged: one every few seconds would drown the worker's log."""
