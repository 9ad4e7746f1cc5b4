"""More real things to break: a private PostgreSQL cluster and an agent that misbehaves.

    with PostgresServer(tmp_path / "pg") as pg:       # initdb + postgres on a free port
        url = pg.create_database("agenttest")
        pg.restart(down_for=2.0)                      # fast shutdown, wait, start again

    with FaultAgent(demo_url) as agent:               # forwards to the demo agents
        agent.rule = lambda seen: HANG if seen.case == "H1" else None
        agent.too_many_requests(for_seconds=30, retry_after=2)
        agent.seen()                                  # every request: case, turn, headers, reply
        agent.delay = 0.05                            # answer after 50 ms (when forwarding)

`PostgresServer` is a cluster of the test's own (the shared server on 5432 is never
touched): initdb in a temporary directory owned by the `postgres` OS user when running as
root (initdb refuses root), started as a child process with PR_SET_PDEATHSIG, so it
cannot outlive the tests. `FaultAgent` answers each request as its `rule` says: forward
to the upstream demo agent (the default), hang (never answer), or reply with a status
such as 429 with Retry-After; it records every request with its headers and the status
it got, so tests can count what the agent saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from typing import Any, Self

import aiohttp
from aiohttp import web
from fleet import (
    WORKER_ENV,
    WORKER_HEADER,
    _die_with_parent,
    describe_request,
    fleet_on,
    free_port,
    wait_until,
)
from scripted_agent import Reply, ScriptedAgent

from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer

# -- a private PostgreSQL cluster ---------------------------------------------------------------


def _pg_bin(name: str) -> str:
    found = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    binary = found[-1]
    if not binary or not Path(binary).exists():
        raise AssertionError(f"PostgreSQL's {name} is required (postgresql server package)")
    return binary


class PostgresServer:
    """A throwaway PostgreSQL cluster: trust auth, TCP on 127.0.0.1 only, no fsync."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        # Not under the test's tmp_path: the postgres user must own every directory
        # above its data directory's contents it needs, and /tmp is world-writable.
        self.root = Path(tempfile.mkdtemp(prefix="agenttest-pg-"))
        self.data = self.root / "data"
        self.log_path = workdir / "postgres.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._user = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
        os.chmod(self.root, 0o700)
        subprocess.run(
            [
                _pg_bin("initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
            timeout=120,
            **self._user,
        )

    def admin_url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                _pg_bin("postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "unix_socket_directories=",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=32MB",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # runs after the switch to the postgres user
            **self._user,
        )
        log.close()
        wait_until(self._accepting, 30, f"postgres on port {self.port}", step=0.05)

    def _accepting(self) -> bool:
        import psycopg

        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"postgres exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            with psycopg.connect(self.admin_url(), connect_timeout=1):
                return True
        except psycopg.OperationalError:
            return False

    def stop(self, mode: str = "fast") -> None:
        """`fast` (SIGINT): every session is terminated, as in a restart or a failover;
        `immediate` (SIGQUIT): a crash, with recovery at the next start."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT if mode == "fast" else signal.SIGQUIT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def restart(self, down_for: float = 0.0, mode: str = "fast") -> None:
        self.stop(mode)
        time.sleep(down_for)
        self.start()

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.admin_url(name)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self.stop("immediate")
        finally:
            if self.process is not None and self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
            shutil.rmtree(self.root, ignore_errors=True)


# -- an agent that misbehaves on request ---------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """What to answer instead of forwarding: `hang` never answers; else `status`."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    hang: bool = False


HANG = Fault(hang=True)


@dataclass
class Request:
    """One request: the `[case X]` tag of its first user message, its turn (user
    messages), model, calling worker, arrival time (monotonic), headers, and the status
    it was answered with (None while unanswered, 0 if it hung)."""

    case: str | None
    turn: int
    model: str
    worker: str | None
    at: float
    headers: dict[str, str]
    status: int | None = None


class FaultAgent(ServedOnThread):
    """An HTTP agent in front of the demo agents, misbehaving as its `rule` says."""

    path = "/v1"

    def __init__(self, upstream: str, delay: float = 0.0, keep: bool = True) -> None:
        self.upstream = upstream.rstrip("/")
        self.rule: Callable[[Request], Fault | None] | None = None
        # Seconds before forwarding (an agent's latency); whether to keep every request
        # (a long benchmark only counts them).
        self.delay = delay
        self.keep = keep
        self.count = 0
        self._requests: list[Request] = []
        self._lock = threading.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._server = ThreadedServer(
            self._app, name="fault-agent", shutdown_timeout=0.5, handler_cancellation=True
        )

    def seen(self, case: str | None = None, model: str | None = None) -> list[Request]:
        with self._lock:
            return [
                r
                for r in self._requests
                if (case is None or r.case == case) and (model is None or r.model == model)
            ]

    def too_many_requests(
        self, for_seconds: float, retry_after: float, model: str | None = None
    ) -> tuple[float, float]:
        """Answer 429 (with Retry-After) from now on for `for_seconds`; returns the window
        (monotonic start, end)."""
        start = time.monotonic()
        end = start + for_seconds
        fault = Fault(
            status=429,
            headers={"Retry-After": f"{retry_after:g}"},
            body={"error": {"message": "Rate limit reached", "type": "rate_limit_error"}},
        )
        earlier = self.rule

        def rule(request: Request) -> Fault | None:
            if request.at < end and (model is None or request.model == model):
                return fault
            return earlier(request) if earlier else None

        self.rule = rule
        return start, end

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        case, turn = describe_request(body)
        seen = Request(
            case=case,
            turn=turn,
            model=str(body.get("model")),
            worker=request.headers.get(WORKER_HEADER),
            at=time.monotonic(),
            headers=dict(request.headers),
        )
        with self._lock:
            self.count += 1
            if self.keep:
                self._requests.append(seen)
        fault = self.rule(seen) if self.rule else None
        if fault is not None and fault.hang:
            seen.status = 0
            await asyncio.Event().wait()  # until the client gives up (handler cancelled)
        if fault is not None:
            seen.status = fault.status
            return web.json_response(fault.body, status=fault.status, headers=fault.headers)
        assert self._session is not None
        if self.delay:
            await asyncio.sleep(self.delay)
        async with self._session.post(
            f"{self.upstream}/chat/completions",
            data=raw,
            headers={"Content-Type": "application/json"},
        ) as upstream:
            seen.status = upstream.status
            return web.Response(
                body=await upstream.read(),
                status=upstream.status,
                content_type=upstream.content_type,
            )

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.cleanup_ctx.append(self._upstream_session)
        return app

    async def _upstream_session(self, app: web.Application) -> AsyncIterator[None]:
        # One session for every forwarded request, opened and closed on the server's loop.
        self._session = aiohttp.ClientSession()
        yield
        await self._session.close()


def write_config(directory: Path, agents: dict[str, dict[str, Any]], **top: Any) -> Path:
    """An agenttest.yaml with these agent entries (as JSON, which YAML reads)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "agenttest.yaml"
    path.write_text(json.dumps({"agents": agents, **top}, indent=2), encoding="utf-8")
    return path


def run_scripted_on_fleet(
    redis_db: str,
    pg_database: str,
    demo_url: str,
    directory: Path,
    cases: Path,
    reply: Callable[[dict[str, Any]], Reply],
) -> str:
    """Run `cases` on a fleet of one worker (two threads) against the agent `scripted`,
    a ScriptedAgent answering with `reply`; the run's id once it is done."""
    with ScriptedAgent() as agent:
        agent.script("target", reply)
        entry = {"protocol": "openai", "base_url": agent.base_url, "model": "target"}
        config = write_config(directory, {"scripted": entry})
        with contextmanager(fleet_on)(redis_db, pg_database, demo_url, directory) as fleet:
            fleet.start("w", concurrency=2)
            run_id = fleet.submit_no_wait(
                ["-i", str(cases), "-n", "scripted", "--config", str(config)]
            )
            fleet.wait_done(run_id, timeout=60)
    return run_id


def openai_agent(base_url: str, model: str = "expense", **entry: Any) -> dict[str, Any]:
    """An openai agent entry that tells the agent which worker calls it (WORKER_HEADER)."""
    headers = {WORKER_HEADER: f"${{{WORKER_ENV}:-none}}", **entry.pop("headers", {})}
    return {"protocol": "openai", "base_url": base_url, "model": model, "headers": headers, **entry}


def max_in_window(times: list[float], window: float) -> int:
    """The most arrivals in any half-open interval [t, t + window)."""
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best
