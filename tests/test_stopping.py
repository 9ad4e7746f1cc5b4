"""SIGTERM during the submitter's asyncio runs: the run is cancelled, its cleanup runs,
`Terminated` is raised once, and no task is left holding it (asyncio printed such a
task at exit as "Task exception was never retrieved", with a traceback, which a
CI log then showed for a plain cancelled job)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time

import pytest

from agenttest_submit.cli.stopping import Terminated, run_async, sigterm_as_interrupt


def _busy_then_wait(seconds: float) -> asyncio.Future[None]:
    async def lane() -> None:
        # Python code running in a task when the signal lands, then a long wait.
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        await asyncio.sleep(30)

    return asyncio.gather(lane(), lane())


def test_sigterm_cancels_the_run_and_raises_terminated_once(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    cleaned: list[str] = []

    async def main() -> None:
        try:
            await _busy_then_wait(0.3)
        finally:
            cleaned.append("finally ran")

    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM))
    with sigterm_as_interrupt():
        handler = signal.getsignal(signal.SIGTERM)
        timer.start()
        with pytest.raises(Terminated):
            run_async(main())
        # The rest of the command (storing, reporting) still unwinds on SIGTERM.
        assert signal.getsignal(signal.SIGTERM) is handler
    timer.join()
    gc.collect()
    assert cleaned == ["finally ran"]
    err = capfd.readouterr().err
    assert "never retrieved" not in err and "Traceback" not in err, err
    # asyncio reports such a task through its logger (stderr outside pytest).
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]


def test_a_run_that_ends_gives_its_result_and_keeps_the_handler() -> None:
    async def main() -> int:
        await asyncio.sleep(0)
        return 7

    with sigterm_as_interrupt():
        handler = signal.getsignal(signal.SIGTERM)
        assert run_async(main()) == 7
        assert signal.getsignal(signal.SIGTERM) is handler
