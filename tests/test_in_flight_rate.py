"""benchmarks/in_flight.py's rate over a run's middle: Little's law, so that turns saved
in waves (every conversation in step) are not misread by where the window's ends fall."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.in_flight import rate_within


def waves(conversations: int, turns: int, latency: float, gap: float) -> list[tuple[float, float]]:
    """Every conversation's turns in step: each takes `latency`, the next starts `gap`
    later (the save and the next message)."""
    spans = []
    for turn in range(turns):
        start = turn * (latency + gap)
        spans += [(start + i * 1e-4, start + latency + i * 1e-4) for i in range(conversations)]
    return spans


def test_turns_in_waves_give_the_rate_their_cycle_allows_wherever_the_window_falls() -> None:
    spans = waves(3000, 4, latency=20.0, gap=1.0)
    allowed = 3000 / 21.0
    first = min(end for _, end in spans)
    last = max(end for _, end in spans)
    # The benchmark's window: one latency after the first save to one before the last.
    low, high = first + 20.0, last - 20.0
    saved_inside = sum(1 for _, end in spans if low <= end <= high)
    assert saved_inside / (high - low) > 1.3 * allowed  # what counting rows read
    for shift in (0.0, 3.0, 7.5):
        assert abs(rate_within(spans, low + shift, high) - allowed) / allowed < 0.06


def test_a_steady_stream_gives_its_rate() -> None:
    # 100 turns/s, each taking 5 s, for 100 s.
    spans = [(i / 100, i / 100 + 5.0) for i in range(10_000)]
    assert abs(rate_within(spans, 20.0, 80.0) - 100.0) < 0.5
