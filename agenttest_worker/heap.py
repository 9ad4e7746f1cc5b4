"""Garbage collection tuned once start-up is over.

A run allocates many short-lived objects (models, JSON documents, requests). With
CPython's default thresholds the cyclic collector runs every 700 net allocations, and
each of its full passes walks every object the imported libraries (pydantic,
SQLAlchemy, aiohttp, Celery) created at import time, none of which will ever be
garbage. Measured on the embedded benchmark, collection was about a tenth of the run.

So, after start-up: move everything alive into the permanent generation (`gc.freeze`,
never scanned again) and collect the young generation less often. Cycles are still
collected; memory holds what they pin a little longer.
"""

from __future__ import annotations

import gc

# Young-generation threshold: allocations (net) between collections; the older
# generations keep CPython's ratios.
YOUNG_THRESHOLD = 20_000

# An embedded run (the conversations in the submitter's process): what a run keeps
# (its records, the rows waiting for the next write, the store's imports made on a
# thread meanwhile) survives every young collection, which so walked it for nothing:
# ~4% of a 1,000-case run's CPU at 20,000. Cyclic garbage waits at most this many
# allocations longer.
EMBEDDED_YOUNG_THRESHOLD = 100_000

_settled = False


def _collect_young_less_often(threshold: int = YOUNG_THRESHOLD) -> None:
    _, middle, old = gc.get_threshold()
    gc.set_threshold(threshold, middle, old)


def starting() -> None:
    """Before start-up's imports: they allocate much and free little, so collecting
    during them is wasted work; `settle` then freezes what they built."""
    if not _settled:
        _collect_young_less_often()


def settle(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Freeze what start-up created and collect less often (idempotent)."""
    global _settled
    if _settled:
        return
    _settled = True
    gc.freeze()
    _collect_young_less_often(young_threshold)
