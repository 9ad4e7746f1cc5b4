"""An aiohttp application served on a background thread with its own event loop.

    with ThreadedServer(create_app, name="my-agent") as server:   # port 0: a free port
        httpx.get(server.url + "/v1/models")                       # "http://127.0.0.1:41234"

The caller's thread stays free for client code, including its own `asyncio.run`. The
demo agents' `DemoServer` and the test agents (tests/) all serve this way.

`start()` returns the root URL once the socket accepts connections; `stop()` shuts the
application down and joins the thread. Both are idempotent, and a stopped server can be
started again: `make_app` is called on every start, because each start has a new loop
and an aiohttp application stays tied to the loop it first ran on. `start_runner()` is
the same start-up on the caller's own loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from aiohttp import web

START_TIMEOUT_S = 10.0


def root_url(host: str, port: int) -> str:
    """The URL of a server bound to host:port, without a path."""
    shown = f"[{host}]" if ":" in host else host  # IPv6 literals need brackets in URLs
    return f"http://{shown}:{port}"


async def start_runner(
    app: web.Application,
    host: str,
    port: int,
    *,
    shutdown_timeout: float,
    handler_cancellation: bool = False,
    access_log: bool = False,
) -> tuple[web.AppRunner, str]:
    """Serve `app` on host:port (0: a free port); returns the runner (call `cleanup()`
    to stop) and the root URL with the port actually bound."""
    options: dict[str, Any] = {}
    if not access_log:
        options["access_log"] = None  # aiohttp's default logs every request at INFO
    runner = web.AppRunner(
        app,
        shutdown_timeout=shutdown_timeout,
        handler_cancellation=handler_cancellation,
        **options,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()  # e.g. the port is taken: run the app's cleanup anyway
        raise
    return runner, root_url(host, int(runner.addresses[0][1]))


class _StartedInWith:
    """`with x:` starts `x` and stops it on the way out, whatever happened inside."""

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ThreadedServer(_StartedInWith):
    """`make_app()` served on host:port from a daemon thread named `name`.

    `shutdown_timeout`: seconds `stop()` lets requests in flight finish (a test that
    gave up on a slow request should not wait for it); `handler_cancellation`: cancel a
    request's handler when its client goes away; `access_log`: log every request.
    """

    def __init__(
        self,
        make_app: Callable[[], web.Application],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "aiohttp-server",
        shutdown_timeout: float = 1.0,
        handler_cancellation: bool = False,
        access_log: bool = False,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        self.make_app = make_app
        self.host = host
        self.port = port
        self.name = name
        self.shutdown_timeout = shutdown_timeout
        self.handler_cancellation = handler_cancellation
        self.access_log = access_log
        self.start_timeout = start_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """The root URL, e.g. "http://127.0.0.1:41234"."""
        if self._url is None:
            raise RuntimeError(f"{self.name} is not running: call start() first")
        return self._url

    def start(self) -> str:
        """Start serving (idempotent) and return the root URL."""
        if self._url is not None:
            return self._url
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=_run_loop, args=(loop,), name=self.name, daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        future = asyncio.run_coroutine_threadsafe(self._start(), loop)
        try:
            self._runner, self._url = future.result(timeout=self.start_timeout)
        except BaseException:
            self._stop_loop()  # e.g. the port is taken: leave no thread behind
            raise
        return self._url

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent)."""
        if self._loop is None:
            return
        try:
            if self._runner is not None:
                cleanup = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
                # Requests in flight get `shutdown_timeout`; the rest is slack for a busy machine.
                cleanup.result(timeout=self.start_timeout + self.shutdown_timeout)
        finally:
            self._stop_loop()

    async def _start(self) -> tuple[web.AppRunner, str]:
        return await start_runner(
            self.make_app(),
            self.host,
            self.port,
            shutdown_timeout=self.shutdown_timeout,
            handler_cancellation=self.handler_cancellation,
            access_log=self.access_log,
        )

    def _stop_loop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(self.start_timeout)
        self._loop = self._thread = None
        self._runner = None
        self._url = None


class ServedOnThread(_StartedInWith):
    """Base of an object whose aiohttp app a ThreadedServer serves: the lifecycle
    (`start`, `stop`, a context manager) and addresses, `path` appended to the root
    URL (e.g. "/v1" for a Chat Completions base URL). Subclasses set `_server`."""

    path = ""
    _server: ThreadedServer

    @property
    def host(self) -> str:
        return self._server.host

    @property
    def port(self) -> int:
        """The port asked for (0: a free one, picked at each start)."""
        return self._server.port

    @property
    def base_url(self) -> str:
        return self._server.url + self.path

    def start(self) -> str:
        """Start serving (idempotent) and return the base URL."""
        return self._server.start() + self.path

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent)."""
        self._server.stop()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        # Handlers still running after the shutdown timeout (a client that gave up on a
        # slow reply) are cancelled and finished here, rather than destroyed pending
        # with the loop (asyncio then prints "Task was destroyed but it is pending").
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
