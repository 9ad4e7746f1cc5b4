"""Where a worker's CPU goes per turn: a py-spy profile, summed into the README's shares.

    # a worker busy with a long run (e.g. `benchmarks.throughput --only agenttest
    # --conversations 4000`), sampled for 8 s while it holds the GIL:
    python -m benchmarks.profile_shares --pid PID --seconds 8
    python -m benchmarks.profile_shares --raw profile.txt   # a py-spy `--format raw` file

py-spy is not a dependency of agenttest (`pip install py-spy` to record). Each sampled
stack is counted once, in the first category below whose markers it contains: the
order matters, since every stack of a turn passes through Celery's task frames and
agenttest's task function.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

# (category, markers in a stack's frames); first match wins. A marker starting with "!"
# excludes: the category matches a stack holding one of its other markers in a frame
# that holds none of its excluded ones.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    (
        "publishing the next turn (fleet/publish.py; apply_async off Redis)",
        ("fleet/publish.py", "apply_async", "send_task"),
    ),
    ("kombu: receiving messages, unacked bookkeeping, acks", ("kombu/", "fleet/transport.py")),
    (
        "store: the turn's read and write (psycopg, SQLAlchemy pool)",
        (
            "agenttest_worker/store",
            "psycopg",
            "sqlalchemy",
        ),
    ),
    ("agent call: aiohttp", ("aiohttp",)),
    ("agent call: agenttest's client and transport", ("agenttest_worker/agents",)),
    # The tracer the loop pool runs for each task it receives, and the consumer's
    # handling of a received task (every stack of the main thread has Celery frames,
    # but kombu's come first above).
    ("Celery: task handling", ("celery/",)),
    # Every turn's coroutine runs under the pool's loop (fleet/loop_pool.py): its own
    # frames count here, the loop's below.
    (
        "turn: engine, assertions, models, task body",
        ("agenttest_worker/", "pydantic", "!agenttest_worker/fleet/loop_pool.py"),
    ),
    ("event loop machinery (the pool's loop: select, callbacks)", ("_run_once", "loop_pool.py")),
    ("pool threads waiting for work (woken, taking the GIL)", ("thread.py",)),
]
OTHER = "other"


def matches(frames: list[str], markers: tuple[str, ...]) -> bool:
    """Whether a frame of `frames` holds one of `markers` and none of the excluded."""
    wanted = [m for m in markers if not m.startswith("!")]
    excluded = [m[1:] for m in markers if m.startswith("!")]
    return any(
        any(m in frame for m in wanted) and not any(x in frame for x in excluded)
        for frame in frames
    )


def shares(raw_lines: list[str]) -> tuple[Counter[str], int]:
    """Samples per category from py-spy raw lines (`frame;frame;... count`)."""
    counts: Counter[str] = Counter()
    total = 0
    for line in raw_lines:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        for name, markers in CATEGORIES:
            if matches(frames, markers):
                counts[name] += count
                break
        else:
            counts[OTHER] += count
    return counts, total


def record(pid: int, seconds: float, rate: int) -> list[str]:
    # On PATH, or installed beside this interpreter (a virtualenv not activated).
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        raise SystemExit("py-spy is not installed here: pip install py-spy")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.txt"
        command = [spy, "record", "--pid", str(pid), "--gil", "--nonblocking"]
        command += ["--format", "raw", "--duration", str(int(seconds)), "--rate", str(rate)]
        subprocess.run([*command, "-o", str(out)], check=True)
        return out.read_text().splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--pid", type=int, help="a running worker process to sample")
    source.add_argument("--raw", type=Path, help="a py-spy `--format raw` file")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    args = parser.parse_args()
    if args.raw:
        lines = args.raw.read_text().splitlines()
    else:
        lines = record(args.pid, args.seconds, args.rate)
    counts, total = shares(lines)
    if not total:
        raise SystemExit("no samples: was the worker busy while it was sampled?")
    print(f"where the worker held the GIL, {total} samples:")
    for name, count in counts.most_common():
        print(f"  {100 * count / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
