"""Binding the viewer: where it listens, and when it refuses to.

On a loopback address (the default, 127.0.0.1) only this machine's users reach it. On
any other address anyone on the network could read every run, agent replies included:
it refuses to start without a token (`--token`, or AGENTTEST_VIEW_TOKEN so that the
token is not in the process list), which every request must then carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import sys

from agenttest_submit.cli.request import ViewRequest
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.observe import is_loopback

TOKEN_ENV = "AGENTTEST_VIEW_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8750


def chosen_token(given: str | None) -> str | None:
    token = given if given is not None else os.environ.get(TOKEN_ENV)
    return token or None


def check_binding(host: str, token: str | None) -> None:
    """Refuse a non-loopback address without a token (exit 2, before listening)."""
    if not is_loopback(host) and token is None:
        raise InputError(
            InputProblem(
                f"--host {host} is not a loopback address: anyone who can reach it could read "
                f"every run; give --token (or set {TOKEN_ENV}), or leave out --host",
                field="--host",
            )
        )


def url_of(host: str, port: int, path: str = "/") -> str:
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{port}{path}"


def binding_problem(host: str, port: int, exc: OSError) -> InputProblem:
    """Why the viewer cannot listen at host:port, said for the user (exit 2)."""
    if exc.errno == errno.EADDRINUSE:
        why = (
            f"port {port} on {host} is in use (another viewer, or another program): "
            "give another --port, or --port 0 for any free one"
        )
    elif exc.errno == errno.EACCES:
        why = f"no permission to listen on port {port}: use a port above 1023, or --port 0"
    elif exc.errno == errno.EADDRNOTAVAIL:
        why = f"{host} is not an address of this machine: leave out --host for 127.0.0.1"
    else:
        why = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return InputProblem(why, field="--port" if exc.errno != errno.EADDRNOTAVAIL else "--host")


def run_view(request: ViewRequest) -> int:
    """`agenttest-submit view [RUN]`: the store this invocation's settings name."""
    token = chosen_token(request.token)
    check_binding(request.host, token)  # before anything is opened
    from agenttest_submit.run.runner import resolve_run
    from agenttest_worker.settings import get_settings
    from agenttest_worker.store import upgrade  # the store: SQLAlchemy, only here

    url = get_settings().effective_database_url()
    upgrade(url)  # as every subcommand does: a store it can read
    path = f"/runs/{resolve_run(url, request.run).id}" if request.run else "/"
    return serve(url, request.host, request.port, token, path)


def serve(database_url: str, host: str, port: int, token: str | None, path: str = "/") -> int:
    """Serve until Ctrl-C or SIGTERM; prints the address once it is listening."""
    check_binding(host, token)
    with contextlib.suppress(KeyboardInterrupt):  # the way to stop it
        asyncio.run(_serve(database_url, host, port, token, path))
    return 0


async def _serve(database_url: str, host: str, port: int, token: str | None, path: str) -> None:
    from aiohttp import web  # here: aiohttp's server is needed only by this command

    from agenttest_submit.commands.viewer.web_app import make_app

    runner = web.AppRunner(make_app(database_url, token=token, host=host), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host.strip("[]"), port)
        try:
            await site.start()
        except OSError as exc:
            raise InputError(binding_problem(host, port, exc)) from None
        # (With --port 0 the system chose the port: say the one it is on.)
        listening = runner.addresses[0][1] if runner.addresses else port
        auth = " (token required)" if token else ""
        print(
            f"agenttest viewer: {url_of(host, listening, path)}{auth} "
            "(read-only but for labels; Ctrl-C stops it)",
            file=sys.stderr,
            flush=True,
        )
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
