"""Memory management for a run: garbage collection tuned once start-up is over, and
the C heap's free pages given back on a worker (HeapTrimmer, below).

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

import functools
import gc
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes

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


# -- the C heap ----------------------------------------------------------------------
#
# Objects over 512 bytes (dicts of many keys, JSON texts, reply bodies) come from the C
# allocator, not from Python's own. glibc's keeps what is freed for reuse and returns
# memory to the system only from the top of a heap, so a worker that held 10,000 turns
# in flight and moved on keeps tens of MB of free pages resident: measured on
# `benchmarks.in_flight --in-flight 10000 --latency-s 40 --turns 3`, 52 MB of the heap
# was free when the run's aggregation grew it by 28 MB more (RESULTS.md). malloc_trim
# returns the free pages inside a heap too; ctypes lets go of the interpreter lock while
# it runs.

TRIM_INTERVAL = 2.0  # seconds between looks at the heap in a worker

# A trim only when this much of the heap is free: a busy worker's heap keeps a few MB
# free that it reuses at once, and pages given back are faulted in again when reused.
TRIM_WHEN_FREE = 16 << 20


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (2.33 or later: mallinfo2), else None
    (musl, macOS: nothing here then). Looked up at the first use, not at import: the
    submitter imports this module first thing, and only a worker's pool trims."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallinfo2.argtypes = []
        libc.mallinfo2.restype = MallInfo2
    except (AttributeError, OSError):
        return None
    return libc


def heap_free_bytes() -> int | None:
    """Bytes the C heap holds free (resident or already given back), or None where the
    C library does not say."""
    libc = _glibc()
    if libc is None:
        return None
    return int(libc.mallinfo2().fordblks)


def trim_heap() -> bool:
    """Return the C heap's free pages to the system; False where the C library cannot."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


class HeapTrimmer:
    """A thread that trims the C heap every `interval` seconds, when at least
    `when_free` bytes of it are free, until stopped.

    On a thread of its own rather than on a worker's event loop: a trim walks the whole
    heap (up to ~8 ms at 100 MB), and the loop must not wait for it. Looking costs
    ~0.1 ms (mallinfo2).
    """

    def __init__(self, interval: float = TRIM_INTERVAL, when_free: int = TRIM_WHEN_FREE) -> None:
        self.interval = interval
        self.when_free = when_free
        self.trims = 0  # trims made (looks that found less free are not counted)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start trimming (again, after a stop); False (and no new thread) where the C
        library cannot, or while it trims already."""
        if _glibc() is None or (self._thread is not None and self._thread.is_alive()):
            return False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agenttest-heap", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            free = heap_free_bytes()
            if free is not None and free >= self.when_free and trim_heap():
                self.trims += 1
