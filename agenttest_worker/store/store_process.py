"""Where an embedded run's store work runs: this process, or a child interpreter.

An embedded run's conversations run on one event loop in this process. The store's
work (SQLAlchemy's import, ~0.25 s of CPU, storing the run and its cases, writing each
flush, the aggregation) on a thread beside them shares their interpreter lock: every
tenth of a second of it is a tenth of a second the conversations wait
(benchmarks/embedded.py). `StoreProcess` runs that work in a child interpreter instead,
on another core where there is one: this process never imports SQLAlchemy for it.

The work is a module-level function and its arguments, pickled to the child over a
pipe (a started child's stdin); the result (or the exception) comes back over another
(its stdout), in the order the calls went out. `call` waits for it on the pipe (not
holding the interpreter lock); `submit` returns at once, and the reply is read when its
`result()` is asked for (a flush goes on while the conversations do:
BufferedStore.flush). The child's side of the pipes is store_child.py.
The child ignores Ctrl-C (the run's own cleanup still writes through it when Ctrl-C
stops the run), and leaves when its stdin closes, the parent's end included.

Where it may (`can_fork`: nothing of the store imported yet, no other thread), the
child is forked rather than started afresh: it begins with what the command line
imported so far instead of importing it again beside the conversations. A fleet run's
submitter forks its store's process first thing, before it imports the rest
(agenttest_submit/early_store.py).

`store_work` chooses (AGENTTEST_STORE_PROCESS, `child_wanted`): `auto`, the default, uses the child
unless this process may use only one CPU (the child's work would then be taken from
the conversations) or has already imported SQLAlchemy (a program embedding
agenttest, the test suite), where the child would save little and cost a second
interpreter.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, cast

from agenttest_worker.store import store_child
from agenttest_worker.store.store_child import (
    FRAME,
    LATER,
    StoreProcessError,
    serve_forked,
)

if TYPE_CHECKING:
    from agenttest_worker.settings import StoreProcessChoice

# The settings (pydantic's) are imported where they are read: the submitter forks a
# fleet run's store process before it imports them (fleet_storing.py).

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Reply(Protocol[R_co]):
    """A call's result to come: `result()` waits for it, or raises what it raised."""

    def result(self) -> R_co: ...


