"""One attempt of an agent call over HTTP, through aiohttp.

Every call, plain http or https, read whole or streamed, goes through one aiohttp
session per event loop, and first takes a slot of one gate per loop, so that
AGENTTEST_HTTP_POOL_SIZE bounds the calls to agents under way. A call fails in one of
three ways: TimeoutError, `ConnectFailure` (could not connect, with the breaker's
reason) or `HttpFailure` (no reply that could be read). The session keeps no cookies: a
cookie one conversation's agent set would be sent on every other conversation's calls.
Each request chooses its TLS context and its proxy (`Route`: agents/http/tls.py,
agents/http/proxies.py), since one session serves every agent. Redirects are followed here,
not by aiohttp, which drops only `Authorization`, `Cookie` and `Proxy-Authorization`
when one leaves the origin: here every credential the call carries is dropped
(CREDENTIAL_HEADERS, and any header holding one of the call's secrets: its API key, a
value from `${VAR}`).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import weakref
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from yarl import URL

from agenttest_worker.agents.http.proxies import (
    FROM_ENVIRONMENT,
    EnvironmentProxies,
    ProxyProblem,
    ProxyRoute,
    environment_proxies,
    proxy_secrets,
)
from agenttest_worker.agents.http.streaming import Assembler, StreamSpec, read_stream
from agenttest_worker.agents.http.tls import TlsFileProblem, default_context
from agenttest_worker.agents.limits.breaker import unreachable_reason
from agenttest_worker.errors import redact
from agenttest_worker.json_values import body_bytes

if TYPE_CHECKING:
    import aiohttp

# aiohttp is imported by configure_pool or the first call, not here: a submitter that
# only enqueues a run to the fleet never calls an agent, and importing aiohttp (which
# builds its TLS contexts at import) was a tenth of its start-up.

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_REDIRECTS = 10  # requests in all, as aiohttp counts them
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"}
)
USER_AGENT = "agenttest"
_SNIPPET = 200

_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
    weakref.WeakKeyDictionary()
)
_environments: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Environment] = (
    weakref.WeakKeyDictionary()
)
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)
_pool_size = 200
_UNTRUSTED_HINT = "trust its CA with tls.ca_file, SSL_CERT_FILE or REQUESTS_CA_BUNDLE"


class HttpFailure(Exception):
    """A call that got no reply it could read, in words (transport.py: "cannot reach")."""


class ConnectFailure(Exception):
    """Could not connect: `reason` in words (breaker.unreachable_reason), which the
    breaker keeps as why the agent is unreachable."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Environment:
    """What the environment says of agent calls: its proxies and the default trust. Read
    when a loop's session is made, with it, not at each request: reading a dozen
    variables a request cost more than choosing from them."""

    proxies: EnvironmentProxies
    trust: ssl.SSLContext


@dataclass(frozen=True, slots=True)
class Route:
    """How one agent's calls travel: the TLS context of their https requests (None: the
    default trust, the loop's `Environment`), and how each request, each redirect too,
    chooses its proxy."""

    tls: ssl.SSLContext | None = None
    proxy: ProxyRoute = FROM_ENVIRONMENT


# The environment's trust and proxies: an agent without `tls:` or `proxy:`.
DEFAULT_ROUTE = Route()


