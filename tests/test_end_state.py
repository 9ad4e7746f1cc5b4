"""End state: assertions on the state an agent left in its system (`state:` on an agent
entry or a case), read after the conversation and, with `each_turn`, after every turn.

The agent (tests/agent_servers.py ExpenseSystem) keeps an expense per session, a draft
until the user says "submit", and serves it at /state/SESSION. The honest one submits
it; the one built to fail only says so. The fleet's run is tests/test_end_state_fleet.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_servers import AgentServer, ExpenseSystem, Reply, refused_url

from agenttest_submit.cli.main import main

SUBMITTED = {"type": "json_path", "path": "$.state.expense.status", "value": "submitted"}


def expense_case(case_id: str, agent: str, **more: Any) -> dict[str, Any]:
    return {
        "id": case_id,
        "agent": agent,
        "turns": [{"input": "File my 42 EUR lunch"}, {"input": "Please submit it"}],
        "final_assertions": [SUBMITTED],
        **more,
    }


@pytest.fixture
def honest() -> Iterator[ExpenseSystem]:
    with ExpenseSystem() as system:
        yield system


@pytest.fixture
def liar() -> Iterator[ExpenseSystem]:
    with ExpenseSystem(submits=False) as system:
        yield system


def write_project(
    tmp_path: Path, agents: dict[str, Any], cases: list[dict[str, Any]], name: str = "cases.jsonl"
) -> list[str]:
    config = tmp_path / "agenttest.yaml"
    config.write_text(yaml.safe_dump({"agents": agents}), encoding="utf-8")
    path = tmp_path / name
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return ["-i", str(path), "--config", str(config)]


def play(
    capsys: pytest.CaptureFixture[str], args: list[str], out: Path
) -> tuple[int, dict[str, dict[str, Any]], str]:
    code = main([*args, "-o", str(out), "--format", "jsonl"])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return code, {r["id"]: r for r in records}, err


def test_the_state_the_agent_left_passes_a_case_and_its_claim_alone_fails_one(
    tmp_path: Path,
    honest: ExpenseSystem,
    liar: ExpenseSystem,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Both say "Your expense is submitted."; only the honest one's system says so too.
    claims = {"type": "contains", "value": "submitted"}
    cases = [expense_case("honest", "honest"), expense_case("liar", "liar")]
    for case in cases:
        case["turns"][1]["assertions"] = [claims]
    args = write_project(tmp_path, {"honest": honest.entry(), "liar": liar.entry()}, cases)
    code, records, _ = play(capsys, args, tmp_path / "out.jsonl")
    assert code == 1
    assert records["honest"]["status"] == "passed"
    assert records["honest"]["end_state"]["expense"]["status"] == "submitted"
    assert records["liar"]["status"] == "failed"
    assert records["liar"]["turns"][1]["status"] == "passed"  # what it said
    [final] = records["liar"]["final_assertions"]
    assert not final["passed"]
    assert '"draft"' in final["reason"] and '"submitted"' in final["reason"]
    assert records["liar"]["end_state"]["expense"]["status"] == "draft"
    # Read once each, after the conversation, with its session id (GET by default).
    for system in (honest, liar):
        [read] = system.state_requests
        assert read.method == "GET"
        assert read.path == f"/state/{next(iter(system.expenses))}"
        assert len(system.expenses) == 1


def test_each_turn_reads_the_state_after_every_turn_for_its_assertions(
    tmp_path: Path,
    honest: ExpenseSystem,
    liar: ExpenseSystem,
    capsys: pytest.CaptureFixture[str],
) -> None:
    draft = {"type": "json_path", "path": "$.state.expense.status", "value": "draft"}
    cases = []
    for agent in ("honest", "liar"):
        case = expense_case(agent, agent, final_assertions=[])
        case["turns"][0]["assertions"] = [draft]
        case["turns"][1]["assertions"] = [SUBMITTED]
        cases.append(case)
    agents = {name: s.entry(each_turn=True) for name, s in (("honest", honest), ("liar", liar))}
    code, records, _ = play(capsys, write_project(tmp_path, agents, cases), tmp_path / "o.jsonl")
    assert code == 1
    assert records["honest"]["status"] == "passed"
    statuses = [t["end_state"]["expense"]["status"] for t in records["honest"]["turns"]]
    assert statuses == ["draft", "submitted"]
    liar_turns = records["liar"]["turns"]
    assert [t["status"] for t in liar_turns] == ["passed", "failed"]
    assert '"draft"' in liar_turns[1]["assertions"][0]["reason"]
    # After each of the two turns, and once after the conversation.
    assert len(honest.state_requests) == 3 and len(liar.state_requests) == 3


def test_a_state_url_that_fails_fails_the_case_as_infrastructure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ExpenseSystem(state_status=500) as down, ExpenseSystem() as elsewhere:
        agents = {
            "down": down.entry(),
            # A reply without the state where `response` says it is.
            "elsewhere": elsewhere.entry(response="$.data.nothing"),
            "fine": elsewhere.entry(),
        }
        cases = [
            expense_case("down", "down"),
            expense_case("elsewhere", "elsewhere"),
            expense_case("fine", "fine"),
        ]
        code, records, _ = play(
            capsys, write_project(tmp_path, agents, cases), tmp_path / "o.jsonl"
        )
        session = next(iter(down.expenses))
        state_url = f"{down.base_url}/state/{session}"
    assert code == 1
    down_record = records["down"]
    assert down_record["status"] == "failed"
    error = down_record["error"]
    assert error.startswith("infrastructure error: cannot read the end state (GET ")
    assert state_url in error and "HTTP 500" in error
    # Its final assertions were not run: they would judge a state never read.
    assert down_record["final_assertions"] == []
    assert "end_state" not in down_record
    assert "has nothing at $.data.nothing" in records["elsewhere"]["error"]
    assert records["elsewhere"]["error"].startswith("infrastructure error")
    # One case's broken state URL does not sink another's.
    assert records["fine"]["status"] == "passed"


def test_an_unreachable_or_unreadable_state_names_its_url_without_its_secrets(
    tmp_path: Path,
    honest: ExpenseSystem,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("STATE_KEY", "sk-state-0a1b2c3d4e")
    nowhere = refused_url()
    with AgentServer() as pages:
        pages.always("/state", Reply(body="<html>maintenance</html>"))
        agents = {
            "unreachable": honest.entry(url=nowhere + "/state/{{session_id}}?api_key=${STATE_KEY}"),
            "not-json": honest.entry(url=pages.url("/state"), response="$"),
        }
        cases = [expense_case("unreachable", "unreachable"), expense_case("not-json", "not-json")]
        code, records, _ = play(capsys, write_project(tmp_path, agents, cases), tmp_path / "o")
        page_url = pages.url("/state")
    assert code == 1
    unreachable = records["unreachable"]["error"]
    assert unreachable.startswith(
        f"infrastructure error: cannot read the end state (GET {nowhere}/state/"
    )
    assert "api_key=***" in unreachable and "cannot reach unreachable" in unreachable
    assert "sk-state-0a1b2c3d4e" not in (tmp_path / "o").read_text(encoding="utf-8")
    not_json = records["not-json"]["error"]
    assert not_json.startswith(f"infrastructure error: cannot read the end state (GET {page_url})")
    assert "not JSON" in not_json and "maintenance" in not_json


def test_a_state_url_that_fails_after_a_turn_fails_that_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ExpenseSystem(state_status=503) as down:
        args = write_project(
            tmp_path, {"down": down.entry(each_turn=True)}, [expense_case("c", "down")]
        )
        code, records, _ = play(capsys, args, tmp_path / "o.jsonl")
    assert code == 1
    [turn] = records["c"]["turns"]  # the conversation ended at its first turn
    assert turn["status"] == "failed"
    assert turn["error"].startswith("infrastructure error: cannot read the end state (GET ")
    assert "HTTP 503" in turn["error"]


def test_a_case_state_overrides_the_agent_entry_and_posts_its_body(
    tmp_path: Path, honest: ExpenseSystem, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = honest.entry(url=honest.base_url + "/nowhere/{{session_id}}")
    state = {
        "url": honest.base_url + "/state/{{session_id}}",
        "method": "POST",
        "request": {"who": "{{case_id}}", "after": "{{turn}}"},
        "response": "$.data.expense",
    }
    final = {"type": "json_path", "path": "$.state.status", "value": "submitted"}
    case = expense_case("posted", "bot", state=state, final_assertions=[final])
    code, records, _ = play(capsys, write_project(tmp_path, {"bot": entry}, [case]), tmp_path / "o")
    assert code == 0, records
    [read] = honest.state_requests
    assert read.method == "POST"
    assert read.json == {"who": "posted", "after": 2}
    assert records["posted"]["end_state"]["status"] == "submitted"


def test_a_secret_header_reaches_the_state_url_and_nothing_keeps_it(
    tmp_path: Path,
    honest: ExpenseSystem,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("END_STATE_TOKEN", "st-agent-8f3e1c2a9b")
    monkeypatch.setenv("END_STATE_CASE_TOKEN", "st-case-5d7a0e4b61")
    entry = honest.entry(headers={"X-State-Token": "${END_STATE_TOKEN}"})
    case_state = {
        "url": honest.base_url + "/state/{{session_id}}",
        "headers": {"X-State-Token": "${END_STATE_CASE_TOKEN}"},
        "response": "$.data",
    }
    cases = [expense_case("by-agent", "bot"), expense_case("by-case", "bot", state=case_state)]
    args = write_project(tmp_path, {"bot": entry}, cases)
    code, records, _ = play(capsys, args, tmp_path / "out.jsonl")
    assert code == 0, records
    sent = sorted(r.headers["X-State-Token"] for r in honest.state_requests)
    assert sent == ["st-agent-8f3e1c2a9b", "st-case-5d7a0e4b61"]
    # The state service echoed it: masked in what is kept.
    assert records["by-agent"]["end_state"]["token"] == "***"
    assert records["by-case"]["end_state"]["token"] == "***"
    html = tmp_path / "report.html"
    assert main([*args, "-o", str(html), "--format", "html"]) == 0
    capsys.readouterr()
    # Nowhere on disk: the store, the reports.
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"st-agent-8f3e1c2a9b" not in data, path
            assert b"st-case-5d7a0e4b61" not in data, path


def test_the_html_report_shows_the_end_state_as_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ExpenseSystem(note="<img src=x onerror=alert(1)>") as system:
        args = write_project(tmp_path, {"bot": system.entry()}, [expense_case("c", "bot")])
        html = tmp_path / "report.html"
        assert main([*args, "-o", str(html), "--format", "html"]) == 0
    capsys.readouterr()
    page = html.read_text(encoding="utf-8")
    assert '"end_state":{"expense":' in page
    assert "\\u003cimg src=x onerror=alert(1)>" in page
    assert "<img src=x" not in page


def test_the_expense_is_read_at_the_top_level_too(
    tmp_path: Path, honest: ExpenseSystem, capsys: pytest.CaptureFixture[str]
) -> None:
    # The spec's own `$.expense.status`: the state's keys are the final document's too.
    spec_style = {"type": "json_path", "path": "$.expense.status", "value": "submitted"}
    case = expense_case("c", "bot", final_assertions=[spec_style])
    args = write_project(tmp_path, {"bot": honest.entry()}, [case])
    code, records, _ = play(capsys, args, tmp_path / "o.jsonl")
    assert code == 0, records


# -- refused before anything runs ------------------------------------------------------------


def test_dry_run_refuses_a_malformed_state_with_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agenttest.yaml"
    config.write_text(
        "agents:\n"
        "  bot:\n"
        "    protocol: http\n"
        "    url: http://127.0.0.1:9/chat\n"
        "    state:\n"
        "      method: DELETE\n"
        "      url: http://127.0.0.1:9/state/{{session_id}}\n",
        encoding="utf-8",
    )
    cases = tmp_path / "cases.jsonl"
    good = {"id": "ok", "input": "hi"}
    bad = {"id": "bad", "input": "hi", "state": {"url": "ftp://x/{{sesion}}", "response": "$[["}}
    get = {"id": "get", "input": "hi", "state": {"url": "http://x/s", "request": {"a": 1}}}
    cases.write_text("".join(json.dumps(c) + "\n" for c in (good, bad, get)), encoding="utf-8")
    code = main(["-i", str(cases), "-n", "bot", "--config", str(config), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert f"{config}:6: agents.bot.state.method: Input should be 'GET' or 'POST'" in err

    config.write_text(
        "agents:\n  bot:\n    protocol: http\n    url: http://127.0.0.1:9/chat\n", encoding="utf-8"
    )
    code = main(["-i", str(cases), "-n", "bot", "--config", str(config), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{cases}:2 (test 'bad'): state.url: unknown placeholder {{{{sesion}}}}" in err
    assert f"{cases}:2 (test 'bad'): state.response: invalid JSONPath" in err
    assert f"{cases}:3 (test 'get'): state.request: a state `request` body is sent with" in err

    tests = tmp_path / "tests.yaml"
    tests.write_text(
        "tests:\n"
        "  - name: t1\n"
        "    user_input: hi\n"
        "    state:\n"
        "      url: http://127.0.0.1:9/state\n"
        "      each_turns: true\n",
        encoding="utf-8",
    )
    code = main(["-i", str(tests), "-n", "bot", "--config", str(config), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{tests}:6 (test 't1'): state.each_turns: unknown field" in err


def test_a_yaml_test_declares_its_state_too(
    tmp_path: Path, honest: ExpenseSystem, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = honest.entry()
    del entry["state"]
    config = tmp_path / "agenttest.yaml"
    config.write_text(yaml.safe_dump({"agents": {"bot": entry}}), encoding="utf-8")
    tests = tmp_path / "tests.yaml"
    test = {
        "name": "submits",
        "rounds": [{"user_input": "File my lunch"}, {"user_input": "Submit it"}],
        "state": {"url": honest.base_url + "/state/{{session_id}}", "response": "$.data"},
        "final_assertions": [SUBMITTED],
    }
    tests.write_text(yaml.safe_dump({"tests": [test]}), encoding="utf-8")
    out = tmp_path / "o.jsonl"
    code = main(["-i", str(tests), "-n", "bot", "--config", str(config), "-o", str(out)])
    assert code == 0, capsys.readouterr()
    [record] = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert record["end_state"]["expense"]["status"] == "submitted"


def test_the_schema_lists_state(capsys: pytest.CaptureFixture[str]) -> None:
    for kind, model in (("cases", "Case"), ("yaml", "YamlTest"), ("config", "AgentConfig")):
        assert main(["schema", kind]) == 0
        schema = json.loads(capsys.readouterr().out)
        defs = schema["$defs"]
        assert "state" in defs[model]["properties"], kind
        endpoint = defs["StateEndpoint"]
        assert set(endpoint["properties"]) == {
            "url",
            "method",
            "headers",
            "request",
            "response",
            "each_turn",
        }
        assert endpoint["required"] == ["url"]
