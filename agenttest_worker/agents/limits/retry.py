"""When and how long to wait before calling an agent again.

Connection errors, timeouts, 429 and 5xx are retried with exponential backoff and
jitter (a random wait between half the ceiling and the ceiling, so a fleet of workers
hitting the same agent does not retry in lockstep, yet always backs off), honouring
`Retry-After` when the agent sends one; other 4xx are errors at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from time import time

RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


def is_retryable_status(status: int) -> bool:
    return status in RETRY_STATUSES or 500 <= status < 600


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the agent asked us to wait (`Retry-After`: seconds or an HTTP date)."""
    value = headers.get("Retry-After") or headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        # "nan" and "inf" parse as floats but are no number of seconds to wait.
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        date = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    # HTTP dates are in GMT; a zone-less date ("-0000") is UTC too, not local time.
    when = (date if date.tzinfo is not None else date.replace(tzinfo=UTC)).timestamp()
    return max(0.0, when - (time() if now is None else now))


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 30.0
    # A Retry-After longer than this is not waited out inside one call: the call fails
    # and says so, rather than holding a worker for minutes.
    max_retry_after: float = 120.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        ceiling = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        return random.uniform(ceiling / 2, ceiling)
