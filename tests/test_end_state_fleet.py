"""End state on a fleet: two Celery workers over Redis and Postgres read the state an
agent left in its system after every turn and after the conversation, as the embedded
runner does (tests/test_end_state.py): the honest agent's case passes, the one that
only says it submitted fails, and the state URL's secret header is stored nowhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_servers import ExpenseSystem
from fleet import Fleet, fleet_on
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.fleet

TOKEN = "st-fleet-3c9d1e7f52"
DRAFT = {"type": "json_path", "path": "$.state.expense.status", "value": "draft"}
SUBMITTED = {"type": "json_path", "path": "$.state.expense.status", "value": "submitted"}
TABLES = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"


@pytest.fixture
def fleet(redis_db: str, pg_database: str, demo_url: str, tmp_path: Path) -> Iterator[Fleet]:
    yield from fleet_on(redis_db, pg_database, demo_url, tmp_path)


def _case(case_id: str, agent: str) -> dict[str, Any]:
    return {
        "id": case_id,
        "agent": agent,
        "turns": [
            {"input": "File my 42 EUR lunch", "assertions": [DRAFT]},
            {"input": "Please submit it", "assertions": [SUBMITTED]},
        ],
        "final_assertions": [SUBMITTED],
    }


def _holding(database_url: str, secret: str) -> list[str]:
    """The tables of the database any of whose rows holds `secret`."""
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as connection:
            tables = connection.execute(text(TABLES)).scalars()
            return [
                table
                for table in list(tables)
                if connection.execute(
                    text(f'SELECT count(*) FROM "{table}" AS row WHERE row::text LIKE :pattern'),
                    {"pattern": f"%{secret}%"},
                ).scalar_one()
            ]
    finally:
        engine.dispose()


def test_the_fleet_reads_the_end_state_after_every_turn_and_at_the_end(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.env["END_STATE_TOKEN"] = TOKEN  # the workers' and the submitter's
    honest_system = ExpenseSystem(note="note-of-the-honest-system")
    with honest_system as honest, ExpenseSystem(submits=False) as liar:
        headers = {"X-State-Token": "${END_STATE_TOKEN}"}
        agents = {
            "honest": honest.entry(each_turn=True, headers=headers),
            "liar": liar.entry(each_turn=True, headers=headers),
        }
        config = tmp_path / "agenttest.yaml"
        config.write_text(yaml.safe_dump({"agents": agents}), encoding="utf-8")
        cases = tmp_path / "cases.jsonl"
        lines = [_case(f"honest-{n}", "honest") for n in range(3)]
        lines += [_case(f"liar-{n}", "liar") for n in range(3)]
        cases.write_text("".join(json.dumps(c) + "\n" for c in lines), encoding="utf-8")
        for name in ("a", "b"):
            fleet.start(name, concurrency=2, wait=False)
        for worker in fleet.workers:
            worker.wait_ready()
        out = tmp_path / "out.jsonl"
        done = fleet.submit(
            ["-i", str(cases), "--config", str(config), "-o", str(out), "--format", "jsonl"]
        )
        assert done.returncode == 1, done.stderr + fleet.logs()[-4000:]
        # Two turns and the end of three conversations each, the token sent every time.
        for system in (honest, liar):
            assert len(system.state_requests) == 9
            assert {r.headers["X-State-Token"] for r in system.state_requests} == {TOKEN}
    records = {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    for n in range(3):
        good, bad = records[f"honest-{n}"], records[f"liar-{n}"]
        assert good["status"] == "passed", good
        assert [t["end_state"]["expense"]["status"] for t in good["turns"]] == [
            "draft",
            "submitted",
        ]
        assert good["end_state"]["expense"]["status"] == "submitted"
        assert good["end_state"]["token"] == "***"
        assert bad["status"] == "failed"
        assert [t["status"] for t in bad["turns"]] == ["passed", "failed"]
        assert not bad["final_assertions"][0]["passed"]
        assert bad["end_state"]["expense"]["status"] == "draft"
    assert TOKEN not in out.read_text(encoding="utf-8")
    assert TOKEN not in fleet.logs()
    assert _holding(fleet.database_url, TOKEN) == []
    # (The search finds what the run did store: the end state it read.)
    assert _holding(fleet.database_url, "note-of-the-honest-system")
