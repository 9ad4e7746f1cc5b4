"""Real processes for fleet tests: Celery workers, a private Redis server, a watching agent.
A fleet's broker is Redis or RabbitMQ (conftest's `any_broker` gives each in turn).

    fleet = Fleet(broker_url, database_url, tmp_path, env={"AGENTTEST_DEMO_URL": url})
    worker = fleet.start("a", concurrency=2)      # returns once the worker logs "ready."
    worker.kill()                                 # SIGKILL (a crash), or .stop() (SIGTERM)
    run_id = fleet.submit_no_wait(["-i", cases, "-n", "agent", "--config", yaml])
    fleet.wait_done(run_id)                       # polls the store until status "done"
    fleet.close()                                 # the `fleet` fixture always does this

Workers run `python -m celery -A agenttest_worker worker` exactly as an operator would,
with the settings in their environment. Every process started here is killed when its
test ends (fixture teardown) and, should the test process itself die, by the kernel
(PR_SET_PDEATHSIG), so none outlives the tests.

`WatchingAgent` stands between the workers and the demo agents: it forwards every
request unchanged after an optional delay, and tells the test which requests arrived
(case, turn, time), so a test can act while a turn is in flight. `RedisServer` is a
throwaway `redis-server` (no persistence, like the CI one) that a test may stop and
start again without disturbing anyone else's Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

import aiohttp
from aiohttp import web
from sqlalchemy import select

from agenttest_worker.demo.threaded import ServedOnThread, ThreadedServer
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import CaseRow

READY_TIMEOUT = 30.0
# Each worker's name, which the agent entry of write_project() sends in WORKER_HEADER.
WORKER_ENV = "AGENTTEST_TEST_WORKER"
WORKER_HEADER = "X-Test-Worker"
_RUN_ID = re.compile(r"run (\S+): \d+ case\(s\) enqueued")
_PR_SET_PDEATHSIG = 1


# Resolved here, not in the child: between fork and exec only this call may run.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the test process goes away."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def run_id_of(submit_stderr: str) -> str:
    """The run id agenttest-submit printed ("run ID: N case(s) enqueued")."""
    match = _RUN_ID.search(submit_stderr)
    assert match, f"no run id in:\n{submit_stderr}"
    return match.group(1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.1) -> Any:
    """Poll `predicate` until it returns something truthy; fail with `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(step)


def lines_read(stream: IO[str] | None) -> tuple[list[str], threading.Thread]:
    """The lines a process's pipe gives, appended as they come by a thread that reads it
    to its end (a test waits on them with `wait_until`), and that thread."""
    assert stream is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(stream), daemon=True)
    reader.start()
    return lines, reader


# -- workers ---------------------------------------------------------------------------------


class Worker:
    """One `celery worker` process, its log in a file."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        log_path: Path,
        concurrency: int,
        args: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "agenttest_worker",
            "worker",
            "--loglevel=INFO",
            "-n",
            f"{name}@%h",
            "--concurrency",
            str(concurrency),
            # Nothing to sync with: saves a second of startup per worker.
            "--without-mingle",
            "--without-gossip",
            *args,
        ]
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        def ready() -> bool:
            exited = self.process.poll() is not None
            if f" {self.name}@" in self.log() and " ready." in self.log():
                return True  # (even if a test has killed it since)
            if exited:
                raise AssertionError(
                    f"worker {self.name} exited with {self.process.returncode}:\n{self.log()}"
                )
            return False

        wait_until(ready, timeout, f"worker {self.name} to be ready")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-task, acknowledging nothing."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self._log.close()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a warm shutdown), then SIGKILL if it takes longer than `timeout`."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


class Fleet:
    """Workers and submissions sharing one broker and one database."""

    def __init__(
        self,
        broker_url: str,
        database_url: str,
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.broker_url = broker_url
        self.database_url = database_url
        self.workdir = workdir
        self.workers: list[Worker] = []
        self.submitters: list[subprocess.Popen[str]] = []
        base = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTEST_")}
        base.update(
            {
                "AGENTTEST_BROKER_URL": broker_url,
                "AGENTTEST_DATABASE_URL": database_url,
                "AGENTTEST_HOME": str(workdir / ".agenttest"),
                # Small, so that a dead worker's turn comes back within seconds; above
                # the slowest turn of these tests.
                "AGENTTEST_VISIBILITY_TIMEOUT": "5",
                "AGENTTEST_RESTORE_INTERVAL": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        base.update(env or {})
        self.env = base

    def start(
        self,
        name: str,
        concurrency: int = 1,
        wait: bool = True,
        args: Sequence[str] = (),
        **env: str,
    ) -> Worker:
        """A worker with this fleet's environment plus `env` (AGENTTEST_<KEY>=value), and
        `args` for `celery worker` (--pool ...)."""
        worker_env = {**self.env, **{f"AGENTTEST_{k.upper()}": v for k, v in env.items()}}
        worker_env[WORKER_ENV] = name  # agents written by write_project() send it back
        log_path = self.workdir / f"worker-{name}.log"
        worker = Worker(name, worker_env, log_path, concurrency, args)
        self.workers.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def logs(self) -> str:
        return "".join(w.log() for w in self.workers)

    def close(self) -> None:
        for process in self.submitters:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=10)
        for worker in self.workers:
            with contextlib.suppress(Exception):
                worker.kill()

    # -- submitting -------------------------------------------------------------------------

    def submit(
        self, args: Sequence[str], timeout: float = 120.0, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """`agenttest-submit ARGS` in a subprocess against this fleet."""
        submit_env = {**self.env, **{f"AGENTTEST_{k.upper()}": v for k, v in env.items()}}
        return subprocess.run(
            [sys.executable, "-m", "agenttest_submit.cli", *args],
            env=submit_env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )

    def submit_background(self, args: Sequence[str], **env: str) -> subprocess.Popen[str]:
        """`agenttest-submit ARGS` (waiting for the run) without waiting for it here."""
        submit_env = {**self.env, **{f"AGENTTEST_{k.upper()}": v for k, v in env.items()}}
        process = subprocess.Popen(
            [sys.executable, "-m", "agenttest_submit.cli", *args],
            env=submit_env,
            cwd=self.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            preexec_fn=_die_with_parent,
        )
        self.submitters.append(process)
        return process

    def submit_no_wait(self, args: Sequence[str], **env: str) -> str:
        """Store and enqueue a run, return its id (the submitter exits at once)."""
        done = self.submit([*args, "--no-wait"], timeout=60.0, **env)
        assert done.returncode == 0, f"submit failed ({done.returncode}):\n{done.stderr}"
        return run_id_of(done.stderr)

    def wait_done(self, run_id: str, timeout: float = 60.0) -> None:
        def done() -> bool:
            run = runs.get_run(self.database_url, run_id)
            return run is not None and run.status == "done"

        try:
            wait_until(done, timeout, f"run {run_id} to be done", step=0.2)
        except AssertionError as exc:
            run = runs.get_run(self.database_url, run_id)
            state = (run.status, run.finished_cases, run.total_cases) if run else None
            raise AssertionError(
                f"{exc}; run (status, finished, total) = {state}\n{self.logs()[-6000:]}"
            ) from None


def fleet_on(
    broker_url: str, database_url: str, demo_url: str, workdir: Path, schema: bool = True
) -> Iterator[Fleet]:
    """The body of a `fleet` fixture: an emptied broker (a Redis db, or the fleet's queue
    in a RabbitMQ virtual host), the schema (unless `schema` is False: the workers must
    make it), cleanup after."""
    from agenttest_worker.store.sql.db import upgrade

    empty = _emptying(broker_url)
    empty()
    if schema:
        upgrade(database_url)
    fleet = Fleet(broker_url, database_url, workdir, env={"AGENTTEST_DEMO_URL": demo_url})
    try:
        yield fleet
    finally:
        fleet.close()
        empty()


def _emptying(broker_url: str) -> Callable[[], None]:
    """What leaves no message of an earlier test for this one's workers."""
    if broker_url.startswith("amqp://"):
        from kombu import Connection

        def delete_queue() -> None:
            # (The virtual host is the test session's own: conftest's rabbitmq_url.)
            with Connection(broker_url) as connection:
                connection.default_channel.queue_delete("agenttest")

        return delete_queue

    import redis

    client = redis.Redis.from_url(broker_url)
    owner = client.get("agenttest:db-owner")  # conftest's claim on this db number

    def flush() -> None:
        # One transaction: between a flush and a separate re-claim, another test run
        # could take the number.
        with client.pipeline(transaction=True) as pipe:
            pipe.flushdb()
            if owner is not None:
                pipe.set("agenttest:db-owner", owner, ex=3600)
            pipe.execute()

    return flush


# -- a private Redis server -----------------------------------------------------------------


class RedisServer:
    """A `redis-server` of the test's own on a free port, keeping nothing on disk.

    With `tls`, it speaks TLS only (a self-signed certificate made with openssl; clients
    are not asked for one), and `url` is a `rediss://` URL that does not verify it.
    """

    def __init__(self, workdir: Path, tls: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise AssertionError("redis-server is required for the broker tests")
        self.binary = binary
        self.port = free_port()
        self.workdir = workdir
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.tls:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_cert_reqs=none"
        return f"redis://127.0.0.1:{self.port}/0"

    def _listen_options(self) -> list[str]:
        if not self.tls:
            return ["--port", str(self.port)]
        cert, key = self.workdir / "redis.crt", self.workdir / "redis.key"
        # (An EC key: made in milliseconds, where an RSA key takes up to a second.)
        request = ["openssl", "req", "-x509", "-newkey", "ec", "-nodes", "-days", "1"]
        request += ["-pkeyopt", "ec_paramgen_curve:prime256v1"]
        request += ["-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)]
        subprocess.run(request, check=True, capture_output=True)
        return [
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--tls-ca-cert-file",
            str(cert),
            "--tls-auth-clients",
            "no",
        ]

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                "--bind",
                "127.0.0.1",
                *self._listen_options(),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()

        def accepting() -> bool:
            with socket.socket() as sock:
                sock.settimeout(0.2)
                return sock.connect_ex(("127.0.0.1", self.port)) == 0

        wait_until(accepting, 10, f"redis-server on port {self.port}", step=0.05)

    def stop(self) -> None:
        """Shut down without saving: every queue and unacknowledged message is gone."""
        if self.process is None or self.process.poll() is not None:
            return
        if self.tls:  # (redis-cli would need the certificate: a signal does the same)
            self.process.terminate()
        else:
            subprocess.run(
                ["redis-cli", "-p", str(self.port), "shutdown", "nosave"],
                capture_output=True,
                timeout=10,
                check=False,
            )
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()


# -- an agent that tells the test what it is doing ------------------------------------------------

_CASE_TAG = re.compile(r"\[case (\w[\w.-]*)\]")


@dataclass(frozen=True)
class Seen:
    """One request the agent got: which case (the `[case X]` tag in its first user
    message), which turn (the number of user messages), which model, from which
    worker (WORKER_HEADER), when."""

    case: str | None
    turn: int
    model: str
    worker: str | None
    at: float


def describe_request(body: dict[str, Any]) -> tuple[str | None, int]:
    """(case, turn) of a chat request: its first user message's `[case X]` tag, and its
    number of user messages."""
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    case = None
    if users:
        content = users[0].get("content")
        text = content if isinstance(content, str) else str(content)
        found = _CASE_TAG.search(text)
        case = found.group(1) if found else None
    return case, len(users)


class WatchingAgent(ServedOnThread):
    """An HTTP agent in front of the demo agents: forwards, delays, reports, synchronizes.

    - `delay`: seconds to wait before forwarding each request (a slow agent), or a
      function of the request (`Seen`) that says how long;
    - `on_request(seen)`: called (on a thread, not awaited) as each request arrives;
    - `together(predicate, n)`: requests matching `predicate` are held until `n` of
      them have arrived, then all are answered at the same moment;
    - `hold(predicate, until)`: requests matching `predicate` are held until the event
      `until` is set (by the test, once it has looked at the run meanwhile).
    """

    path = "/v1"

    def __init__(self, upstream: str, delay: float | Callable[[Seen], float] = 0.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.delay = delay
        self.on_request: Callable[[Seen], None] | None = None
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        self._groups: list[tuple[Callable[[Seen], bool], int, asyncio.Event, list[int]]] = []
        self._holds: list[tuple[Callable[[Seen], bool], threading.Event]] = []
        self._server = ThreadedServer(
            self._app, name="watching-agent", shutdown_timeout=1.0, access_log=True
        )

    def seen(self, case: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self._seen if case is None or s.case == case]

    def wait_for(self, predicate: Callable[[Seen], bool], timeout: float = 30.0) -> Seen:
        found: Seen = wait_until(
            lambda: next((s for s in self.seen() if predicate(s)), None),
            timeout,
            "the agent to receive a matching request",
            step=0.02,
        )
        return found

    def together(self, predicate: Callable[[Seen], bool], n: int) -> None:
        self._groups.append((predicate, n, asyncio.Event(), [0]))

    def hold(self, predicate: Callable[[Seen], bool], until: threading.Event) -> None:
        self._holds.append((predicate, until))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        case, turn = describe_request(body)
        worker = request.headers.get(WORKER_HEADER)
        seen = Seen(case, turn, str(body.get("model")), worker, time.monotonic())
        with self._lock:
            self._seen.append(seen)
        if self.on_request is not None:
            threading.Thread(target=self.on_request, args=(seen,), daemon=True).start()
        for predicate, n, event, count in self._groups:
            if predicate(seen):
                count[0] += 1
                if count[0] >= n:
                    event.set()
                await event.wait()
        for predicate, until in self._holds:
            while predicate(seen) and not until.is_set():
                await asyncio.sleep(0.02)
        delay = self.delay(seen) if callable(self.delay) else self.delay
        if delay:
            await asyncio.sleep(delay)
        headers = {k: v for k, v in request.headers.items() if k.lower() == "content-type"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{self.upstream}/chat/completions", data=raw, headers=headers
            ) as upstream,
        ):
            return web.Response(
                body=await upstream.read(),
                status=upstream.status,
                content_type=upstream.content_type,
            )

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        return app


# -- project files --------------------------------------------------------------------------------


def write_project(directory: Path, agent_url: str, name: str = "slow.expense") -> Path:
    """An agenttest.yaml with one `expense` agent at `agent_url`; returns its path.

    The agent entry sends the name of the worker calling it in WORKER_HEADER (workers
    interpolate a run's stored config with their own environment).
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "agenttest.yaml"
    path.write_text(
        "agents:\n"
        f"  {name}:\n"
        "    protocol: openai\n"
        f"    base_url: {agent_url}\n"
        "    model: expense\n"
        "    timeout: 30s\n"
        "    max_retries: 0\n"
        "    headers:\n"
        f"      {WORKER_HEADER}: ${{{WORKER_ENV}:-none}}\n",
        encoding="utf-8",
    )
    return path


def expense_case(case_id: str, turns: int = 3) -> dict[str, Any]:
    """A multi-turn case for the `expense` demo agent, tagged `[case ID]` for the agent."""
    steps: list[dict[str, Any]] = [
        {
            "input": f"I want to submit an expense [case {case_id}]",
            "assertions": [{"type": "contains", "value": "type of expense"}],
        },
        {
            "input": "Business travel, $3500",
            "assertions": [{"type": "tool_called", "name": "create_expense"}],
        },
        {"input": "Yes, confirm", "assertions": [{"type": "contains", "value": "submitted"}]},
    ]
    return {
        "id": case_id,
        "type": "multi_turn",
        "tool_mocks": {"create_expense": {"id": f"EXP-{case_id}", "status": "draft"}},
        "turns": steps[:turns],
    }


def greeting_case(case_id: str) -> dict[str, Any]:
    """A one-turn case for the `expense` demo agent that passes (its greeting asks nothing)."""
    return {
        "id": case_id,
        "input": f"Hello [case {case_id}]",
        "assertions": [{"type": "contains", "value": "help you"}],
    }


def write_cases(directory: Path, cases: Sequence[dict[str, Any]], name: str = "cases") -> Path:
    path = directory / f"{name}.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


def turn_rows(database_url: str, run_id: str) -> dict[tuple[str, int], int]:
    return {(c, t): n for c, t, n in results.count_turn_rows(database_url, run_id)}


def case_rows(database_url: str, run_id: str) -> list[tuple[str, str, str | None]]:
    """(case_id, phase, status) of every conversation of the run, in submission order."""
    with session_scope(database_url) as session:
        rows = session.execute(
            select(CaseRow.case_id, CaseRow.phase, CaseRow.status)
            .where(CaseRow.run_id == run_id)
            .order_by(CaseRow.seq)
        ).all()
    return [(c, p, s) for c, p, s in rows]
