"""A Celery pool that plays turns as coroutines on one event loop per worker process.

Celery's thread pool gives every turn in flight a thread, and each thread its own event
loop (driver/event_loops.py): against a slow agent (seconds per call) a worker cannot
hold thousands of turns in flight that way, and spends its CPU switching threads
(benchmarks/in_flight.py measures it). Here a turn in flight costs a coroutine: `-c` /
AGENTTEST_WORKER_CONCURRENCY is how many turns one process keeps waiting on agents at once,
thousands if need be.

How it fits Celery (5.x has no asyncio pool of its own; the asyncio pools on PyPI
replace Celery's tracer by monkeypatching it). The consumer hands each message to
`on_apply` with a `callback` that finishes the request: with acks-late, that is where
the message is acknowledged (`Request.on_success`), so the message stays unacknowledged
until the callback runs. A task registered with `plays_on_loop` runs its tracer on the
loop thread; its body hands the coroutine it wants played to `defer` and returns. The
pool then plays that coroutine on the loop and calls the callback only when it has
ended, with its result or its exception: acks-late, redelivery of a worker's unfinished
turns after it dies, and everything built on them keep working unchanged. Tasks not
registered (start batches, aggregation, the sweep) run on a few plain threads, so a
long aggregation never stalls the loop.

The loop must never block. The store's calls are blocking (psycopg, Redis), so turns
hand them to a small thread pool (`offload`); an agent call, a rate-limit wait or a
retry's back-off is an await on the loop.

Celery's time limits (task_time_limit, task_soft_time_limit, --time-limit,
--soft-time-limit, a task's time_limit / soft_time_limit) stop a child process or signal
a thread: a coroutine is neither, so a worker asked for them refuses to start
(`refuse_time_limits`); turns are bounded by agenttest's own limits.

Supported: Celery 5.6 and 5.7 (with the billiard and kombu they require); pyproject
pins celery>=5.6,<6. What the pool takes from them through their public names, and what
it overrides, is listed in tests/test_loop_pool_celery.py, which checks each one's
signature: a Celery release that changes one fails there, not on a fleet.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import resource
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from billiard.einfo import ExceptionInfo
from celery.app.trace import LOG_FAILURE, LOG_SUCCESS
from celery.concurrency.base import BasePool, apply_target
from celery.platforms import EX_USAGE
from kombu.utils.encoding import safe_repr

T = TypeVar("T")

log = logging.getLogger("agenttest.pool")

# The names of the tasks whose body defers a coroutine to the loop (`plays_on_loop`).
_LOOP_TASKS: set[str] = set()


def plays_on_loop(name: str) -> str:
    """Register task `name` as one whose body hands its work to `defer` on this pool."""
    _LOOP_TASKS.add(name)
    return name


class _Deferral:
    """Where a task body running on the loop leaves the coroutine it wants played."""

    def __init__(self) -> None:
        self.coroutine: Coroutine[Any, Any, Any] | None = None


_deferral: contextvars.ContextVar[_Deferral | None] = contextvars.ContextVar(
    "agenttest_deferral", default=None
)


# What a deferring task body returns to its tracer. The tracer logs it as the task's
# result ("succeeded in 0.0002s"), which would say nothing true: that line is dropped
# (`_DropDeferred`), and the real one is logged when the coroutine has ended.
DEFERRED = "agenttest: deferred to the event loop"


class _DropDeferred(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)
        # The tracer logs its own short repr of the value: compare what it holds.
        return not (isinstance(data, dict) and DEFERRED in str(data.get("return_value")))


_trace_log = logging.getLogger("celery.app.trace")
# One instance: a pool started again in the same process adds it once (addFilter
# ignores a filter already there).
_DROP_DEFERRED = _DropDeferred()


def defer(make: Callable[[], Coroutine[Any, Any, Any]]) -> bool:
    """Under this pool, play `make()` on the loop after the task body returns, and
    finish the task (acknowledge its message) only when it has ended: True. Under any
    other pool (threads, prefork): False, and the body does its work itself."""
    slot = _deferral.get()
    if slot is None:
        return False
    slot.coroutine = make()
    return True


_active: TaskPool | None = None


async def offload(fn: Callable[..., T], /, *args: Any) -> T:
    """Run the blocking call `fn(*args)` on the pool's store threads (with the caller's
    context variables), awaited on the loop."""
    pool = _active
    if pool is None or pool.store_threads is None:
        raise RuntimeError("offload() is for turns played by the loop pool")
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool.store_threads, functools.partial(context.run, fn, *args))


def raise_open_files_limit(wanted: int) -> int:
    """Raise this process's soft limit of open files toward `wanted` (each turn in
    flight holds a socket to its agent), up to the hard limit; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit to %d: %s", target, exc)
    return soft


