"""An embedded run writes its buffer on a timer: killed outright (SIGKILL, OOM), it loses
at most its last half second of turns, even when no conversation has moved since."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from fault_kit import openai_agent, write_config
from fleet import Seen, WatchingAgent, expense_case, turn_rows, wait_until, write_cases
from sqlalchemy.exc import OperationalError

from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql import runs

# First turns answer at once; every second turn is held until the process is killed: a
# quiet stretch after the first turns finish, with nothing to save that would write them,
# so only the timer can. The timer writes every half second; a loaded machine may run it
# late, so the test waits up to TIMER_WRITES_WITHIN for it rather than racing a window.
TIMER_WRITES_WITHIN = 20.0


def is_second_turn(seen: Seen) -> bool:
    return seen.turn == 2


def first_turns_recorded(case_ids: list[str]) -> bool:
    """Whether the run's store holds every first turn (an embedded run creates its store
    on its first write: not opened here before that, so as not to create it)."""
    if not (get_settings().home / "agenttest.db").exists():
        return False
    url = get_settings().effective_database_url()
    try:
        run = runs.latest_run(url)
        return run is not None and {(c, 1) for c in case_ids} <= set(turn_rows(url, run.id))
    except OperationalError:  # its schema is being created
        return False


def test_sigkill_in_a_quiet_stretch_keeps_the_turns_that_finished(
    demo_url: str, tmp_path: Path
) -> None:
    parallel = 4
    killed = threading.Event()
    with WatchingAgent(demo_url) as agent:
        agent.hold(is_second_turn, killed)
        config = write_config(tmp_path, {"demo": openai_agent(agent.base_url)})
        case_ids = [f"Q{i}" for i in range(parallel)]
        cases = write_cases(tmp_path, [expense_case(case_id) for case_id in case_ids])
        options = ["-n", "demo", "--config", str(config), "--parallel", str(parallel)]
        process = subprocess.Popen(
            [sys.executable, "-m", "agenttest_submit.cli", "-i", str(cases), *options],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        try:
            # A conversation's second turn reaches the agent once its first was saved.
            wait_until(
                lambda: {s.case for s in agent.seen() if s.turn == 2} == set(case_ids),
                60.0,
                "every conversation's second turn to start",
                step=0.01,
            )
            # No conversation can move while the second turns are held: what writes the
            # first turns now is the timer. Kill as soon as it has.
            wait_until(
                lambda: first_turns_recorded(case_ids),
                TIMER_WRITES_WITHIN,
                "the timer to write the first turns",
                step=0.02,
            )
            process.kill()
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
            killed.set()
        assert not [s for s in agent.seen() if s.turn == 3], "a second turn finished"

    url = get_settings().effective_database_url()
    run = runs.latest_run(url)
    assert run is not None, stderr
    recorded = set(turn_rows(url, run.id))
    assert {(case_id, 1) for case_id in case_ids} <= recorded, (sorted(recorded), stderr)
