"""`agenttest-submit resume RUN`: finish a run whose conversations stopped (an outage).

Every conversation not yet done is started again at the turn it is waiting for (the
turn guard makes anything already recorded a no-op); a run whose conversations all
finished but whose aggregation was lost is aggregated.
"""

from __future__ import annotations

import asyncio
import sys

from agenttest_submit.progress import Progress
from agenttest_worker.aggregate import aggregate
from agenttest_worker.settings import get_settings
from agenttest_worker.store import repo
from agenttest_worker.store.models import RunRow


def unfinished(url: str, run_id: str) -> list[tuple[str, int]]:
    return [
        *repo.iter_case_ids(url, run_id, "pending"),
        *repo.iter_case_ids(url, run_id, "ready"),
    ]


def resume_run(url: str, run: RunRow, parallel: int) -> int:
    if run.status == "done":
        print(f"run {run.id} is complete; nothing to resume", file=sys.stderr)
        return 0
    pending = unfinished(url, run.id)
    print(f"run {run.id}: resuming {len(pending)} unfinished conversation(s)", file=sys.stderr)
    if get_settings().distributed:
        from agenttest_worker.tasks import turn

        for case_id, next_turn in pending:
            turn.apply_async((run.id, case_id, next_turn))
    elif pending:
        from agenttest_submit.runner import drive

        progress = Progress(len(pending))
        asyncio.run(drive(url, run.id, pending, parallel, progress))
        progress.close()
    current = repo.get_run(url, run.id)
    if current is not None and current.finished_cases >= current.total_cases:
        if get_settings().distributed:
            from agenttest_worker.tasks import aggregate_run

            aggregate_run.apply_async((run.id,))
        else:
            aggregate(url, run.id)
    return 0
