"""What a worker process tells Prometheus: its turns, agent calls, rate-limit waits,
circuit breakers, redeliveries and sweeps (`metrics`), and how metrics are served over
HTTP, on loopback or behind a token (`exposition`, which the fleet exporter uses too),
and the traces of conversations (`tracing`: OpenTelemetry, when its extra is installed).

Below the agents layer, so that the transport, the rate limiter and the breaker can
count what they do; it imports nothing of the project but the result model, and
prometheus_client only once a worker turns metrics on (fleet/metrics_server.py).
"""

from __future__ import annotations

from agenttest_worker.observe.exposition import (
    MetricsEndpoint,
    MetricsServer,
    authorized,
    is_loopback,
    serve_metrics,
)
from agenttest_worker.observe.tracing import flush as flush_traces

__all__ = [
    "MetricsEndpoint",
    "MetricsServer",
    "authorized",
    "flush_traces",
    "is_loopback",
    "serve_metrics",
]
