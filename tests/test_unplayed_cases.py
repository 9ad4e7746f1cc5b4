"""Conversations an embedded run never started end at its --deadline together: one
statement gives each the record a step would have given it (store/sql/unplayed.py),
on SQLite and on Postgres; and a run of thousands of cases ends within seconds of its
deadline, every case reported.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from agent_servers import AgentServer, Reply, completion

from agenttest_submit.cli.main import main, parse_run
from agenttest_submit.inputs.expand import CaseStream, Spool
from agenttest_submit.inputs.sources import parse_input
from agenttest_submit.run.embedded import drive
from agenttest_submit.run.progress import Progress
from agenttest_submit.run.runner import run_options
from agenttest_submit.run.storing import NewRun, write_run
from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.results import DEADLINE_PASSED
from agenttest_worker.settings import get_settings
from agenttest_worker.store import steps
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import get_engine
from agenttest_worker.store.sql.unplayed import end_unplayed

# Every field a case gives its record: a name or none, tags, a simulator, repetitions.
CASES: list[dict[str, Any]] = [
    {"id": "plain", "input": "hi"},
    {"id": "named", "name": "A named case", "tags": ["a", "b"], "input": "hi"},
    {
        "id": "multi",
        "turns": [
            {"input": "one"},
            {"input": "two", "assertions": [{"type": "contains", "value": "x"}]},
        ],
    },
    {"id": "twice", "name": "Played twice", "repeat": 2, "input": "again"},
    {
        "id": "simulated",
        "input": "start",
        "simulator": {"use": "agents:sim", "metadata": {"goal": "g"}},
        "max_turns": 3,
    },
    {"id": "other-agent", "agent": "agents:second", "input": "hi"},
]

CONFIG = """\
agents:
  bot:
    base_url: http://127.0.0.1:9/v1
    model: m
  second:
    base_url: http://127.0.0.1:9/v1
    model: m
  sim:
    base_url: http://127.0.0.1:9/v1
    model: m
"""


def _stored_twice(tmp_path: Path, url: str) -> tuple[str, str, list[tuple[str, int]]]:
    """The cases stored as two runs whose deadline has passed: (run a, run b, keys)."""
    (tmp_path / "agenttest.yaml").write_text(CONFIG, encoding="utf-8")
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps(c) + "\n" for c in CASES), encoding="utf-8")
    config = load_config(str(tmp_path / "agenttest.yaml"))
    request = parse_run(["-i", str(cases), "-n", "bot"])
    options = run_options(request, config, "bot")
    made = []
    for _ in range(2):
        stream = CaseStream([parse_input(str(cases))], config, target="bot")
        with Spool(stream, "bot") as spool:
            run = NewRun(
                steps.new_run_id(),
                target="bot",
                label="cases",
                deadline_at=time.time() - 1,
                options=options.model_dump(mode="json"),
                config=config.stored(),
            )
            write_run(url, run, spool.stored_records())
            keys = [(key, 1) for key, _, _ in spool.records()]
        made.append(run.run_id)
    return made[0], made[1], keys


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_one_statement_gives_each_case_the_record_a_step_gives_it(
    tmp_path: Path, database: str, request: pytest.FixtureRequest
) -> None:
    if database == "postgres":
        url: str = request.getfixturevalue("pg_database")
    else:
        get_settings.cache_clear()
        url = get_settings().effective_database_url()
    stepped, bulk, keys = _stored_twice(tmp_path, url)
    # Each conversation of one run ended by its step, past the deadline...
    asyncio.run(drive(url, stepped, keys, 2, Progress(len(keys)), ask=False))
    # ...and the other run's all at once.
    with get_engine(url).begin() as connection:
        assert end_unplayed(connection, bulk, 0, DEADLINE_PASSED) == len(keys)
    by_step = [r.model_dump() for r in results.iter_results(url, stepped)]
    at_once = [r.model_dump() for r in results.iter_results(url, bulk)]
    assert len(by_step) == len(keys) == 7
    for bulk_record, step_record in zip(at_once, by_step, strict=True):
        differing = {
            key: (bulk_record.get(key), step_record.get(key))
            for key in bulk_record.keys() | step_record.keys()
            if bulk_record.get(key) != step_record.get(key)
        }
        assert not differing, (step_record["id"], differing)
    assert {r["error"] for r in at_once} == {DEADLINE_PASSED}
    assert [r["repeat"] for r in at_once if r["id"] == "twice"] == [1, 2]
    assert runs.get_run(url, bulk) is not None


def test_a_run_of_thousands_ends_within_seconds_of_its_deadline(tmp_path: Path) -> None:
    """3,000 cases, two at a time, against an agent that answers after 0.5 s: a
    deadline of 2 s plays a few, and every other case is reported failed at once."""

    with AgentServer() as agent:
        agent.always("/v1/chat/completions", Reply(body=completion("ok"), delay=0.5))
        config = tmp_path / "agenttest.yaml"
        config.write_text(f"agents:\n  bot:\n    base_url: {agent.url('/v1')}\n    model: m\n")
        cases = tmp_path / "cases.jsonl"
        lines = (json.dumps({"id": f"c{i:05d}", "input": f"m {i}"}) + "\n" for i in range(3000))
        cases.write_text("".join(lines), encoding="utf-8")
        out = tmp_path / "out.jsonl"
        started = time.monotonic()
        code = main(
            ["-i", str(cases), "-n", "bot", "--config", str(config), "--parallel", "2",
             "--deadline", "2s", "-o", str(out), "--format", "jsonl"]
        )  # fmt: skip
        took = time.monotonic() - started
    assert code == 1
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 3000
    assert [r["id"] for r in records] == [f"c{i:05d}" for i in range(3000)]
    played = [r for r in records if r["status"] == "passed"]
    ended = [r for r in records if r.get("error") == DEADLINE_PASSED]
    assert 2 <= len(played) <= 12 and len(played) + len(ended) == 3000
    assert took < 2 + 8, f"ended {took - 2:.1f} s after its deadline"
    run = runs.latest_run(get_settings().effective_database_url())
    assert run is not None
    assert (run.finished_cases, run.passed, run.failed) == (3000, len(played), len(ended))
