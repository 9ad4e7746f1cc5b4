"""What a provider's reply says of its rate limits: how long to wait after a 429, and
whether a limit is spent until some reset.

Read on every reply, 2xx or not (agents/http/transport.py):

- `retry-after-ms` (milliseconds, as OpenAI sends) or else `retry-after` (seconds or
  an HTTP date): how long to wait before calling again;
- OpenAI's `x-ratelimit-remaining-requests` / `-tokens` with `x-ratelimit-reset-requests`
  / `-tokens`, durations written as Go writes them (`1s`, `6m0s`, `20ms`, `1h2m3.5s`),
  counted from when the request was sent: the provider takes its count as a request
  arrives, and a reply that took seconds to write would otherwise make the wait seconds
  too long;
- Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining`
  with `-reset`, an RFC 3339 time.

A limit whose remaining count is 0 is spent: `exhausted_for` is the longest wait until
one of the spent limits resets. The requests still allowed (the fewest the provider's
request limits report) and when they are all back are kept too: the calls already on
their way may spend what remains before they arrive (agents/http/transport.py). A header that
cannot be read counts as absent: a reply is never failed over how its rate-limit headers
are written. `x-ratelimit-limit-requests` / `anthropic-ratelimit-requests-limit` (how
many requests the limit allows at most) bounds how far a learned limit grows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from time import time

from agenttest_worker.agents.limits.retry import parse_retry_after

_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "retry-after")
# Go's time.Duration text, which OpenAI's reset headers use: "1s", "6m0s", "20ms", "1h2m3.5s".
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|us|µs|ns|m|s)")
_UNIT_SECONDS = {
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "ns": 1e-9,
}
# The limits each provider reports: the part of the header's name between its prefix
# and "-remaining"/"-reset" (OpenAI writes the kind last: x-ratelimit-remaining-requests).
_OPENAI_KINDS = ("requests", "tokens")
_ANTHROPIC_KINDS = ("requests", "tokens", "input-tokens", "output-tokens")


@dataclass(frozen=True, slots=True)
class ProviderLimits:
    """What one reply's headers say. None: the reply did not say (or said it unreadably)."""

    retry_after: float | None = None
    exhausted_for: float | None = None
    # The requests the provider still allows now, and the seconds until all are back.
    requests_remaining: int | None = None
    requests_reset: float | None = None
    # The most requests the provider's request limit allows.
    requests_limit: int | None = None


NOTHING = ProviderLimits()


def parse_duration(text: str) -> float | None:
    """Seconds in a Go duration (`6m0s`, `20ms`) or a bare number of seconds; None when
    it is neither."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    total, position = 0.0, 0
    for part in _DURATION_PART.finditer(text):
        if part.start() != position:
            return None
        total += float(part.group(1)) * _UNIT_SECONDS[part.group(2)]
        position = part.end()
    return total if position == len(text) and position > 0 else None


def seconds_until(text: str, now: float | None = None) -> float | None:
    """Seconds from now to an RFC 3339 time (`2026-12-07T21:30:05Z`), at least 0; None
    when it is not one."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if when.tzinfo is None:  # RFC 3339 always has a zone; one without is not trusted
        return None
    return max(0.0, when.timestamp() - (time() if now is None else now))


def read_provider_limits(
    headers: Mapping[str, str], now: float | None = None, sent_ago: float = 0.0
) -> ProviderLimits:
    """The rate-limit headers of one reply (any capitalisation), to a request sent
    `sent_ago` seconds ago."""
    found: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith(_PREFIXES):
            found[lower] = value
    if not found:
        return NOTHING
    retry_after: float | None = None
    if "retry-after-ms" in found:
        millis = parse_duration(found["retry-after-ms"])
        retry_after = millis / 1000 if millis is not None else None
    if retry_after is None and "retry-after" in found:
        retry_after = parse_retry_after({"retry-after": found["retry-after"]}, now)
    # (kind, remaining, seconds until reset) of every limit the reply reports readably.
    limits: list[tuple[str, float, float]] = []
    for kind in _OPENAI_KINDS:
        remaining = _count(found.get(f"x-ratelimit-remaining-{kind}"))
        reset = parse_duration(found.get(f"x-ratelimit-reset-{kind}", ""))
        if remaining is not None and reset is not None:
            limits.append((kind, remaining, max(0.0, reset - sent_ago)))
    for kind in _ANTHROPIC_KINDS:
        remaining = _count(found.get(f"anthropic-ratelimit-{kind}-remaining"))
        reset = seconds_until(found.get(f"anthropic-ratelimit-{kind}-reset", ""), now)
        if remaining is not None and reset is not None:
            limits.append((kind, remaining, reset))
    spent = [reset for _, remaining, reset in limits if remaining <= 0]
    requests = [(remaining, reset) for kind, remaining, reset in limits if kind == "requests"]
    fewest = min(requests) if requests else None
    most = [
        _count(found.get(name))
        for name in ("x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit")
    ]
    stated = [int(count) for count in most if count is not None and count >= 1]
    return ProviderLimits(
        retry_after,
        max(spent) if spent else None,
        int(fewest[0]) if fewest is not None else None,
        fewest[1] if fewest is not None else None,
        min(stated) if stated else None,
    )


def _count(remaining: str | None) -> float | None:
    if remaining is None:
        return None
    try:
        count = float(remaining.strip())
    except ValueError:
        return None
    return count if math.isfinite(count) else None
