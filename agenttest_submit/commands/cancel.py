"""`agenttest-submit cancel RUN [--reason TEXT]`: stop a run that is under way.

The run is marked cancelled in the store (`runs.cancel_run`, the mark --fail-fast and
the budgets already set): no new turn of it starts, and each of its conversations ends
skipped with the reason at its next step, which its report shows ("Not run: N
(REASON)"). Turns in flight are cut short rather than recorded after the cancel:

- on a fleet, the workers are told over the broker (fleet/cancel_command.py), and a
  run capped by --parallel has its unstarted conversations started, to end skipped;
- embedded, the process driving the run (run/driving.py) sees the mark within a
  second (embedded.py) and cuts them itself; a run whose process is gone is ended
  here: every conversation left is skipped without calling any agent, and the run
  aggregated.

Ctrl-C twice on a submitter watching a fleet run does the same (distributed.py).
"""

from __future__ import annotations

import sys

from agenttest_submit.cli.stopping import run_async
from agenttest_submit.run.driving import driven_by
from agenttest_submit.run.embedded import drive
from agenttest_submit.run.progress import Progress
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import aggregate, printable
from agenttest_worker.settings import get_settings
from agenttest_worker.store import RunRow, results, runs


def default_reason() -> str:
    return f"cancelled by {runs.submitted_by()}"


def cancel_everywhere(url: str, run_id: str, reason: str) -> bool:
    """Mark the run cancelled and cut its turns in flight on the fleet; False when it
    was cancelled already (by someone else, --fail-fast or a budget)."""
    marked = runs.cancel_run(url, run_id, reason)
    if get_settings().distributed:
        # Celery: only here.
        from agenttest_worker.fleet import broadcast_cancel, enqueue_starts, enqueue_turns

        broadcast_cancel(run_id)
        # Conversations parked for a person would wait for an answer for ever.
        if parked := runs.release_parked(url, run_id):
            enqueue_turns(run_id, parked)
        # A run capped by --parallel: the rest are claimed at once (the run is
        # cancelled), each to end skipped at its first step.
        starts = runs.claim_starts(url, run_id)
        if starts is not None:
            enqueue_starts(run_id, *starts)
    return marked


def cancel_run(url: str, run: RunRow, reason: str | None) -> int:
    """`cancel RUN`: the exit code (2 for a run that has ended)."""
    if run.status in ("aggregating", "done"):
        raise InputError(
            InputProblem(f"run {run.id} has ended ({run.status}): nothing to cancel", field="RUN")
        )
    why = reason or default_reason()
    if not cancel_everywhere(url, run.id, why):
        current = runs.get_run(url, run.id)
        said = printable((current.cancel_reason if current else None) or "")
        print(f"run {run.id} was cancelled already: {said}", file=sys.stderr)
    else:
        print(f"run {run.id}: cancelled ({printable(why)})", file=sys.stderr)
    if get_settings().distributed:
        print(
            f"its conversations end skipped as the workers reach them; "
            f"agenttest-submit status {run.id}",
            file=sys.stderr,
        )
        return 0
    pid = driven_by(run.id)
    if pid is not None:
        print(
            f"process {pid if pid > 0 else '?'} on this machine is running it: it stops its "
            "turns in flight and ends the rest skipped",
            file=sys.stderr,
        )
        return 0
    if run.status == "pending":
        return 0  # still being stored by its submitter, which stops at its first step
    _end_here(url, run.id)
    return 0


def _end_here(url: str, run_id: str) -> None:
    """An embedded run nobody drives: its conversations left end skipped (no agent is
    called: the run is cancelled), then it is aggregated."""
    left = [
        *results.iter_case_ids(url, run_id, "pending"),
        *results.iter_case_ids(url, run_id, "ready"),
    ]
    parked = list(results.iter_case_ids(url, run_id, "awaiting_human"))
    if left or parked:
        progress = Progress(len(left) + len(parked))
        run_async(
            drive(
                url,
                run_id,
                [*left, *parked],
                10,
                progress,
                parked={case_id for case_id, _ in parked},
                ask=False,
            )
        )
        progress.close()
    current = runs.get_run(url, run_id)
    if current is not None and current.finished_cases >= current.total_cases:
        # Whoever claimed the aggregation before is gone with the process.
        aggregate(url, run_id, lease_seconds=0)
        print(
            f"run {run_id}: {current.passed} passed, {current.failed} failed, "
            f"{current.skipped} skipped; agenttest-submit report {run_id}",
            file=sys.stderr,
        )
