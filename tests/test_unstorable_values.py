"""What an agent says that the database cannot hold as it is. A NUL character (Postgres
text and jsonb cannot hold one) is stored as U+FFFD; anything else the database refuses
(a token count past its column's range) fails that case with the database's reason.
Either way the other cases are recorded and the run finishes."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fault_kit import run_scripted_on_fleet, write_config
from fleet import case_rows, fleet_on, turn_rows, write_cases
from scripted_agent import Reply, ScriptedAgent, last_user_text

from agenttest_submit.cli.main import main
from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql import run_results as results
from agenttest_worker.store.sql import runs
from agenttest_worker.store.storable import storable_json, storable_row


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("a\x00b", "a\ufffdb"),
        ("\x00\x00", "\ufffd\ufffd"),
        ("a\\u0000b", "a\\u0000b"),  # the six characters \u0000, not a NUL: kept
        ("a\\\x00", "a\\\ufffd"),  # a backslash, then a NUL
        ("plain", "plain"),
    ],
)
def test_storable_json_replaces_nul_characters_only(value: str, stored: str) -> None:
    assert json.loads(storable_json(json.dumps({"k": [value]}))) == {"k": [stored]}
    assert storable_row({"output": value, "turn": 1}) == {"output": stored, "turn": 1}


def _reply(body: dict[str, Any]) -> Reply:
    first = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if "NUL" in first:
        return Reply(
            content="bad\x00byte, noted",
            tool_calls=[{"name": "lookup", "args": {"q": "x\x00y"}}],
            state={"note": "\x00"},
        )
    return Reply(content="fine, noted")


@pytest.mark.fleet
def test_a_reply_with_a_nul_character_is_recorded_on_postgres(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    cases = write_cases(
        tmp_path,
        [
            {
                "id": f"{name}{i}",
                "type": "multi_turn",
                "turns": [
                    {
                        "input": f"{name} please",
                        "assertions": [{"type": "contains", "value": "noted"}],
                    },
                    {"input": "again", "assertions": [{"type": "contains", "value": "noted"}]},
                ],
            }
            for i in range(2)
            for name in ("NUL", "OK")
        ],
    )
    with ScriptedAgent() as agent:
        agent.script("target", _reply)
        config = write_config(
            tmp_path,
            {"scripted": {"protocol": "openai", "base_url": agent.base_url, "model": "target"}},
        )
        with contextmanager(fleet_on)(redis_db, pg_database, demo_url, tmp_path) as fleet:
            fleet.start("w", concurrency=4)
            run_id = fleet.submit_no_wait(
                ["-i", str(cases), "-n", "scripted", "--config", str(config)]
            )
            fleet.wait_done(run_id, timeout=60)
            logs = fleet.logs()
    assert sorted(s for _, _, s in case_rows(pg_database, run_id)) == ["passed"] * 4
    records = {r.id: r for r in results.iter_results(pg_database, run_id)}
    bad = records["NUL0"].turns[0]
    assert bad.output == "bad\ufffdbyte, noted"
    assert json.dumps(bad.tool_calls[0].model_dump(mode="json")).count("\\ufffd") == 1
    assert records["OK0"].turns[1].output == "fine, noted"
    report = results.get_report(pg_database, run_id, "jsonl")
    assert report is not None and "bad\ufffdbyte" in report
    assert "UntranslatableCharacter" not in logs and "cannot contain NUL" not in logs


def _usage_reply(body: dict[str, Any]) -> Reply:
    if "HUGE" in last_user_text(body):
        usage = {"prompt_tokens": 10**12, "completion_tokens": 1, "total_tokens": 10**12 + 1}
        return Reply(content="noted", extra={"usage": usage})
    return Reply(content="noted")


@pytest.mark.fleet
def test_a_turn_the_database_refuses_fails_its_case_and_the_run_finishes(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """An agent reporting 10^12 tokens for one call: Postgres refuses the turn's agent-call
    row (integer out of range), the same way each time the turn would be played again.
    The case ends failed with the database's reason, instead of its task failing for
    ever and its run never finishing."""
    cases = write_cases(
        tmp_path,
        [
            {
                "id": name,
                "type": "multi_turn",
                "turns": [
                    {"input": "hello", "assertions": [{"type": "contains", "value": "noted"}]},
                    {
                        "input": f"{name} now",
                        "assertions": [{"type": "contains", "value": "noted"}],
                    },
                ],
            }
            for name in ("HUGE", "OK")
        ],
    )
    run_id = run_scripted_on_fleet(redis_db, pg_database, demo_url, tmp_path, cases, _usage_reply)
    records = {r.id: r for r in results.iter_results(pg_database, run_id)}
    assert records["OK"].status == "passed"
    huge = records["HUGE"]
    assert huge.status == "failed"
    assert huge.error is not None
    assert huge.error.startswith("turn 2 could not be stored: ") and "out of range" in huge.error
    assert [t.turn for t in huge.turns] == [1], "turn 1 kept; turn 2 was never recorded"
    run = runs.get_run(pg_database, run_id)
    assert run is not None and (run.passed, run.failed) == (1, 1)


def _huge_reply(body: dict[str, Any]) -> Reply:
    if "HUGE" in last_user_text(body):
        # Past 64 bits: neither Postgres's integer column nor SQLite can hold it.
        usage = {"prompt_tokens": 10**20, "completion_tokens": 1, "total_tokens": 10**20 + 1}
        return Reply(content="noted", extra={"usage": usage})
    return Reply(content="noted")


def _turns(*inputs: str) -> list[dict[str, Any]]:
    return [{"input": i, "assertions": [{"type": "contains", "value": "noted"}]} for i in inputs]


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_an_embedded_run_fails_only_the_case_whose_turn_the_database_refuses(
    database: str,
    pg_database: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The embedded runner writes its conversations in batches, so the database refuses
    a value only when a batch is written, long after the turn was played: the batch is
    written again step by step, and only the conversation whose step was refused ends,
    failed with the database's reason and the turns before it, as on a worker."""
    if database == "postgres":
        monkeypatch.setenv("AGENTTEST_DATABASE_URL", pg_database)
    cases = write_cases(
        tmp_path,
        [
            {"id": "MIDDLE", "type": "multi_turn", "turns": _turns("hi", "HUGE now", "bye")},
            {"id": "LAST", "type": "multi_turn", "turns": _turns("hi", "again", "HUGE end")},
            *(
                {"id": f"OK{i}", "type": "multi_turn", "turns": _turns("hi", "again", "bye")}
                for i in range(6)
            ),
        ],
    )
    out = tmp_path / "results.jsonl"
    with ScriptedAgent() as agent:
        agent.script("target", _huge_reply)
        entry = {"protocol": "openai", "base_url": agent.base_url, "model": "target"}
        config = write_config(tmp_path, {"scripted": entry})
        capsys.readouterr()
        code = main(["-i", str(cases), "-n", "scripted", "--config", str(config), "-o", str(out)])
    _, err = capsys.readouterr()
    assert code == 1, err
    assert "internal error" not in err and "Traceback" not in err
    progress = [line for line in err.splitlines() if " cases · " in line]
    assert progress and "8/8 cases · 6 passed · 2 failed" in progress[-1], err
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert {i: r["status"] for i, r in records.items() if i.startswith("OK")} == {
        f"OK{i}": "passed" for i in range(6)
    }
    for case_id, refused, kept in (("MIDDLE", 2, [1]), ("LAST", 3, [1, 2])):
        record = records[case_id]
        assert record["status"] == "failed", record
        assert record["error"].startswith(f"turn {refused} could not be stored: "), record
        assert [t["turn"] for t in record["turns"]] == kept
    url = get_settings().effective_database_url()
    run = runs.latest_run(url)
    assert run is not None
    assert (run.passed, run.failed, run.finished_cases) == (6, 2, 8)
    assert turn_rows(url, run.id) == {
        **{(f"OK{i}", t): 1 for i in range(6) for t in (1, 2, 3)},
        ("MIDDLE", 1): 1,
        ("LAST", 1): 1,
        ("LAST", 2): 1,
    }
    assert sorted(s for _, _, s in case_rows(url, run.id)) == ["failed"] * 2 + ["passed"] * 6


