"""Agent replies nested deeper than the project can store or read back.

pydantic refuses to write a value nested past 255 levels and its parser to read one
past 200: a reply whose tool arguments (or reported state) nested that deep killed an
embedded run (exit 3, every result lost), was played again for ever on a fleet, or
was stored in records no report could read. Replies are bounded where they are read
(json_values.MAX_REPLY_DEPTH): such a turn fails with the reason, its conversation
ends, the run goes on and its reports build. And a run whose aggregation fails anyway
does not keep the sweeper from the other runs.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fault_kit import write_config
from fleet import fleet_on, write_cases
from scripted_agent import Reply, ScriptedAgent, last_user_text
from sqlalchemy import text

from agenttest_submit.cli.main import main
from agenttest_submit.run.runner import store_run
from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.cases.case_model import Case
from agenttest_worker.driver.step import PoolCache, run_step_sync
from agenttest_worker.engine import RunOptions
from agenttest_worker.fleet.sweeper import recover
from agenttest_worker.json_values import MAX_REPLY_DEPTH, nested_deeper_than
from agenttest_worker.report.aggregation import aggregate
from agenttest_worker.settings import get_settings
from agenttest_worker.store.conversation_store import SqlStore
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql import runs
from agenttest_worker.store.sql.db import get_engine, upgrade


def nested(levels: int) -> dict[str, Any]:
    """An object `levels` deep: {"a": {"a": ... {} }}."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_nesting_is_measured_in_levels_of_objects_and_arrays() -> None:
    assert not nested_deeper_than("text", 0)
    assert not nested_deeper_than({}, 1) and nested_deeper_than({}, 0)
    assert not nested_deeper_than(nested(64), 64)
    assert nested_deeper_than(nested(65), 64)
    assert nested_deeper_than([1, {"b": [[]]}], 3) and not nested_deeper_than([1, {"b": [[]]}], 4)


# What each case's first turn gets from the agent (its input names it).
DEEP_REPLIES: dict[str, Reply] = {
    # Past pydantic's serializer (255): the step could not be saved at all.
    "ARGS300": Reply(content="noted", tool_calls=[{"name": "lookup", "args": nested(300)}]),
    # Saved, but past the parser's limit (200): no report could read its record.
    "STATE220": Reply(content="noted", state=nested(220)),
    # Over the bound, within both limits: refused the same way.
    "ARGS70": Reply(content="noted", tool_calls=[{"name": "lookup", "args": nested(70)}]),
    # Within the bound: kept, stored and read back.
    "ARGS40": Reply(content="noted", tool_calls=[{"name": "lookup", "args": nested(40)}]),
    # Text, past Python's own parser's limit where an assertion reads it as JSON.
    "TEXT5000": Reply(content="[" * 5000 + "]" * 5000),
}
REASONS = {
    "ARGS300": "tool arguments nested deeper than 64 levels",
    "STATE220": f"reply is JSON nested deeper than {MAX_REPLY_DEPTH} levels",
    "ARGS70": "tool arguments nested deeper than 64 levels",
}


def _reply(body: dict[str, Any]) -> Reply:
    said = last_user_text(body)
    for name, reply in DEEP_REPLIES.items():
        if said.startswith(name):
            return reply
    return Reply(content="noted")


def _cases(directory: Path) -> Path:
    def turns(first: str) -> list[dict[str, Any]]:
        said = {"type": "contains", "value": "noted"}
        if first.startswith("TEXT"):
            said = {"type": "equals", "value": {"a": 1}}  # reads the reply as JSON
        return [
            {"input": first, "assertions": [said]},
            {"input": "and then", "assertions": [{"type": "contains", "value": "noted"}]},
        ]

    return write_cases(
        directory,
        [
            {"id": name, "type": "multi_turn", "turns": turns(f"{name} please")}
            for name in (*DEEP_REPLIES, "OK")
        ],
    )


