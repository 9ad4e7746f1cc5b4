"""What a worker process tells Prometheus: its turns, agent calls, rate-limit waits,
circuit breakers, redeliveries and sweeps (`metrics`), and how metrics are served over
HTTP, on loopback or behind a token (`exposition`, which the fleet exporter uses too).

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

__all__ = ["MetricsEndpoint", "MetricsServer", "authorized", "is_loopback", "serve_metrics"]
