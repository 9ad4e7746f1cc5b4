"""What the workers' loop pool (agenttest_worker/fleet/loop_pool.py) takes from Celery,
billiard and kombu, checked member by member: each exists, with the parameters the pool
calls it with or overrides it for. Celery has no asyncio pool and documents no pool API
beyond its own pools: a release that changes one of these fails here, before a fleet
runs on it (then check the pool against the new release and move the pin in
pyproject.toml)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest
from billiard.einfo import ExceptionInfo
from celery.app import task as celery_task
from celery.app import trace
from celery.concurrency import base
from celery.platforms import EX_USAGE
from celery.worker.request import Request, create_request_cls
from kombu.utils.encoding import safe_repr

from agenttest_worker.fleet.celery_app import app
from agenttest_worker.fleet.loop_pool import TaskPool


def shape(member: Callable[..., Any]) -> str:
    """A callable's parameters by name and order (defaults left out: the pool passes
    every argument it relies on)."""
    marks = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    params = inspect.signature(member).parameters.values()
    return ", ".join(marks.get(p.kind, "") + p.name for p in params)


def _request_class() -> type[Any]:
    """The request class a worker makes for the turn task (create_request_cls), whose
    callbacks the pool calls."""
    import agenttest_worker.fleet.tasks  # noqa: F401  (registers the turn task)

    turn = app.tasks["agenttest.turn"]
    made: type[Any] = create_request_cls(Request, turn, TaskPool(1, app=app), "here", None)
    return made


# (what, the member, its parameters as the pool uses them, how the pool uses it)
USED: list[tuple[str, Callable[..., Any], str]] = [
    # TaskPool subclasses BasePool: its __init__ passes everything on, and the pool
    # reads `limit`, `options` (the worker's time limits) and `app` (its tasks).
    (
        "BasePool.__init__",
        base.BasePool.__init__,
        "self, limit, putlocks, forking_enable, callbacks_propagate, app, **options",
    ),
    # The worker starts and stops the pool through these; the pool overrides the on_*.
    ("BasePool.start", base.BasePool.start, "self"),
    ("BasePool.stop", base.BasePool.stop, "self"),
    ("BasePool.terminate", base.BasePool.terminate, "self"),
    ("BasePool.on_start", base.BasePool.on_start, "self"),
    ("BasePool.on_stop", base.BasePool.on_stop, "self"),
    ("BasePool.on_terminate", base.BasePool.on_terminate, "self"),
    # A request reaches the pool through apply_async, which hands on_apply the tracer,
    # its arguments and the request's callbacks as keywords.
    ("BasePool.apply_async", base.BasePool.apply_async, "self, target, args, kwargs, **options"),
    ("BasePool.on_apply", base.BasePool.on_apply, "self, *args, **kwargs"),
    # A task that is not a turn runs on a thread through apply_target (positionally).
    (
        "apply_target",
        base.apply_target,
        "target, args, kwargs, callback, accept_callback, pid, getpid, propagate, monotonic, **_",
    ),
    # The tracer a request hands the pool: its first two arguments are the task's name
    # and id (which tasks play on the loop, and the log lines).
    (
        "trace_task_ret",
        trace.trace_task_ret,
        "name, uuid, request, body, content_type, content_encoding, loads, app, **extra_request",
    ),
    (
        "fast_trace_task",
        trace.fast_trace_task,
        "task, uuid, request, body, content_type, content_encoding, loads, _loc, hostname, **_",
    ),
    # Its success line, whose context the pool's log filter reads from the record.
    ("celery.app.trace.info", trace.info, "fmt, context"),
    # The callbacks: accept_callback(pid, started), callback((failed, value, runtime)).
    ("Request.execute_using_pool", Request.execute_using_pool, "self, pool, **kwargs"),
    ("Request.on_accepted", Request.on_accepted, "self, pid, time_accepted"),
    ("Request.on_success", Request.on_success, "self, failed__retval__runtime, **kwargs"),
    # A turn's exception handed to the callback, and its result's repr.
    ("ExceptionInfo.__init__", ExceptionInfo.__init__, "self, exc_info, internal"),
    ("safe_repr", safe_repr, "o, errors"),
]


@pytest.mark.parametrize(("what", "member", "expected"), USED, ids=[u[0] for u in USED])
def test_each_member_the_pool_uses_has_the_parameters_it_expects(
    what: str, member: Callable[..., Any], expected: str
) -> None:
    assert shape(member) == expected, what


def test_the_request_a_worker_makes_for_a_turn_has_the_callbacks_the_pool_calls() -> None:
    made = _request_class()
    assert shape(made.execute_using_pool) == "self, pool, **kwargs"
    assert shape(made.on_accepted) == "self, pid, time_accepted"
    assert shape(made.on_success) == "self, failed__retval__runtime, **kwargs"


def test_the_attributes_and_constants_the_pool_relies_on_are_there() -> None:
    # Overridden by the pool: `info` stays a property (`celery inspect stats` reads it).
    assert isinstance(inspect.getattr_static(base.BasePool, "info"), property)
    assert isinstance(inspect.getattr_static(base.BasePool, "body_can_be_buffer"), bool)
    assert isinstance(inspect.getattr_static(base.BasePool, "signal_safe"), bool)
    pool = TaskPool(7, app=app, timeout=None)
    assert (pool.limit, pool.options, pool.app) == (7, {"timeout": None}, app)
    assert (pool.info["max-concurrency"], pool.info["in-flight"]) == (7, 0)
    # The lines the pool logs as Celery's tracer would, with the context it gives them.
    keys = re.compile(r"%\((\w+)\)s")
    assert set(keys.findall(trace.LOG_SUCCESS)) == {"name", "id", "runtime", "return_value"}
    assert set(keys.findall(trace.LOG_FAILURE)) == {"name", "id", "description", "exc"}
    assert trace.logger.name == "celery.app.trace"
    # A task's own time limits, which the pool refuses (loop_pool.refuse_time_limits).
    assert celery_task.Task.time_limit is None
    assert celery_task.Task.soft_time_limit is None
    assert isinstance(EX_USAGE, int)
