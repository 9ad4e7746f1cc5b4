"""`agenttest-submit resume RUN`: finish a run whose conversations stopped (an outage).

Every conversation not yet done is started again at the turn it is waiting for (the
turn guard makes anything already recorded a no-op). A conversation that was waiting
for a person is asked again at a terminal; without one, its on_missing_input decides.
A run whose conversations all finished but whose aggregation was lost (or died half
way) is aggregated. A run its submitter left half stored (killed while storing it) is
closed first: cancelled with the reason, its unfinished conversations end as skipped.
Embedded, resume then prints the console report and exits like a run: 0 when nothing
failed, 1 when a case failed. A run still moving is not resumed (`still_moving`): resume
says why and exits 0, as for a run still being stored.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

from agenttest_submit.cli.stopping import run_async
from agenttest_submit.cli.terminal import color_wanted
from agenttest_submit.run.driving import driven_by
from agenttest_submit.run.embedded import drive
from agenttest_submit.run.progress import Progress
from agenttest_worker.report import aggregate, build_report, printable, render
from agenttest_worker.settings import get_settings
from agenttest_worker.store import RunRow, recovery, results, runs


def unfinished(url: str, run_id: str) -> list[tuple[str, int]]:
    """(case_id, next_turn) of the conversations that can run on: not started or mid-way."""
    return [
        *results.iter_case_ids(url, run_id, "pending"),
        *results.iter_case_ids(url, run_id, "ready"),
    ]


def waiting_for_a_person(url: str, run_id: str) -> list[tuple[str, int]]:
    return list(results.iter_case_ids(url, run_id, "awaiting_human"))


def still_moving(url: str, run_id: str) -> str | None:
    """Why the run must not be resumed now, if something is still running it.

    Resuming a run that is still moving plays its conversations a second time at once,
    calling their agents twice (the turn guard keeps one of each result, but both calls
    were made). Embedded, the process running the run holds its lock (driving.py): an
    answer that is exact and immediate, so a run stopped a moment ago resumes at once.
    On a fleet, workers move the run: it is moving while any conversation moved within
    AGENTTEST_STALL_SECONDS, the sweeper's rule (a turn waiting on an agent counts as
    moving, fleet/liveness.py); once nothing has, its messages are presumably lost and
    the sweeper would re-enqueue them itself.
    """
    pid = driven_by(run_id)
    if pid is not None:
        return f"process {pid if pid > 0 else '?'} on this machine is running it"
    settings = get_settings()
    stall = settings.stall_seconds
    if settings.distributed and recovery.moved_within(url, run_id, stall):
        return (
            f"a conversation moved in the last {stall:g} s (AGENTTEST_STALL_SECONDS), so "
            f"workers are running it. {_when_resumable(url, run_id, stall)} The turns of a "
            "worker that died come back by themselves: at once on RabbitMQ, within "
            f"{settings.worker_gone_seconds:g} s on Redis (AGENTTEST_WORKER_GONE_SECONDS)"
        )
    return None


def _when_resumable(url: str, run_id: str, stall: float) -> str:
    """When `resume` will accept the run if nothing moves meanwhile, said for the user."""
    moved = recovery.last_moved(url, run_id)
    if moved is None:
        return ""
    at = moved + timedelta(seconds=stall)
    wait = max((at - datetime.now(UTC)).total_seconds(), 0)
    return (
        f"It accepts once nothing has moved for that long: at {at:%H:%M:%S} UTC (in "
        f"{wait:.0f} s) if nothing moves meanwhile, when the workers' sweepers also "
        "re-enqueue what is left."
    )


def resume_run(url: str, run: RunRow, parallel: int) -> int:
    """Finish `run` (see the module's docstring); the exit code."""
    if run.status == "done":
        print(f"run {run.id} is complete; nothing to resume", file=sys.stderr)
        return 0
    if run.status == "pending":
        # Still being stored, or left half stored by a submitter that died: only the
        # latter (nothing stored or moved for the stall period) is closed and finished.
        stall = get_settings().stall_seconds
        if not recovery.close_abandoned_runs(url, stall, run.id):
            print(
                f"run {run.id} is still being stored (something moved in the last "
                f"{stall:g} s); if its submitter is gone, resume it after "
                "AGENTTEST_STALL_SECONDS",
                file=sys.stderr,
            )
            return 0
        closed = runs.get_run(url, run.id)
        assert closed is not None
        run = closed
        print(f"run {run.id}: closed, {printable(run.cancel_reason or '')}", file=sys.stderr)
    if (moving := still_moving(url, run.id)) is not None:
        print(f"run {run.id} is still moving: {moving}; nothing resumed", file=sys.stderr)
        return 0
    pending = unfinished(url, run.id)
    parked = waiting_for_a_person(url, run.id)
    count = len(pending) + len(parked)
    print(f"run {run.id}: resuming {count} unfinished conversation(s)", file=sys.stderr)
    if get_settings().distributed:
        from agenttest_worker.fleet import enqueue_turns  # Celery, only distributed

        # Conversations parked for a person stay parked: `agenttest-submit` waiting on
        # the run with --interactive answers them.
        enqueue_turns(run.id, list(pending))
    elif count:
        progress = Progress(count)
        run_async(
            drive(
                url,
                run.id,
                [*pending, *parked],
                parallel,
                progress,
                parked={case_id for case_id, _ in parked},
                ask=sys.stdin.isatty(),
            )
        )
        progress.close()
    current = runs.get_run(url, run.id)
    if current is None or current.finished_cases < current.total_cases:
        return 0
    if get_settings().distributed:
        from agenttest_worker.fleet import enqueue_aggregate  # Celery, only distributed

        enqueue_aggregate(run.id)
        return 0
    # Whoever claimed the aggregation before is gone: that is why we are resuming.
    aggregate(url, run.id, lease_seconds=0)
    report = build_report(url, run.id, color=color_wanted(sys.stdout))
    sys.stdout.write(render("console", report))
    return 1 if report.summary().run_failed else 0
