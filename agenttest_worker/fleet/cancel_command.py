"""Cancelling a run on the fleet: the remote-control command that cuts its turns in flight.

`agenttest-submit cancel RUN` marks the run cancelled in the store, so that every later
step of it ends its conversation skipped; then it broadcasts `agenttest_cancel_run` to
the workers (Celery's remote control, over the broker), and each worker cuts the turns
of that run it is playing (driver/run_cancels.py): their steps end them skipped too,
and nothing they did is recorded. A worker with the loop pool (the default) or the
thread pool plays its turns in the process that receives the command; in a prefork
child a turn in flight is not reached, and is recorded when it ends.
"""

from __future__ import annotations

from typing import Any

from celery.worker.control import control_command

from agenttest_worker.driver import RUN_CANCELS
from agenttest_worker.fleet.celery_app import app

CANCEL_COMMAND = "agenttest_cancel_run"


@control_command(args=[("run_id", str)], signature="<run_id>")
def agenttest_cancel_run(state: Any, run_id: str) -> dict[str, str]:
    """Cut this worker's turns in flight of `run_id` (its name is CANCEL_COMMAND)."""
    cut = RUN_CANCELS.cancel(run_id)
    return {"ok": f"run {run_id}: {cut} turn(s) in flight cut short"}


def broadcast_cancel(run_id: str) -> None:
    """Tell every worker to cut the run's turns in flight (not waiting for replies)."""
    app.control.broadcast(CANCEL_COMMAND, arguments={"run_id": run_id})