@pytest.mark.fleet
def test_a_config_the_workers_cannot_read_fails_the_cases_and_the_run_finishes(
    redis_db: str, pg_database: str, demo_url: str, tmp_path: Path
) -> None:
    """agenttest.yaml is stored as written and read again by each worker with its own
    environment: a ${VAR} set where the run was submitted but not on the workers failed
    every turn as a task, played again by the sweeper for ever. The cases now end failed,
    saying which variable, and the run finishes."""
    cases = write_cases(tmp_path, [{"id": f"V{i}", "input": "hello"} for i in range(3)])
    with ScriptedAgent() as agent:
        agent.script("target", _reply)
        entry = {"protocol": "openai", "base_url": "${AT_SUBMITTER_ONLY_URL}", "model": "target"}
        config = write_config(tmp_path, {"scripted": entry})
        with contextmanager(fleet_on)(redis_db, pg_database, demo_url, tmp_path) as fleet:
            fleet.start("w", concurrency=2)  # its environment has no AT_SUBMITTER_ONLY_URL
            fleet.env["AT_SUBMITTER_ONLY_URL"] = agent.base_url
            run_id = fleet.submit_no_wait(
                ["-i", str(cases), "-n", "scripted", "--config", str(config)]
            )
            fleet.wait_done(run_id, timeout=60)
    records = list(results.iter_results(pg_database, run_id))
    assert [r.status for r in records] == ["failed"] * 3
    for result in records:
        assert result.error is not None
        assert result.error.startswith("agenttest.yaml cannot be read where this turn ran: ")
        assert "AT_SUBMITTER_ONLY_URL is not set" in result.error
    run = runs.get_run(pg_database, run_id)
    assert run is not None and (run.status, run.failed) == ("done", 3)
