"""Durations as users write them: "5m", "30s", "1h30m", "250ms", "30d", or a number of
seconds."""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
# Days for what is measured in them: how old a run is before `prune` removes it.
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str | float | int) -> float:
    """Seconds in `value`. Raises ValueError with the accepted forms on bad input."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(
                    f"{value!r} is not a duration (write e.g. 30s, 5m, 1h30m, 250ms or seconds)"
                ) from None
    if seconds <= 0:
        raise ValueError(f"{value!r}: a duration must be positive")
    return seconds


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:g}s"
    minutes, secs = divmod(seconds, 60)
    return f"{int(minutes)}m{secs:g}s" if secs else f"{int(minutes)}m"
