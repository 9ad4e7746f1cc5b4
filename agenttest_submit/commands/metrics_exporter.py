"""`agenttest-submit metrics --port P`: the fleet's progress for Prometheus, from one place.

Workers export what they do (agenttest_worker/observe/metrics.py); what the fleet as a
whole is doing is read here instead, so that every worker does not report the same
gauge: how far each run still going is (its cases finished by status out of its total,
turns, tokens and cost so far), and how many messages wait in the broker's queue
(AGENTTEST_QUEUE, a passive declare's message count, on any broker) or, on Redis, are
held, unacknowledged, by workers.

Everything is read when Prometheus scrapes, from the store (one query over the runs
table) and the broker, so the numbers are never staler than the scrape. Runs
label the run metrics, and only runs pending or running do: a finished run's series
end with it, so the number of series stays that of the runs under way. A source that
cannot be read is said by `agenttest_exporter_up{source}` = 0 (and a log line), and the
other source's metrics are still served.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

from agenttest_submit.cli.request import MetricsRequest
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.observe import MetricsEndpoint, serve_metrics
from agenttest_worker.settings import get_settings

log = logging.getLogger("agenttest.metrics")

# The runs whose progress is exported: those a fleet is still storing or playing.
LIVE_STATUSES = ("pending", "running")


class FleetCollector:
    """A prometheus_client collector reading the store and the broker at each scrape."""

    def __init__(self, database_url: str, broker_url: str | None, queue: str) -> None:
        self.database_url = database_url
        self.broker_url = broker_url
        self.queue = queue
        # The HTTP server answers each scrape on a thread of its own: one read at a time.
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily(
            "agenttest_exporter_up",
            "1 when the last scrape could read the source (store, broker), else 0",
            labels=["source"],
        )
        with self._lock:
            try:
                yield from self._runs()
                up.add_metric(["store"], 1)
            except Exception as exc:
                log.warning("cannot read the store: %s", _said(exc, self.database_url))
                up.add_metric(["store"], 0)
            if self.broker_url:
                try:
                    yield from self._queues()
                    up.add_metric(["broker"], 1)
                except Exception as exc:
                    log.warning("cannot read the broker: %s", _said(exc, self.broker_url))
                    up.add_metric(["broker"], 0)
        yield up

    def _runs(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily
        from sqlalchemy import select

        from agenttest_worker.store import RunRow, session_scope, usage

        columns = (
            RunRow.id,
            RunRow.status,
            RunRow.suite,
            RunRow.agent,
            RunRow.total_cases,
            RunRow.passed,
            RunRow.failed,
            RunRow.skipped,
            RunRow.total_turns,
            RunRow.total_tokens,
            RunRow.total_cost,
            RunRow.usage,
            RunRow.started_at,
        )
        with session_scope(self.database_url) as session:
            rows = session.execute(select(*columns).where(RunRow.status.in_(LIVE_STATUSES))).all()

        def family(name: str, text: str, labels: tuple[str, ...] = ("run",)) -> Any:
            return GaugeMetricFamily(name, text, labels=list(labels))

        runs = family("agenttest_runs", "Runs pending or running, by status", ("status",))
        info = family(
            "agenttest_run_info",
            "A run under way (always 1), with its suite, target agent and status",
            ("run", "suite", "agent", "status"),
        )
        total = family("agenttest_run_cases", "Cases of a run under way (0 while pending)")
        finished = family(
            "agenttest_run_cases_finished",
            "Cases of a run under way that ended, by status",
            ("run", "status"),
        )
        turns = family("agenttest_run_turns", "Turns of the run's ended cases")
        tokens = family("agenttest_run_tokens", "Tokens of the run so far")
        cost = family(
            "agenttest_run_cost", "Cost of the run so far (agents' pricing), budget or not"
        )
        started = family(
            "agenttest_run_started_timestamp_seconds", "When the run started (Unix time)"
        )
        counts = dict.fromkeys(LIVE_STATUSES, 0)
        for row in rows:
            run = row.id
            counts[row.status] = counts.get(row.status, 0) + 1
            info.add_metric([run, row.suite or "", row.agent or "", row.status], 1)
            total.add_metric([run], row.total_cases or 0)
            for status in ("passed", "failed", "skipped"):
                finished.add_metric([run, status], getattr(row, status) or 0)
            turns.add_metric([run], row.total_turns or 0)
            tokens.add_metric([run], row.total_tokens or 0)
            # Whatever its budget: the conversations' cost moves as each ends (per turn
            # under a budget), its generators' is there from the start.
            cost.add_metric([run], usage.run_cost(row.total_cost, row.usage))
            if row.started_at is not None:
                started.add_metric([run], row.started_at.timestamp())
        for status, count in counts.items():
            runs.add_metric([status], count)
        yield from (runs, info, total, finished, turns, tokens, cost, started)

    def _queues(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        # Celery, only where the broker is read (the exporter's own process).
        from agenttest_worker.fleet import app

        waiting = GaugeMetricFamily(
            "agenttest_queue_messages",
            "Messages waiting in the broker's queue (AGENTTEST_QUEUE), every priority",
            labels=["queue"],
        )
        redis = (self.broker_url or "").startswith(("redis://", "rediss://"))
        with (
            app.connection_for_read(self.broker_url) as connection,
            connection.channel() as channel,
        ):
            try:
                count = channel.queue_declare(self.queue, passive=True).message_count
            except connection.channel_errors as exc:
                if "NOT_FOUND" not in str(exc):
                    raise
                count = 0  # not declared yet (or, on Redis, empty): nothing waits
            # Redis only: kombu's Redis transport holds the messages workers took in a
            # hash (its `unacked_key` transport option); an AMQP broker tells this
            # through its management API alone.
            unacked = channel.client.hlen(channel.unacked_key) if redis else None
        waiting.add_metric([self.queue], count)
        yield waiting
        if unacked is not None:
            held = GaugeMetricFamily(
                "agenttest_queue_unacked_messages",
                "Messages workers have taken and not yet acknowledged (turns being played; "
                "Redis brokers only)",
            )
            held.add_metric([], unacked)
            yield held


def _said(exc: BaseException, *urls: str | None) -> str:
    """An error in one line, the secrets of the services' URLs masked (errors.redact):
    a driver's error may quote the URL it could not reach."""
    from agenttest_worker.errors import redact, url_secrets

    hidden = [secret for url in urls if url for secret in url_secrets(url)]
    return redact(" ".join(f"{type(exc).__name__}: {exc}".split())[:300], hidden)


def run_metrics_exporter(request: MetricsRequest) -> int:
    """Serve the fleet's metrics on request.port until Ctrl-C or SIGTERM."""
    from prometheus_client import CollectorRegistry

    settings = get_settings()
    token = request.token if request.token is not None else settings.metrics_token
    endpoint = MetricsEndpoint(request.host, request.port, token)
    refused = endpoint.problem()
    if refused is not None:  # before anything is opened
        raise InputError(
            InputProblem(f"--host {refused} (--token or AGENTTEST_METRICS_TOKEN)", field="--host")
        )
    registry = CollectorRegistry()
    registry.register(
        FleetCollector(settings.effective_database_url(), settings.broker_url, settings.queue)
    )
    logging.basicConfig(level=logging.INFO, format="agenttest-submit metrics: %(message)s")
    try:
        server = serve_metrics(registry, endpoint)
    except OSError as exc:
        from agenttest_submit.commands.viewer.serve import binding_problem

        raise InputError(binding_problem(request.host, request.port, exc)) from None
    where = f"http://{request.host}:{server.port}/metrics"
    auth = " (token required)" if token else ""
    print(
        f"serving fleet metrics on {where}{auth} (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    try:
        threading.Event().wait()
    finally:
        server.close()
    return 0
