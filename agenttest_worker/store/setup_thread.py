"""Work that must reach the database before a new embedded run's first write, done
on a thread of its own (store/buffered.py: the run's conversations start meanwhile).

Nothing here imports SQLAlchemy: the work it is given does, on its thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class StoreSetup:
    """Work that must reach the database before a BufferedStore's first write, run on
    a thread of its own; `wait` returns once it is done, or raises what it raised."""

    def __init__(self, work: Callable[[], object]) -> None:
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(work,), name="agenttest-store")
        self._thread.daemon = True
        self._thread.start()

    def _run(self, work: Callable[[], object]) -> None:
        try:
            work()
        except BaseException as exc:  # handed to whoever waits
            self._error = exc
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise self._error
