"""An embedded run writes its buffer on a timer: killed outright (SIGKILL, OOM), it loses
at most its last half second of turns, even when no conversation has moved since."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fault_kit import openai_agent, write_config
from fleet import Seen, WatchingAgent, expense_case, turn_rows, wait_until, write_cases
from sqlalchemy.exc import OperationalError

from agenttest_worker.settings import get_settings
from agenttest_worker.store import runs

# First turns answer at once; each second turn waits: a quiet stretch after the first
# turns finish, with nothing to save that would write them.
SECOND_TURN_DELAY = 1.3  # (the test waits these out: the agent answers before it stops)
# The latest kill: past the half second, before the second turns can finish. The test
# kills as soon as the timer has written, about half a second in.
KILL_AFTER = 1.0


def second_turns_wait(seen: Seen) -> float:
    return 0.0 if seen.turn == 1 else SECOND_TURN_DELAY


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
    with WatchingAgent(demo_url, delay=second_turns_wait) as agent:
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
            # Kill as soon as the timer has written the first turns, and at the latest
            # KILL_AFTER in: no conversation moves in between, so only the timer can.
            wait_until(
                lambda: first_turns_recorded(case_ids),
                KILL_AFTER,
                "the timer to write the first turns",
                step=0.02,
            )
            process.kill()
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        assert not [s for s in agent.seen() if s.turn == 3], "a second turn finished"

    url = get_settings().effective_database_url()
    run = runs.latest_run(url)
    assert run is not None, stderr
    recorded = set(turn_rows(url, run.id))
    assert {(case_id, 1) for case_id in case_ids} <= recorded, (sorted(recorded), stderr)