def _calls_by_case(agent: ScriptedAgent) -> dict[str, int]:
    """How many calls the agent got for each case (named by its first input)."""
    counted: dict[str, int] = {}
    for body in agent.requests("target"):
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        name = first.split()[0]
        counted[name] = counted.get(name, 0) + 1
    return counted


def _check_records(records: dict[str, dict[str, Any]]) -> None:
    assert records["OK"]["status"] == "passed"
    assert records["ARGS40"]["status"] == "passed"
    assert records["ARGS40"]["turns"][0]["tool_calls"][0]["args"] == nested(40)
    text = records["TEXT5000"]
    assert text["status"] == "failed" and [t["status"] for t in text["turns"]] == [
        "failed",
        "passed",
    ]
    assert "reply is not JSON" in text["turns"][0]["assertions"][0]["reason"]
    for name, reason in REASONS.items():
        record = records[name]
        assert record["status"] == "failed", record
        # The turn failed with the reason and the conversation ended: no turn 2.
        assert [t["turn"] for t in record["turns"]] == [1], record
        assert reason in record["turns"][0]["error"], record["turns"][0]


# Each deep case was called once (its conversation ended), the others twice (two turns).
EXPECTED_CALLS = {**dict.fromkeys(REASONS, 1), "ARGS40": 2, "TEXT5000": 2, "OK": 2}


def test_an_embedded_run_fails_only_the_turns_nested_too_deep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = _cases(tmp_path)
    out = tmp_path / "results.jsonl"
    with ScriptedAgent() as agent:
        agent.script("target", _reply)
        entry = {"protocol": "openai", "base_url": agent.base_url, "model": "target"}
        config = write_config(tmp_path, {"scripted": entry})
        capsys.readouterr()
        code = main(["-i", str(cases), "-n", "scripted", "--config", str(config), "-o", str(out)])
        calls = _calls_by_case(agent)
    _, err = capsys.readouterr()
    assert code == 1, err
    assert "internal error" not in err and "Traceback" not in err
    _check_records({r["id"]: r for r in map(json.loads, out.read_text().splitlines())})
    assert calls == EXPECTED_CALLS
    # The stored run reads back: its report is built again from the store.
    url = get_settings().effective_database_url()
    run = runs.latest_run(url)
    assert run is not None and run.status == "done"
    capsys.readouterr()
    assert main(["report", run.id, "--format", "json"]) in (0, 1)
    document = json.loads(capsys.readouterr().out)
    assert len(document["results"]) == 6


