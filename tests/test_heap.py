"""The C heap's free pages go back to the system (agenttest_worker/heap.py).

A worker's pool trims its heap every few seconds (fleet/loop_pool.py): these tests show,
in a process of their own, that a trim gives back pages freed inside the heap (which
glibc alone keeps), and that the trimming thread trims until it is stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

from agenttest_worker.heap import HeapTrimmer, heap_free_bytes, trim_heap

# 40,000 bodies of 2 KB (C-heap allocations, like reply texts), of which one in 40 stays:
# the heap cannot shrink from its top, so what was freed stays resident until trimmed.
FRAGMENTED = textwrap.dedent(
    """
    import json
    from agenttest_worker.heap import heap_free_bytes, trim_heap

    def resident_kb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4

    bodies = [bytes(2048) + str(i).encode() for i in range(40_000)]
    kept = bodies[::40]
    del bodies
    before, free = resident_kb(), heap_free_bytes()
    trimmed = trim_heap()
    print(json.dumps({"trimmed": trimmed, "free": free, "before": before, "after": resident_kb()}))
    """
)


def test_a_trim_gives_back_the_pages_freed_inside_the_heap() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True
    )
    figures = json.loads(done.stdout)
    assert figures["trimmed"] is True  # glibc, as on every machine this project targets
    assert figures["free"] > 70 << 20  # what the trimmer looks at before trimming
    # ~80 MB were allocated and ~78 MB freed: most of it leaves the resident set.
    assert figures["before"] - figures["after"] > 40_000, figures


def test_the_trimmer_trims_until_it_is_stopped() -> None:
    trimmer = HeapTrimmer(interval=0.02, when_free=0)
    assert trimmer.start()
    assert not trimmer.start()  # one thread per trimmer
    deadline = time.monotonic() + 10
    while trimmer.trims < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert trimmer.trims >= 3
    trimmer.stop()
    stopped_at = trimmer.trims
    time.sleep(0.1)
    assert trimmer.trims == stopped_at
    # A pool started again trims again.
    assert trimmer.start()
    deadline = time.monotonic() + 10
    while trimmer.trims == stopped_at and time.monotonic() < deadline:
        time.sleep(0.01)
    trimmer.stop()
    assert trimmer.trims > stopped_at


def test_the_trimmer_leaves_a_heap_with_little_free_alone() -> None:
    """A busy worker's heap keeps a few MB free that it reuses at once: no trim then."""
    trimmer = HeapTrimmer(interval=0.01, when_free=1 << 40)
    assert trimmer.start()
    time.sleep(0.2)
    trimmer.stop()
    assert trimmer.trims == 0


def test_a_trim_can_be_asked_for_at_any_time() -> None:
    assert trim_heap() is True
    assert trim_heap() is True
    free = heap_free_bytes()
    assert free is not None and free >= 0
