"""Where a submission runs: in this process (embedded) or on a one-worker fleet.

A test that must keep a promise in both places takes the `place` fixture its module
makes from `PLACES` (the fleet one marked `fleet`):

    @pytest.fixture(params=PLACES)
    def place(request: pytest.FixtureRequest) -> Place:
        return Place(request.param, request, worker="repeats", threads=4)

`place.submit(ARGS)` runs `agenttest-submit ARGS` there (subcommands too) and gives its
exit code, stdout and stderr; `place.fleet` is the Fleet, or None embedded. The module
provides the `fleet` fixture (tests/fleet.py `fleet_on`).
"""

from __future__ import annotations

import pytest
from fleet import Fleet

from agenttest_submit.cli.main import main

PLACES = ["embedded", pytest.param("fleet", marks=pytest.mark.fleet)]


class Place:
    def __init__(
        self, where: str, request: pytest.FixtureRequest, *, worker: str, threads: int
    ) -> None:
        self.where = where
        self._capsys: pytest.CaptureFixture[str] = request.getfixturevalue("capsys")
        self.fleet: Fleet | None = None
        if where == "fleet":
            self.fleet = request.getfixturevalue("fleet")
            self.fleet.start(worker, concurrency=threads)

    def submit(self, args: list[str]) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of `agenttest-submit ARGS` here."""
        if self.fleet is not None:
            done = self.fleet.submit(args)
            return done.returncode, done.stdout, done.stderr
        self._capsys.readouterr()
        code = main(args)
        out, err = self._capsys.readouterr()
        return code, out, err
