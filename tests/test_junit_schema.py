"""JUnit for CI: the report validates against Jenkins' junit-10.xsd (tests/fixtures), tells
infrastructure problems (<error>) from failed assertions (<failure>), and points every
testcase at its case file and line, also for a run reported again from the store."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xmlschema
from agent_servers import refused_url
from scripted_agent import ScriptedAgent, judge_verdict

from agenttest_submit.cli.main import main
from agenttest_worker.report import RunReport, render
from agenttest_worker.results import AssertionResult, CaseResult, TurnResult

XSD = Path(__file__).parent / "fixtures" / "junit-10.xsd"
RUN_ID = re.compile(r"ℹ Run: (\S+)")


@pytest.fixture(scope="module")
def schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(XSD))


def _assertion(passed: bool, reason: str, **fields: Any) -> AssertionResult:
    return AssertionResult(type="contains", value="x", passed=passed, reason=reason, **fields)


def _turn(**fields: Any) -> TurnResult:
    return TurnResult(
        **{"turn": 1, "input": "go", "input_source": "static", "output": "ok"} | fields
    )


def _cases() -> list[CaseResult]:
    hostile = "\x1b]0;owned\x07<b>&amp;]]></b> \ud800 \x00"
    return [
        CaseResult(
            id="ok", status="passed", turns=[_turn()], total_turns=1, file="c.jsonl", line=1
        ),
        CaseResult(
            id="wrong",
            name=hostile,
            status="failed",
            turns=[_turn(status="failed", assertions=[_assertion(False, f"reply was {hostile}")])],
            total_turns=1,
            file="cases/c.jsonl",
            line=2,
        ),
        CaseResult(
            id="down",
            status="failed",
            turns=[_turn(output=None, status="failed", error="agent error: connection refused")],
            total_turns=1,
            error="turn 1: agent error: connection refused",
            file="cases/c.jsonl",
            line=3,
        ),
        CaseResult(
            id="judge-down",
            status="failed",
            turns=[
                _turn(
                    status="failed",
                    assertions=[
                        AssertionResult(
                            type="agent",
                            passed=False,
                            reason="judge j failed: timeout after 2s",
                            error="timeout after 2s",
                        )
                    ],
                )
            ],
            total_turns=1,
        ),
        CaseResult(
            id="late",
            status="failed",
            turns=[_turn()],
            total_turns=1,
            error="timeout after 1s (the case's time limit)",
        ),
        CaseResult(id="asks", status="failed", turns=[_turn()], error="max turns (1) exceeded"),
        CaseResult(id="later", status="skipped", skip_reason="Agent awaiting input"),
    ]


def _report(results: list[CaseResult]) -> str:
    run = RunReport(
        results=results,
        agent="a\x01gent",
        input_label="cases/c.jsonl",
        total_cases=len(results),
        duration_s=1234.5,
        run_id="r-1",
    )
    return render("junit", run)


def test_the_fixture_holds_jenkins_rules(schema: xmlschema.XMLSchema) -> None:
    """The schema tests rely on: no `skipped` on <testsuites>, file and line on <testcase>."""
    case = '<testcase name="a" file="f" line="3"/>'
    ok = f'<testsuites><testsuite tests="1">{case}</testsuite></testsuites>'
    assert schema.is_valid(ok)
    assert not schema.is_valid('<testsuites skipped="0"><testsuite tests="0"/></testsuites>')
    assert not schema.is_valid(
        '<testsuites><testsuite tests="1"><testcase/></testsuite></testsuites>'
    )
    assert not schema.is_valid("<testsuites><testsuite/></testsuites>")


def test_junit_validates_against_jenkins_junit_10_xsd(schema: xmlschema.XMLSchema) -> None:
    text = _report(_cases())
    schema.validate(text)
    # Also when nothing ran.
    schema.validate(_report([]))


def test_infrastructure_problems_are_errors_and_failed_assertions_failures() -> None:
    root = ET.fromstring(_report(_cases()))
    (suite,) = root.findall("testsuite")
    outcome = {
        case.get("name", "").split("] ")[0].strip("["): [child.tag for child in case]
        for case in suite.findall("testcase")
    }
    assert outcome["ok"] == []
    assert outcome["wrong"][0] == "failure"
    assert outcome["down"][0] == "error"
    assert outcome["judge-down"][0] == "error"
    assert outcome["late"][0] == "error"
    # The agent kept asking: the test's verdict on the agent, not a broken run.
    assert outcome["asks"][0] == "failure"
    assert outcome["later"][0] == "skipped"
    for element in (root, suite):
        assert element.get("tests") == "7"
        assert element.get("failures") == "2"
        assert element.get("errors") == "3"
    assert suite.get("skipped") == "1" and root.get("skipped") is None
    error = suite.find("testcase/error")
    assert error is not None and "connection refused" in error.get("message", "")


def test_each_testcase_points_at_its_case_file_and_line() -> None:
    root = ET.fromstring(_report(_cases()))
    cases = {c.get("name", "").split("] ")[0].strip("["): c for c in root.iter("testcase")}
    assert (cases["ok"].get("file"), cases["ok"].get("line")) == ("c.jsonl", "1")
    assert (cases["down"].get("file"), cases["down"].get("line")) == ("cases/c.jsonl", "3")
    # A case that came from no file (a message, a generator) has neither attribute.
    assert cases["judge-down"].get("file") is None and cases["judge-down"].get("line") is None


# -- through a run and the store -------------------------------------------------------------


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as server:
        yield server


def _write_project(directory: Path, agent: ScriptedAgent) -> tuple[Path, Path]:
    config = {
        "agents": {
            "target": agent.entry("target"),
            "judge": agent.entry("judge"),
            "gone": {"protocol": "openai", "base_url": refused_url() + "/v1", "max_retries": 0},
        },
        "defaults": {"agent": "target", "judge": "judge"},
    }
    (directory / "agenttest.yaml").write_text(json.dumps(config), encoding="utf-8")
    cases = directory / "cases"
    cases.mkdir()
    lines = [
        {"id": "ok", "input": "hi", "assertions": [{"type": "contains", "value": "Hello"}]},
        {"id": "wrong", "input": "hi", "assertions": [{"type": "contains", "value": "Bye"}]},
        {"id": "down", "agent": "gone", "input": "hi"},
        {
            "id": "judged",
            "input": "hi",
            "assertions": [{"type": "agent", "options": {"metadata": {"criteria": "polite"}}}],
        },
    ]
    path = cases / "suite.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return directory / "agenttest.yaml", path


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_stored_run_reports_case_sources_and_turn_fields(
    store: str,
    agent: ScriptedAgent,
    schema: xmlschema.XMLSchema,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    if store == "postgres":
        monkeypatch.setenv("AGENTTEST_DATABASE_URL", request.getfixturevalue("pg_database"))
    monkeypatch.chdir(tmp_path)
    agent.script("target", lambda body: "Hello there.")
    agent.script("judge", lambda body: judge_verdict(False, "not polite enough"))
    config, _ = _write_project(tmp_path, agent)
    code = main(["-i", "cases/suite.jsonl", "--config", str(config)])
    out = capsys.readouterr().out
    assert code == 1, out
    match = RUN_ID.search(out)
    assert match, out
    run_id = match.group(1)

    # `report` exits as the run did: 1, a case failed.
    assert main(["report", run_id, "--format", "junit", "-o", "again.xml"]) == 1
    text = (tmp_path / "again.xml").read_text(encoding="utf-8")
    schema.validate(text)
    cases = {c.get("name"): c for c in ET.fromstring(text).iter("testcase")}
    assert {name: (c.get("file"), c.get("line")) for name, c in cases.items()} == {
        "ok": ("cases/suite.jsonl", "1"),
        "wrong": ("cases/suite.jsonl", "2"),
        "down": ("cases/suite.jsonl", "3"),
        "judged": ("cases/suite.jsonl", "4"),
    }
    assert cases["down"].find("error") is not None
    assert cases["wrong"].find("failure") is not None

    assert main(["report", run_id, "--format", "jsonl", "-o", "again.jsonl"]) == 1
    lines = (tmp_path / "again.jsonl").read_text(encoding="utf-8").splitlines()
    records = {r["id"]: r for r in map(json.loads, lines)}
    assert (records["wrong"]["file"], records["wrong"]["line"]) == ("cases/suite.jsonl", 2)
    [wrong_turn] = records["wrong"]["turns"]
    assert wrong_turn["assertion_errors"] == [wrong_turn["assertions"][0]["reason"]]
    assert records["judged"]["turns"][0]["assertion_errors"] == ["not polite enough"]
    assert "assertion_errors" not in records["ok"]["turns"][0]
