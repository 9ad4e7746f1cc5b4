"""Receiving agents' spans where conversations are played: agenttest-submit's embedded
run and each worker serve an OTLP/HTTP receiver on AGENTTEST_OTLP_RECEIVER_PORT
(observe/span_receiver.py), and keep in the store the spans of runs in progress.

Whose a span is, is read from its trace id: a conversation's trace id starts with its
run's prefix (observe/tracing.py `run_trace_prefix`); the runs in progress are asked
of the store at most four times a second, when a span names a prefix not yet known. The
spans of any other trace are refused (counted in the reply's `partialSuccess`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from agenttest_worker.observe.received_spans import AgentSpan, SpanReader
from agenttest_worker.observe.tracing import run_trace_prefix
from agenttest_worker.settings import get_settings

if TYPE_CHECKING:
    from agenttest_worker.observe.span_receiver import SpanReceiver

log = logging.getLogger(__name__)

_REFRESH_SECONDS = 0.25


class SpanIntake:
    """Keeps the spans of the runs in progress in the store at `url`."""

    def __init__(self, url: str, expected: Iterable[str] = ()) -> None:
        self.url = url
        self._expected = {run_trace_prefix(run_id): run_id for run_id in expected}
        self._runs = dict(self._expected)
        self._checked = 0.0
        self._lock = threading.Lock()

    def __call__(self, spans: list[AgentSpan]) -> int:
        # The store's module is imported here: importing the driver imports no SQLAlchemy.
        from agenttest_worker.store.sql.agent_spans import keep_spans

        traces: dict[str, list[AgentSpan]] = {}
        for span in spans:
            traces.setdefault(span.trace_id, []).append(span)
        kept = 0
        for trace_id, group in traces.items():
            run_id = self._run_of(trace_id[:16])
            if run_id is not None:
                kept += keep_spans(self.url, run_id, trace_id, group)
        return kept

    def _run_of(self, prefix: str) -> str | None:
        from agenttest_worker.store.sql.agent_spans import runs_in_progress

        with self._lock:
            if prefix not in self._runs and time.monotonic() - self._checked >= _REFRESH_SECONDS:
                self._checked = time.monotonic()
                found = {run_trace_prefix(run_id): run_id for run_id in runs_in_progress(self.url)}
                self._runs = {**found, **self._expected}
            return self._runs.get(prefix)


def receive_spans(url: str, expected: Iterable[str] = ()) -> SpanReceiver | None:
    """The receiver serving on AGENTTEST_OTLP_RECEIVER_PORT, started; None when unset.
    OSError when the port cannot be listened on."""
    settings = get_settings()
    if settings.otlp_receiver_port is None:
        return None
    # aiohttp's server is imported only by a process that receives.
    from agenttest_worker.observe.span_receiver import SpanReceiver

    receiver = SpanReceiver(
        SpanIntake(url, expected), settings.otlp_receiver_host, settings.otlp_receiver_port
    )
    receiver.start()
    log.info("receiving OTLP spans on %s:%s", receiver.host, receiver.port)
    return receiver


def stored_spans(url: str) -> SpanReader:
    """Where trace assertions read received spans: the store (any worker's receiver)."""
    from agenttest_worker.store.sql.agent_spans import StoredSpans

    return StoredSpans(url)
