"""`agenttest-submit prune --older-than D [--suite S] [--keep-last N] [--dry-run]`.

Removes the runs that have ended and were created longer ago than D, with all their
rows (store/sql/pruning.py: a batch at a time, never a run still under way), and
prints each run it removed with its rows, then the total. `--keep-last N` keeps the
newest N runs of each suite however old (what `diff` and `history` compare with);
`--dry-run` lists the runs without removing anything.
"""

from __future__ import annotations

from agenttest_submit.cli.request import PruneRequest
from agenttest_worker.durations import format_duration
from agenttest_worker.report import printable
from agenttest_worker.store import pruning


def _age(seconds: float) -> str:
    """An age as it was likely written: 30d, 12h, else as durations are shown."""
    for unit, size in (("d", 86400), ("h", 3600)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return format_duration(seconds)


def prune(url: str, request: PruneRequest) -> int:
    found = pruning.prunable_runs(url, request.older_than, request.suite, request.keep_last)
    age = _age(request.older_than)
    if not found:
        print(f"no run that has ended is older than {age}: nothing to remove")
        return 0
    verb = "would remove" if request.dry_run else "removed"
    total_rows = 0
    for run in found:
        line = (
            f"{run.id}  {run.created_at:%Y-%m-%d %H:%M}  {printable(run.suite or '-')}  "
            f"{run.total_cases} case(s), {run.total_turns} turn(s)"
        )
        if request.dry_run:
            print(f"{verb} {line}", flush=True)
            continue
        removed = pruning.prune_run(url, run.id)
        rows = sum(removed.values())
        total_rows += rows
        print(f"{verb} {line}: {rows} row(s)", flush=True)
    tail = "" if request.dry_run else f", {total_rows} row(s)"
    print(f"{verb} {len(found)} run(s) older than {age}{tail}")
    return 0
