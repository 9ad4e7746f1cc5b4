"""`agenttest-submit prune` on the embedded default (SQLite): old runs that have ended
go with every row of theirs, a suite's newest runs stay with --keep-last, a run under
way never goes, --dry-run removes nothing. On Postgres beside a fleet run under way:
test_prune_fleet.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from agenttest_submit.cli.main import main
from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.pruning import RUN_TABLES

SUITE = Path(__file__).resolve().parents[1] / "agenttest_worker" / "demo" / "suite"
SUITE_CASES = str(SUITE / "expense-suite.jsonl")
SUITE_CONFIG = str(SUITE / "agenttest.yaml")


def rows_of(url: str, run_id: str) -> dict[str, int]:
    """Rows of the run in each of its tables, its run row included."""
    counts: dict[str, int] = {}
    with session_scope(url) as session:
        for model in (*RUN_TABLES, runs.RunRow):
            table = model.__table__
            column = table.c.id if table.name == "runs" else table.c.run_id
            counts[table.name] = int(
                session.scalar(select(func.count()).select_from(table).where(column == run_id)) or 0
            )
    return counts


def run_suite(capsys: pytest.CaptureFixture[str], suite: str) -> str:
    args = ["-i", SUITE_CASES, "-n", "assistants.expense", "--config", SUITE_CONFIG]
    assert main([*args, "--suite", suite, "--no-wait"]) in (0, 1)
    return capsys.readouterr().out.strip()


def prune(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["prune", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def test_prune_removes_old_ended_runs_with_every_row(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a1, a2, a3 = (run_suite(capsys, "A") for _ in range(3))
    b1 = run_suite(capsys, "B")
    url = get_settings().effective_database_url()
    # A run under way (stored, not started): never removed, however old.
    runs.create_run(
        url, run_id="under-way", agent=None, input_label="x", options={}, config={}, suite="A"
    )
    before = {run: rows_of(url, run) for run in (a1, a2, a3, b1)}
    assert all(counts["turns"] and counts["cases"] for counts in before.values())
    time.sleep(1.2)

    code, out, _ = prune(
        capsys, "--older-than", "1s", "--suite", "A", "--keep-last", "1", "--dry-run"
    )
    assert code == 0
    assert [line.split()[2] for line in out.splitlines()[:-1]] == [a1, a2]
    assert out.splitlines()[-1] == "would remove 2 run(s) older than 1s"
    assert rows_of(url, a1) == before[a1]  # nothing removed

    code, out, _ = prune(capsys, "--older-than", "1s", "--keep-last", "1")
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[1] for line in lines[:-1]] == [a1, a2]
    removed = sum(before[a1].values()) + sum(before[a2].values())
    assert lines[-1] == f"removed 2 run(s) older than 1s, {removed} row(s)"
    for gone in (a1, a2):
        assert set(rows_of(url, gone).values()) == {0}
    for kept in (a3, b1):
        assert rows_of(url, kept) == before[kept]
    assert main(["report", a3, "--format", "jsonl"]) in (0, 1)
    capsys.readouterr()

    code, out, _ = prune(capsys, "--older-than", "1s")
    assert code == 0 and out.splitlines()[-1].startswith("removed 2 run(s) older than 1s")
    assert runs.get_run(url, "under-way") is not None
    code, out, _ = prune(capsys, "--older-than", "30d")
    assert (code, out) == (0, "no run that has ended is older than 30d: nothing to remove\n")


def test_prune_needs_an_age(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prune"]) == 2
    assert "--older-than" in capsys.readouterr().err
    assert main(["prune", "--older-than", "soon"]) == 2
