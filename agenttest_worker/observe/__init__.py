"""What a worker process tells Prometheus: its turns, agent calls, rate-limit waits,
circuit breakers, redeliveries and sweeps (`metrics`).

Below the agents layer, so that the transport, the rate limiter and the breaker can
count what they do; it imports nothing of the project but the result model, and
prometheus_client only once a worker turns metrics on (fleet/metrics_server.py).
"""

from __future__ import annotations

__all__: list[str] = []