class TaskPool(BasePool):  # type: ignore[misc]  # Celery ships no type hints
    """`worker_pool` of the fleet (fleet/celery_app.py): turns on one event loop per process."""

    body_can_be_buffer = True
    signal_safe = False

    # Threads for the store's blocking calls, and for the tasks that are not turns. Two
    # store threads keep the loop fed; more spend more on the interpreter lock than they
    # save (benchmarks/throughput.py; benchmarks/RESULTS.md has the figures).
    STORE_THREADS = 2
    TASK_THREADS = 4

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.store_threads: ThreadPoolExecutor | None = None
        self._task_threads: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self._playing: set[asyncio.Task[Any]] = set()
        self._idle: asyncio.Event | None = None

    # -- lifecycle -------------------------------------------------------------------

    def on_start(self) -> None:
        global _active
        refuse_time_limits(self)
        from agenttest_worker.agents.http import exchange

        # Nothing below the consumer may cap the turns in flight: one connection and
        # one file descriptor per turn waiting on an agent.
        exchange.configure_pool(exchange.connections_for(self.limit))
        raise_open_files_limit(self.limit * 2 + 256)
        self.store_threads = ThreadPoolExecutor(self.STORE_THREADS, "agenttest-store")
        self._task_threads = ThreadPoolExecutor(self.TASK_THREADS, "agenttest-task")
        from agenttest_worker.driver.event_loops import new_event_loop

        # Made here, so that a wrong AGENTTEST_EVENT_LOOP stops the worker as it starts.
        loop = new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run_loop, args=(loop, ready), name="agenttest-turns", daemon=True
        )
        self._thread.start()
        ready.wait()
        _trace_log.addFilter(_DROP_DEFERRED)
        _active = self

    def _run_loop(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        self.loop = loop
        asyncio.set_event_loop(loop)
        self._idle = asyncio.Event()
        self._idle.set()
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def on_stop(self) -> None:
        """A warm shutdown: the turns in flight finish (each saves its step and
        publishes the next), then the loop and the threads stop."""
        self._stop(cancel=False)

    def on_terminate(self) -> None:
        """A cold shutdown: the turns in flight are abandoned, unacknowledged; the
        broker gives them back after the visibility timeout and their guards make a
        step already saved a no-op."""
        self._stop(cancel=True)

    def _stop(self, cancel: bool) -> None:
        global _active
        loop, thread = self.loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._wind_down(cancel), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            for threads in (self._task_threads, self.store_threads):
                if threads is not None:
                    threads.shutdown(wait=not cancel, cancel_futures=cancel)
            if _active is self:
                _active = None

    async def _wind_down(self, cancel: bool) -> None:
        from agenttest_worker.agents.http.exchange import close_session

        if cancel:
            for task in list(self._playing):
                task.cancel()
        if self._idle is not None:
            await self._idle.wait()
        await close_session()

    # -- running tasks -------------------------------------------------------------

    def on_apply(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **_: Any,
    ) -> None:
        args = args or ()
        # The tracer's first argument is the task's name (trace_task_ret, fast_trace_task).
        if args and args[0] in _LOOP_TASKS and self.loop is not None:
            self.loop.call_soon_threadsafe(
                self._begin, target, args, kwargs or {}, callback, accept_callback
            )
            return
        assert self._task_threads is not None, "the pool has not started"
        self._task_threads.submit(apply_target, target, args, kwargs, callback, accept_callback)

    def _begin(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        callback: Callable[..., Any] | None,
        accept_callback: Callable[..., Any] | None,
    ) -> None:
        """On the loop: run the task's tracer, then play what its body deferred."""
        started = time.monotonic()
        if accept_callback is not None:
            accept_callback(os.getpid(), started)
        slot = _Deferral()
        token = _deferral.set(slot)
        try:
            traced = target(*args, **kwargs)
        except Exception:
            # The tracer catches the task's own exceptions: this is Celery failing.
            log.exception("task %s could not be run", args[0])
            if callback is not None:
                callback((1, ExceptionInfo(), time.monotonic() - started))
            return
        finally:
            _deferral.reset(token)
        if slot.coroutine is None:  # the body failed or did its work itself
            if callback is not None:
                callback(traced)
            return
        task = asyncio.ensure_future(slot.coroutine)
        self._playing.add(task)
        assert self._idle is not None
        self._idle.clear()
        task.add_done_callback(functools.partial(self._finish, callback, started, args[:2]))

    def _finish(
        self,
        callback: Callable[..., Any] | None,
        started: float,
        name_and_id: tuple[Any, ...],
        task: asyncio.Task[Any],
    ) -> None:
        """The deferred coroutine ended: finish the request as its tracer would have."""
        self._playing.discard(task)
        if not self._playing and self._idle is not None:
            self._idle.set()
        runtime = time.monotonic() - started
        if task.cancelled():
            return  # a cold shutdown: left unacknowledged, for the broker to give back
        error = task.exception()
        if callback is None:
            return
        if error is None:
            result = safe_repr(task.result())  # type: ignore[no-untyped-call]
            if _trace_log.isEnabledFor(logging.INFO):
                name, task_id = name_and_id
                line: dict[str, Any] = {
                    "name": name,
                    "id": task_id,
                    "runtime": runtime,
                    "return_value": result,
                }
                _trace_log.info(LOG_SUCCESS, line, extra={"data": line})
            callback((0, result, runtime))
            return
        name, task_id = name_and_id
        # Logged as Celery's tracer logs a task that raised; Request.on_failure then
        # acknowledges the message (task_acks_on_failure_or_timeout), as on a thread.
        line = {"name": name, "id": task_id, "description": "raised unexpected"}
        line["exc"] = safe_repr(error)  # type: ignore[no-untyped-call]
        _trace_log.error(LOG_FAILURE, line, exc_info=error, extra={"data": line})
        try:
            raise error
        except Exception:
            callback((1, ExceptionInfo(), runtime))

    @property
    def info(self) -> dict[str, Any]:
        """What `celery inspect stats` shows of the pool: the turns in flight too."""
        return {**super().info, "in-flight": len(self._playing)}


# Celery's time limits, as the worker hands them to its pool (`timeout`, `soft_timeout`)
# and as a task declares them: (pool option, setting, command-line flag, task option).
_TIME_LIMITS = (
    ("timeout", "task_time_limit", "--time-limit", "time_limit"),
    ("soft_timeout", "task_soft_time_limit", "--soft-time-limit", "soft_time_limit"),
)


def refuse_time_limits(pool: BasePool) -> None:
    """Stop the worker (exit code EX_USAGE, 64) when it is asked for Celery's time limits,
    which this pool cannot honour, saying which and what bounds a turn instead."""
    asked = [
        f"{setting} / {flag} ({pool.options[option]:g} s)"
        for option, setting, flag, _ in _TIME_LIMITS
        if pool.options.get(option)
    ]
    tasks = pool.app.tasks.values() if pool.app is not None else ()
    asked += [
        f"task {task.name}'s {task_option} ({getattr(task, task_option):g} s)"
        for task in tasks
        for _, _, _, task_option in _TIME_LIMITS
        if getattr(task, task_option, None)
    ]
    if not asked:
        return
    log.critical(
        "this worker's pool (agenttest's default, which plays turns as coroutines) cannot "
        "honour Celery's time limits: %s. Leave them unset and bound turns with "
        "agenttest's own limits: each agent's `timeout` in agenttest.yaml, "
        "--turn-timeout and --timeout, and a run's --deadline; or run this worker with "
        "--pool prefork, which enforces Celery's time limits.",
        "; ".join(asked),
    )
    # Celery's worker stops with the code of a SystemExit its start-up raises.
    raise SystemExit(EX_USAGE)