@pytest.mark.fleet
def test_a_fleet_run_fails_only_the_turns_nested_too_deep_and_finishes(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    cases = _cases(tmp_path)
    with ScriptedAgent() as agent:
        agent.script("target", _reply)
        entry = {"protocol": "openai", "base_url": agent.base_url, "model": "target"}
        config = write_config(tmp_path, {"scripted": entry})
        with contextmanager(fleet_on)(redis_db, pg_database, demo_url, tmp_path) as fleet:
            fleet.start("w", concurrency=2)
            run_id = fleet.submit_no_wait(
                ["-i", str(cases), "-n", "scripted", "--config", str(config)]
            )
            fleet.wait_done(run_id, timeout=60)
        calls = _calls_by_case(agent)
    records = {r.id: r.model_dump(mode="json") for r in results.iter_results(pg_database, run_id)}
    _check_records(records)
    assert calls == EXPECTED_CALLS, "no turn was played again"
    assert results.get_report(pg_database, run_id, "jsonl") is not None


def _finished_run(url: str, tmp_path: Path, name: str) -> str:
    """A run of one conversation that has ended, stored as a worker leaves it when the
    aggregation message is lost: `running`, every case finished."""
    config = load_config(str(write_config(tmp_path / name, {})))
    case = Case.model_validate({"id": "C", "input": "hello"})
    run_id, total = store_run(
        url,
        [case],
        options=RunOptions(target="t", interactive=False),
        config=config,
        target="t",
        label=name,
    )
    runs.start_run(url, run_id, total)
    record = {"id": "C", "name": "C", "status": "passed", "turns": [], "total_turns": 0}
    with get_engine(url).begin() as connection:
        connection.execute(
            text(
                "UPDATE cases SET phase = 'done', status = 'passed', result = :r "
                "WHERE run_id = :run"
            ),
            {"r": json.dumps(record), "run": run_id},
        )
        connection.execute(
            text("UPDATE runs SET finished_cases = total_cases, passed = 1 WHERE id = :run"),
            {"run": run_id},
        )
    return run_id


def test_a_run_whose_aggregation_fails_does_not_block_the_sweep_of_the_others(
    pg_database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A record no reader can parse (stored before replies were bounded) makes its run's
    aggregation fail: the sweeper says so and aggregates the runs after it."""
    upgrade(pg_database)
    unreadable = _finished_run(pg_database, tmp_path, "unreadable")
    fine = _finished_run(pg_database, tmp_path, "fine")
    call = {"name": "lookup", "args": nested(230)}
    turn = {"turn": 1, "input": "hello", "output": "noted", "tool_calls": [call]}
    deep = {"id": "C", "name": "C", "status": "passed", "turns": [turn], "total_turns": 1}
    with get_engine(pg_database).begin() as connection:
        connection.execute(
            text("UPDATE cases SET result = :r WHERE run_id = :run"),
            {"r": json.dumps(deep), "run": unreadable},
        )
    with caplog.at_level(logging.ERROR, logger="agenttest.tasks"):
        _, aggregated = recover(pg_database, 0.0)
    assert aggregated == 1
    done = runs.get_run(pg_database, fine)
    assert done is not None and done.status == "done"
    stuck = runs.get_run(pg_database, unreadable)
    assert stuck is not None and stuck.status == "aggregating"
    assert f"run {unreadable}: its reports could not be built" in caplog.text


def test_a_conversation_stored_too_deep_ends_failed_without_calling_its_agent_again(
    pg_database: str, tmp_path: Path
) -> None:
    """A state stored nested past the parser's limit (by a version that did not bound
    replies) failed its turn each time it was played: the conversation now ends failed
    with the reason, and the run is aggregated."""
    upgrade(pg_database)
    with ScriptedAgent() as agent:
        agent.script("target", _reply)
        entry = {"protocol": "openai", "base_url": agent.base_url, "model": "target"}
        config = load_config(str(write_config(tmp_path, {"scripted": entry})))
        turns = [{"input": "OK then"}, {"input": "and then"}]
        run_id, total = store_run(
            pg_database,
            [Case.model_validate({"id": "C", "type": "multi_turn", "turns": turns})],
            options=RunOptions(target="scripted", interactive=False),
            config=config,
            target="scripted",
            label="stored-deep",
        )
        runs.start_run(pg_database, run_id, total)
        store, pools = SqlStore(pg_database), PoolCache()
        first = run_step_sync(store, pools, run_id, "C", 1, max_deliveries=3)
        assert first.saved and first.next_turn == 2
        with get_engine(pg_database).begin() as connection:
            stored = connection.execute(
                text("SELECT state FROM cases WHERE run_id = :run"), {"run": run_id}
            ).scalar_one()
            state = stored if isinstance(stored, dict) else json.loads(stored)
            state["agent_state"] = nested(230)
            # Another token: as written by another worker, so this process reads it.
            connection.execute(
                text(
                    "UPDATE cases SET state = CAST(:s AS json), step_token = 'elsewhere' "
                    "WHERE run_id = :run"
                ),
                {"s": json.dumps(state), "run": run_id},
            )
        second = run_step_sync(store, pools, run_id, "C", 2, max_deliveries=3)
        calls = len(agent.requests("target"))
    assert second.saved and second.case_done and second.status == "failed"
    assert second.run_finished
    assert calls == 1, "the agent was not called for the turn that could not be played"
    (record,) = results.iter_results(pg_database, run_id)
    assert record.error is not None
    assert record.error.startswith("turn 2 could not be played: its stored conversation cannot")
    assert aggregate(pg_database, run_id) is not None
