"""What the benchmarks share: timing whole processes and the submitter's command line."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


def compile_bytecode() -> None:
    """Compile the project's modules, as installing a wheel does.

    From an editable checkout with PYTHONDONTWRITEBYTECODE set (as on CI machines),
    every process would compile the project's ~90 modules from source on each start
    (~0.1 s) while its dependencies load compiled: a cost no installed deployment pays.
    Existing bytecode is read even with that variable set.
    """
    import compileall

    for package in ("agenttest_worker", "agenttest_submit", "benchmarks"):
        compileall.compile_dir(ROOT / package, quiet=1)


@dataclass(frozen=True)
class ProcessTimes:
    """What one whole process took: wall seconds, peak RSS, CPU seconds, exit code."""

    seconds: float
    peak_kb: int
    cpu_s: float  # user + system, from the kernel's rusage: steadier than the wall time
    code: int


def run_timed(command: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> ProcessTimes:
    """Run `command` to its end and say what it took, start-up included.

    stderr goes to a file, not a pipe: a chatty process must not block on a full pipe
    while it is being timed. An exit code outside `ok` stops the benchmark with it.
    """
    with tempfile.TemporaryFile() as errors:
        started = time.monotonic()
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.monotonic() - started
        code = os.waitstatus_to_exitcode(status)
        if code not in ok:
            errors.seek(0)
            tail = errors.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{command[0]} exited {code}: {tail}")
    return ProcessTimes(elapsed, usage.ru_maxrss, usage.ru_utime + usage.ru_stime, code)


def timed(
    command: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)
) -> tuple[float, int, int]:
    """(seconds, peak RSS in KB, exit code) of a whole process (see run_timed)."""
    times = run_timed(command, env, ok)
    return times.seconds, times.peak_kb, times.code


def submit_command(cases: Path, config: Path, *extra: str) -> list[str]:
    """agenttest-submit on `cases` against the agent named `bench` in `config`."""
    return [
        str(BIN / "agenttest-submit"),
        "-i",
        str(cases),
        "-n",
        "bench",
        "--config",
        str(config),
        *extra,
    ]
