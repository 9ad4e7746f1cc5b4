"""Adaptive repeats on a fleet: two Celery workers over Redis and Postgres play the
repetitions of each case, and the step that ends one adds the next in its own
transaction. Repetitions of one case end on both workers at once; none may be added
twice nor missed: each case's repetitions are 1..n, each stored and played once, n as
the stopping rule says (the same as embedded: tests/test_adaptive_repeats.py), with or
without --parallel.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet, fleet_on
from sqlalchemy import select
from test_adaptive_repeats import check_case

from agenttest_worker.report.repeat_stopping import START_WIDTH
from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import CaseRow, RunRow

pytestmark = pytest.mark.fleet


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _case(case_id: str, chance: str) -> dict[str, Any]:
    return {
        "id": case_id,
        "input": f"p={chance} throw the coin",
        "assertions": [{"type": "equals", "value": "heads"}],
    }


# Uncapped, and capped by --parallel: a repetition that adds the next hands it its place
# among the run's conversations in flight (store/repetition_chain.py).
@pytest.mark.parametrize("capped", [[], ["--parallel", "3"]], ids=["uncapped", "parallel-3"])
def test_each_case_stops_as_embedded_with_no_repetition_doubled_or_missing(
    capped: list[str], fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    for name in ("a", "b"):
        fleet.start(name, concurrency=4, wait=False)
    for worker in fleet.workers:
        worker.wait_ready()
    config = tmp_path / "agenttest.yaml"
    entry = {"protocol": "openai", "base_url": demo_url, "model": "coin", "timeout": 10}
    config.write_text(json.dumps({"agents": {"coin": entry}}), encoding="utf-8")
    cases = [_case(f"always-{i}", "1") for i in range(3)]
    cases += [_case(f"never-{i}", "0") for i in range(3)]
    cases += [_case(f"fair-{i}", "0.5") for i in range(2)]
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    auto = ["--repeat", "auto", "--pass-rule", "majority", "--max-repeat", "10", *capped]
    inputs = ["-i", str(path), "-n", "coin", "--config", str(config), "-o", str(out)]
    done = fleet.submit([*inputs, *auto])
    assert done.returncode == 1, done.stderr  # the "never" cases fail

    records: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in out.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        records[record["id"]].append(record)
    assert set(records) == {c["id"] for c in cases}
    for case_id, found in records.items():
        status = {"always": "passed", "never": "failed"}.get(case_id.split("-")[0])
        played, why = check_case(found, "majority", 10, status)
        if status is not None:
            assert why == "decided" and 4 <= played <= 4 + START_WIDTH - 1

    run_id = done.stderr.rsplit("(run ", 1)[1].split(")", 1)[0]
    with session_scope(fleet.database_url) as session:
        run = session.execute(select(RunRow).where(RunRow.id == run_id)).scalar_one()
        rows = session.execute(
            select(CaseRow.test_id, CaseRow.case_id, CaseRow.phase).where(CaseRow.run_id == run_id)
        ).all()
        counts = (run.finished_cases, run.total_cases, run.passed + run.failed + run.skipped)
    stored: dict[str, list[str]] = defaultdict(list)
    for test_id, case_id, phase in rows:
        assert phase == "done"
        stored[test_id].append(case_id)
    for case_id, found in records.items():
        assert sorted(stored[case_id]) == sorted(f"{case_id}#{r['repeat']}" for r in found)
    played = sum(len(found) for found in records.values())
    finished, total, ended = counts
    assert finished == total and ended == played
    # Each repetition called the coin once, whichever worker played it.
    calls = sum(r["usage_by_role"]["target"]["calls"] for rs in records.values() for r in rs)
    assert calls == played
    # The progress counted what was played.
    assert f"{played}/{played} conversations" in done.stderr


def test_a_stopped_run_starts_no_more_repetitions_on_the_fleet(
    fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    fleet.start("a", concurrency=1)
    config = tmp_path / "agenttest.yaml"
    entry = {"protocol": "openai", "base_url": demo_url, "model": "coin", "timeout": 10}
    config.write_text(json.dumps({"agents": {"coin": entry}}), encoding="utf-8")
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(_case("never", "0")) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    inputs = ["-i", str(path), "-n", "coin", "--config", str(config), "-o", str(out)]
    auto = ["--repeat", "auto", "--pass-rule", "majority", "--fail-fast", "--parallel", "1"]
    done = fleet.submit([*inputs, *auto])
    assert done.returncode == 1, done.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    # The first failure stops the run in the write that ends it: the repetitions
    # started with it end skipped, and none is added.
    assert [r["status"] for r in records] == ["failed"] + ["skipped"] * (START_WIDTH - 1)
    assert {r["stop_reason"] for r in records} == {"stopped"}