class StoreWork(Protocol):
    """Runs the store's work somewhere, in the order it is given.

    `call(fn, *args, **kwargs)` is `fn`'s result; `submit` hands the call over and
    returns at once (in the store's process: it runs while the caller goes on)."""

    def submit(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Reply[R]: ...

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R: ...

    def interrupt(self) -> None:
        """Stop the call under way: a call that allows it (`stopping_with_the_parent`)
        raises StoreInterrupted where it stands."""

    def no_more_calls(self) -> None:
        """No call follows those given: the store's process may leave (closing the
        database) once it answered them, while the caller goes on. `close` waits."""

    def close(self) -> None: ...


class _Done(Generic[R]):
    """A call already run: its result, or what it raised."""

    def __init__(self, value: R | None = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error

    def result(self) -> R:
        if self._error is not None:
            raise self._error
        return cast(R, self._value)


class InThisProcess:
    """The store's work on the caller's own thread."""

    def submit(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Reply[R]:
        try:
            return _Done(fn(*args, **kwargs))
        except Exception as exc:
            return _Done(error=exc)

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        return fn(*args, **kwargs)

    def interrupt(self) -> None:
        pass  # the caller's own interrupt already stopped the call it was making

    def no_more_calls(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Awaited(Generic[R]):
    """A call sent to the store's process; its reply is read when asked for (the replies
    come back in the order the calls went out)."""

    def __init__(self, process: StoreProcess) -> None:
        self._process = process
        self.reply: _Done[R] | None = None

    def result(self) -> R:
        while self.reply is None:
            self._process._read_reply()
        return self.reply.result()


class StoreProcess:
    """A child interpreter running the store's work, in the order it is given.

    A call is pickled on the caller's thread (what it sends is taken then) and written
    to the child by a thread of its own: the caller never waits on the pipe while the
    child reads (a flush's batch is ~1 MB for 500 cases). Replies are read by whoever
    asks for one, in order."""

    def __init__(
        self, preload: Sequence[str] = (), later: Sequence[str] = (), child: Any = None
    ) -> None:
        """`preload`: modules the child imports before it reads its first call (those
        arrive meanwhile, and wait in the pipe); `later`: ones it imports once it has
        answered its first call (what the run needs only at its end)."""
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._waiting: deque[_Awaited[Any]] = deque()
        self._broken: str | None = None
        self._closed = False
        self._sending_ended = False
        self._proc = child or subprocess.Popen(
            [sys.executable, "-m", store_child.__name__, *preload, LATER, *later],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def submit(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Reply[R]:
        # Framed by its length: one the child cannot read whole (a function it cannot
        # import) is skipped whole, not read on into the next.
        pickled = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        request = FRAME.pack(len(pickled)) + pickled
        with self._send_lock:
            if self._broken is not None or self._closed or self._sending_ended:
                raise StoreProcessError(self._broken or "the store's process is closed")
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_requests, name="agenttest-store-requests", daemon=True
                )
                self._writer.start()
            awaited: _Awaited[R] = _Awaited(self)
            self._waiting.append(awaited)
            self._requests.put(request)
            return awaited

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        return self.submit(fn, *args, **kwargs).result()

    def interrupt(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    def _write_requests(self) -> None:
        """The writer thread: each request to the child, in order, until close()."""
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            while (request := self._requests.get()) is not None:
                stdin.write(request)
                stdin.flush()
        except OSError:
            return  # the child is gone: whoever reads its next reply is told
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    def _read_reply(self) -> None:
        """The next reply, to the oldest call still waiting for one."""
        with self._read_lock:
            if not self._waiting or self._waiting[0].reply is not None:
                return  # another thread read it meanwhile
            if self._broken is not None or self._proc.stdout is None:
                raise StoreProcessError(self._broken or "the store's process is closed")
            try:
                ok, value = pickle.load(self._proc.stdout)
            except (OSError, EOFError, pickle.UnpicklingError):
                raise self._ended() from None
            except BaseException:
                self._broken = "the store's process was interrupted mid-reply"
                raise
            self._waiting.popleft().reply = _Done(value) if ok else _Done(error=value)

    def _ended(self) -> StoreProcessError:
        code = self._proc.poll()
        self._broken = "the store's process ended unexpectedly" + (
            f" (exit code {code})" if code is not None else ""
        )
        return StoreProcessError(self._broken)

    def no_more_calls(self) -> None:
        with self._send_lock:
            if self._writer is not None and not self._sending_ended:
                self._sending_ended = True
                self._requests.put(None)  # the writer closes the child's stdin once it is done

    def close(self) -> None:
        """Let the child finish what it was given (it closes the database as it leaves)
        and wait for it; one never given any work (the run stopped at its input) is
        ended at once, without waiting for its imports."""
        self.no_more_calls()
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
            writer = self._writer
        if writer is None:
            self._proc.kill()
            if self._proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()
        else:
            writer.join()
            # Replies nobody took (a run stopped before it read them): read, so that the
            # child is not left blocked writing them to a full pipe.
            while self._waiting and self._waiting[-1].reply is None:
                try:
                    self._read_reply()
                except Exception:
                    break
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def store_work(
    choice: StoreProcessChoice, preload: Sequence[str] = (), later: Sequence[str] = ()
) -> StoreWork:
    """The store's work for a new embedded run, as AGENTTEST_STORE_PROCESS chooses (see
    StoreProcess for `preload` and `later`)."""
    if not child_wanted(choice):
        return InThisProcess()
    if can_fork():
        return forked_store_process(preload, later)
    if not sys.executable:
        # An interpreter that cannot name itself (embedded in another program) cannot
        # start a second one: the store's work stays here.
        return InThisProcess()
    return StoreProcess(preload, later)


def child_wanted(choice: str) -> bool:
    """Whether AGENTTEST_STORE_PROCESS=`choice` puts the store's work in a child here:
    `always` does, `never` does not, `auto` unless this process may use only one CPU or
    has already imported SQLAlchemy (a program embedding agenttest, the test suite),
    where the child would save little and cost a second interpreter."""
    if choice == "never":
        return False
    # A second process pays off only on a core of its own: on one, its imports (~0.35 s
    # of CPU) are the conversations' loss (`benchmarks.embedded --cpus 0 --store-process
    # never always`: 1,000 cases 100 at a time in 1.34 s here, 1.65 s with the child).
    return choice != "auto" or ("sqlalchemy" not in sys.modules and usable_cpus() >= 2)


def can_fork() -> bool:
    """Whether the store's process may be forked from this one rather than started
    afresh: it then begins with what this process imported (pydantic, the settings, the
    command line: ~0.1 s of CPU, and an interpreter's start-up, that a started one
    spends again beside the conversations; `benchmarks.embedded`). Only where nothing of
    the store exists yet that the child would share by mistake (no SQLAlchemy, no
    psycopg: no engine, no pooled connection) and no thread but this one runs (a fork
    copies the calling thread alone; a lock another held would stay held)."""
    return (
        os.name == "posix"
        and threading.active_count() == 1
        and "sqlalchemy" not in sys.modules
        and "psycopg" not in sys.modules
    )


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity, and a cgroup's CPU quota (a
    container started with `--cpus 1` sees every core of its host)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:  # cgroup v2: "QUOTA PERIOD" in microseconds, or "max PERIOD"
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = max(1, min(cpus, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cpus


class _ForkedChild:
    """A forked child as much of `subprocess.Popen` as StoreProcess uses."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None and not self._ended_within(timeout):
            raise subprocess.TimeoutExpired("store process", timeout or 0)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("store process", timeout or 0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def _ended_within(self, timeout: float | None) -> bool:
        """Whether the child ends within `timeout` seconds, told by the kernel the moment
        it does (a pidfd: Linux 5.3 on); True where that cannot be asked (the polling in
        `wait` then tells, 5 ms at a time)."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            return True
        try:
            return bool(select.select([pidfd], [], [], timeout)[0])
        finally:
            os.close(pidfd)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def forked_store_process(preload: Sequence[str] = (), later: Sequence[str] = ()) -> StoreProcess:
    """A StoreProcess forked from this process (POSIX), which must hold no thread but
    the main one: without a new interpreter's start-up, and sharing what this process
    imported so far."""
    # What this process buffered would be written twice, by the child too.
    sys.stdout.flush()
    sys.stderr.flush()
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(requests_write)
        os.close(replies_read)
        serve_forked(requests_read, replies_write, preload, later)
    os.close(requests_read)
    os.close(replies_write)
    child = _ForkedChild(pid, os.fdopen(requests_write, "wb"), os.fdopen(replies_read, "rb"))
    return StoreProcess(child=child)