@dataclass(slots=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes  # at most MAX_BODY_BYTES + 1 bytes; empty when streamed


def configure_pool(size: int) -> None:
    """Agent calls under way at once per event loop, set by a process about to make them
    (a worker starting, an embedded run) before its first call. It imports aiohttp now:
    a worker's first turns, all at once, would otherwise each wait on the import."""
    global _pool_size
    _pool_size = size
    import aiohttp  # noqa: F401

    # The default trust reads the system's certificates: now, not in a first call on the loop.
    default_context()


def connections_for(concurrency: int | None) -> int:
    """Agent calls at once per loop: AGENTTEST_HTTP_POOL_SIZE when set, else enough for
    every conversation in flight (never fewer than the setting's default). The same for
    a worker's `-c` and an embedded run's `--parallel`."""
    from agenttest_worker.settings import get_settings

    settings = get_settings()
    if "http_pool_size" in settings.model_fields_set:
        return settings.http_pool_size
    return max(settings.http_pool_size, concurrency or 0)


def gate() -> asyncio.Semaphore:
    """The running event loop's bound on the agent calls under way."""
    loop = asyncio.get_running_loop()
    current = _gates.get(loop)
    if current is None:
        current = _gates[loop] = asyncio.Semaphore(_pool_size)
    return current


def session() -> aiohttp.ClientSession:
    """The running event loop's aiohttp session; with it, the environment's proxies and
    default trust are read (`Environment`)."""
    import aiohttp  # at the first call, not at import (see above)

    loop = asyncio.get_running_loop()
    current = _sessions.get(loop)
    if current is None or current.closed:
        # First: an unreadable REQUESTS_CA_BUNDLE (TlsFileProblem) leaves no session.
        environment = Environment(environment_proxies(), default_context())
        connector = aiohttp.TCPConnector(
            limit=_pool_size, limit_per_host=_pool_size, ttl_dns_cache=300
        )
        current = aiohttp.ClientSession(
            connector=connector,
            # Bodies are parsed by us (lenient, with clear errors), not by aiohttp.
            json_serialize=json.dumps,
            raise_for_status=False,
            # Proxies are chosen per request (agents/http/proxies.py): aiohttp's reading of
            # the environment knows no CIDR ranges in NO_PROXY, and reads ~/.netrc.
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": USER_AGENT},
        )
        _sessions[loop] = current
        _environments[loop] = environment
    return current


async def close_session() -> None:
    """Close the running loop's session (end of an embedded run, worker shutdown)."""
    loop = asyncio.get_running_loop()
    _gates.pop(loop, None)
    _environments.pop(loop, None)
    current = _sessions.pop(loop, None)
    if current is not None and not current.closed:
        await current.close()


class Attempt:
    """One attempt of a call: what it sends, and what is known of its reply so far."""

    __slots__ = (
        "assembler",
        "body",
        "headers",
        "method",
        "route",
        "secrets",
        "status",
        "stream",
        "streamed",
        "timeout",
        "url",
    )

    def __init__(
        self,
        method: str,
        url: str,
        body: Any,
        headers: dict[str, str],
        timeout: float,
        stream: StreamSpec | None,
        secrets: Collection[str] = (),
        route: Route = DEFAULT_ROUTE,
    ) -> None:
        self.method = method
        self.url = url
        self.body = body
        self.headers = headers
        self.timeout = timeout
        self.stream = stream
        self.secrets = [secret for secret in secrets if secret]
        self.route = route
        self.assembler: Assembler | None = stream.assembler() if stream is not None else None
        self.status: int | None = None  # once known
        self.streamed = False  # the reply is being read as a stream of events

    async def exchange(self) -> Reply:
        """Send the request and read the reply, once the loop's gate lets it, following
        redirects. A reply read whole has `timeout` in all; a streamed one, for each
        wait (to connect, for the next piece)."""
        import aiohttp  # at the first call (see above)

        limit = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=self.timeout)
        method, url, headers = self.method, URL(self.url), self.headers
        # No body at all for None (a GET of a chat history), not the JSON text "null".
        payload = body_bytes(self.body) if self.body is not None else None
        proxy: str | None = None
        try:
            client = session()
            environment = _environments[asyncio.get_running_loop()]
            context = self.route.tls if self.route.tls is not None else environment.trust
            async with gate(), asyncio.timeout(None if self.stream else self.timeout):
                for _ in range(MAX_REDIRECTS):
                    proxy = self.route.proxy.for_url(url, environment.proxies)
                    async with client.request(
                        method,
                        url,
                        data=payload,
                        headers=headers,
                        timeout=limit,
                        allow_redirects=False,
                        ssl=context,
                        proxy=proxy,
                    ) as response:
                        status = response.status
                        location = response.headers.get("Location")
                        if status not in _REDIRECTS or not location:
                            return await self._read(response)
                    # As aiohttp follows a redirect, but for the credentials.
                    following = _redirected(url, location)
                    if status == 303 or (status in (301, 302) and method == "POST"):
                        method, payload = "GET", None
                    if following.origin() != url.origin():
                        headers = {k: v for k, v in headers.items() if not self._secret(k, v)}
                    url = following
                raise HttpFailure(f"too many redirects, to {url}")
        except TimeoutError:
            raise  # (aiohttp's own timeouts are ClientErrors too)
        except (ProxyProblem, TlsFileProblem) as exc:
            raise HttpFailure(str(exc)) from None
        except aiohttp.ServerDisconnectedError:
            # (Its text is the reply's head so far when one had begun, a repr.)
            raise HttpFailure("Server disconnected") from None
        except aiohttp.ClientConnectorError as exc:
            # (Its own text is noisy.) A proxy's credentials are in no part of it, but it is
            # kept by the breaker, fleet-wide: masked all the same.
            reason = unreachable_reason(exc)
            if isinstance(exc, aiohttp.ClientProxyConnectionError):
                reason = reason.replace("cannot connect to ", "cannot connect to proxy ", 1)
            elif isinstance(exc, aiohttp.ClientConnectorCertificateError):
                reason += f" ({_UNTRUSTED_HINT})"
            raise ConnectFailure(_masked(reason, proxy)) from None
        except aiohttp.ClientHttpProxyError as exc:
            # A tunnel (CONNECT) refused; aiohttp's text quotes the proxy's URL whole.
            via = URL(proxy) if proxy else None
            where = f" {via.host_subcomponent}:{via.port}" if via is not None else ""
            raise HttpFailure(f"proxy{where} answered {exc.status} {exc.message}") from None
        except aiohttp.ClientError as exc:
            raise HttpFailure(_masked(describe(exc), proxy)) from None

    def _secret(self, name: str, value: str) -> bool:
        return name.lower() in CREDENTIAL_HEADERS or any(s in value for s in self.secrets)

    async def _read(self, response: aiohttp.ClientResponse) -> Reply:
        self.status = response.status  # (a broken stream's record says it)
        headers = dict(response.headers.items())
        stream, assembler = self.stream, self.assembler
        if stream is not None and assembler is not None and 200 <= response.status < 300:
            # An agent asked for events that answers with one JSON body (it does not
            # stream) is read as a whole reply: HttpResult.stream stays None. (NDJSON is
            # often served as application/json: it is read as events.)
            whole = stream.framing == "sse" and response.content_type == "application/json"
            self.streamed = not whole
        if self.streamed and stream is not None and assembler is not None:
            await read_stream(response.content, stream.framing, assembler)
            return Reply(response.status, headers, b"")
        return Reply(response.status, headers, await _read_body(response.content))


def _masked(text: str, proxy: str | None) -> str:
    """`text` without the credentials of the proxy the request went through."""
    return redact(text, proxy_secrets(proxy)) if proxy is not None else text


def _redirected(url: URL, location: str) -> URL:
    try:
        following = url.join(URL(location))
        following.origin()
    except ValueError:
        raise HttpFailure(f"redirect to an invalid URL: {location[:_SNIPPET]}") from None
    if following.scheme not in ("http", "https"):
        raise HttpFailure(f"redirect to a URL that is not HTTP: {location[:_SNIPPET]}")
    return following


async def _read_body(stream: aiohttp.StreamReader) -> bytes:
    """The body, up to MAX_BODY_BYTES + 1 bytes (more is refused unread). aiohttp's
    `read(n)` returns what has arrived so far (up to n), not n bytes: a reply of a few
    hundred KB came back cut short."""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_BODY_BYTES:
        chunk = await stream.read(MAX_BODY_BYTES + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"
