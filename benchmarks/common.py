"""What the benchmarks share: the agent over https, timing whole processes, the
submitter's command line, the targets' verdict."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import redis

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


def compile_bytecode(root: Path = ROOT) -> None:
    """Compile the project's modules, as installing a wheel does.

    From an editable checkout with PYTHONDONTWRITEBYTECODE set (as on CI machines),
    every process would compile the project's ~90 modules from source on each start
    (~0.1 s) while its dependencies load compiled: a cost no installed deployment pays.
    Existing bytecode is read even with that variable set.
    """
    import compileall

    for package in ("agenttest_worker", "agenttest_submit", "benchmarks"):
        compileall.compile_dir(root / package, quiet=1)


@dataclass(frozen=True)
class ProcessTimes:
    """What one whole process took: wall seconds, peak RSS, CPU seconds, exit code.

    `peak_kb` counts the process and the children it starts together, sampled; the
    kernel's own figure is the largest one process reached, not their sum. `cpu_s`
    includes the children's."""

    seconds: float
    peak_kb: int
    cpu_s: float  # user + system, from the kernel's rusage: steadier than the wall time
    code: int


class _TreeMemory(threading.Thread):
    """The largest RSS a process and its children held at once, sampled every 10 ms
    (their /proc status; the children found by their parent's pid)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_kb = pid, 0
        self._children: set[int] = set()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.01):
            try:
                self._find_children()
                total = sum(_rss_kb(pid) for pid in (self.pid, *self._children))
            except OSError:
                continue  # one of them just left
            self.peak_kb = max(self.peak_kb, total)

    def _find_children(self) -> None:
        # Only pids above the parent's: a child started after it (no wrap-around here).
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) > self.pid and int(name) not in self._children:
                try:
                    stat = Path(f"/proc/{name}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.pid:
                    self._children.add(int(name))

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak_kb


def _rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:", 1)[1].split()[0]) if "VmRSS:" in status else 0


def run_timed(command: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> ProcessTimes:
    """Run `command` to its end and say what it took, start-up included.

    stderr goes to a file, not a pipe: a chatty process must not block on a full pipe
    while it is being timed. An exit code outside `ok` stops the benchmark with it.
    """
    with tempfile.TemporaryFile() as errors:
        started = time.monotonic()
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        memory = _TreeMemory(proc.pid)
        memory.start()
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.monotonic() - started
        tree_kb = memory.stop()
        code = os.waitstatus_to_exitcode(status)
        if code not in ok:
            errors.seek(0)
            tail = errors.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{command[0]} exited {code}: {tail}")
    peak_kb = max(usage.ru_maxrss, tree_kb)
    return ProcessTimes(elapsed, peak_kb, usage.ru_utime + usage.ru_stime, code)


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


def _setting(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def add_settings_option(parser: argparse.ArgumentParser) -> None:
    """`--env AGENTTEST_X=VALUE` (repeatable): a setting given to the agenttest workers and
    submitter the benchmark starts; `dict(args.env)` holds them."""
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        type=_setting,
        metavar="AGENTTEST_X=VALUE",
        help="a setting for the agenttest workers and submitter (repeatable)",
    )


@cache
def trusted_certificate() -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made once per benchmark with
    the openssl CLI, and trusted through SSL_CERT_FILE by this process and by every
    process it starts from now on (their environments are built from this one's), as a
    real agent's certificate authority is trusted. Removed when the benchmark exits."""
    directory = Path(tempfile.mkdtemp(prefix="agenttest-bench-tls-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    os.environ["SSL_CERT_FILE"] = str(cert)
    return cert, key


class AgentUrl(str):
    """The https agent's base URL, and its process (whose CPU a side's figures count)."""

    pid: int

    def calls(self) -> int:
        """The calls the agent has had so far."""
        return int(self._counts()["calls"])

    def answered(self) -> dict[str, int]:
        """The calls it answered 2xx so far, by the request's model."""
        return {model: int(n) for model, n in self._counts()["answered"].items()}

    def refused(self) -> int:
        """The 429s it answered itself so far (a rate-limited agent's)."""
        return int(self._counts()["refused"])

    def refused_at(self) -> list[float]:
        """When it answered each of those, in seconds from its first call."""
        return [float(t) for t in self._counts()["refused_at"]]

    def _counts(self) -> Any:
        with urllib.request.urlopen(self + "/calls", timeout=30) as response:
            return json.load(response)


@contextmanager
def _https_agent(*options: str) -> Iterator[AgentUrl]:
    cert, key = trusted_certificate()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.fixed_agent",
            "--certfile",
            str(cert),
            "--keyfile",
            str(key),
            *options,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = AgentUrl(proc.stdout.readline().strip())
    url.pid = proc.pid
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def fixed_agent(latency_ms: float, reply_chars: int = 0) -> AbstractContextManager[AgentUrl]:
    """benchmarks/fixed_agent.py over https, answering after `latency_ms`."""
    return _https_agent("--latency-ms", str(latency_ms), "--reply-chars", str(reply_chars))


def rate_limited_agent(latency_ms: float, per_second: float) -> AbstractContextManager[AgentUrl]:
    """benchmarks/fixed_agent.py over https, answering after `latency_ms` at most
    `per_second` requests a second (a token bucket; 429 with retry-after beyond)."""
    return _https_agent("--latency-ms", str(latency_ms), "--requests-per-second", str(per_second))


def forwarding_agent(upstream: str) -> AbstractContextManager[AgentUrl]:
    """benchmarks/fixed_agent.py over https, passing every call on to `upstream` (an
    agent served over plain HTTP), counting them."""
    return _https_agent("--forward", upstream)


class Targets:
    """The targets a benchmark checks: each figure printed beside its floor and its
    target; `exit_code()` is 1 when one was missed."""

    def __init__(self) -> None:
        self.missed: list[str] = []

    def check(self, name: str, figure: str, floor: str, target: str, met: bool) -> None:
        verdict = "met" if met else "MISSED"
        print(f"  target {name}: {figure} (floor {floor}; target {target}): {verdict}")
        if not met:
            self.missed.append(name)

    def exit_code(self) -> int:
        if self.missed:
            print(f"targets missed: {', '.join(self.missed)}")
            return 1
        print("every target met")
        return 0


def queued_messages(client: redis.Redis) -> int:
    """Messages waiting in the broker: the length of every Redis list of its database (a
    Celery queue is a list, one more per priority level)."""
    return sum(
        client.llen(key) for key in client.scan_iter(count=1000) if client.type(key) == b"list"
    )
