"""Failure attribution: every failed or skipped case carries a `cause`, from real runs.

One suite against agents with known behaviour, served over HTTP: a target that answers
wrong, a judge that disagrees with itself (asked three times, it says pass once and
fail twice), a simulator that errors, one that says it left its persona and one that
never reaches its goal, a target that answers 503 and one too slow for its timeout, a
judge nobody can connect to, a target that asks for input nobody gives
(`on_missing_input: fail`), and a coin-flip case whose two repetitions disagree. Each
record says why; the console, JSON, JUnit, HTML, the viewer and the diff sum them up by
cause.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scripted_agent import (
    Body,
    Reply,
    ScriptedAgent,
    fail,
    judge_verdict,
    last_user_text,
    say,
    simulator_turn,
)

from agenttest_submit.cli.main import main
from agenttest_submit.commands.viewer.queries import RunViews
from agenttest_worker.report import audited_cause, read_cause
from agenttest_worker.results import CaseResult
from agenttest_worker.settings import get_settings

RIGHT = [{"type": "contains", "value": "right"}]
ASKING = say("Which city?", awaiting_input=True)

CASES: list[dict[str, Any]] = [
    {"id": "fine", "input": "fine question", "assertions": RIGHT},
    {"id": "agent-fails", "input": "agent question", "assertions": RIGHT},
    {
        "id": "judge-splits",
        "input": "judge question",
        "assertions": [
            {"type": "agent", "votes": 3, "options": {"metadata": {"criteria": "answers kindly"}}}
        ],
    },
    {
        "id": "judge-unreachable",
        "input": "fine question",
        "assertions": [
            {
                "type": "agent",
                "use": "agents:gone",
                "options": {"metadata": {"criteria": "answers kindly"}},
            }
        ],
    },
    {
        "id": "sim-errors",
        "input": "sim question",
        "simulator": {"use": "agents:junk-sim", "metadata": {"goal": "book", "max_turns": 3}},
    },
    {
        "id": "sim-off-persona",
        "input": "sim question",
        "simulator": {"use": "agents:persona-sim", "metadata": {"goal": "book", "max_turns": 3}},
    },
    {
        "id": "sim-never-done",
        "input": "sim question",
        "simulator": {"use": "agents:sim", "metadata": {"goal": "book", "max_turns": 2}},
    },
    {"id": "infra-503", "input": "infra question", "assertions": RIGHT},
    {"id": "infra-timeout", "input": "slow question", "assertions": RIGHT},
    {"id": "input-missing", "turns": [{"input": "input question"}], "on_missing_input": "fail"},
    {"id": "coin", "input": "coin question", "repeat": 2, "assertions": RIGHT},
    # A flaky connection: one repetition gets a 503, the other its answer.
    {"id": "flaky-link", "input": "link question", "repeat": 2, "assertions": RIGHT},
]
EXPECTED = {
    "agent-fails": "agent",
    "judge-splits": "judge",
    "judge-unreachable": "infrastructure",
    "sim-errors": "simulator",
    "sim-off-persona": "simulator",
    "sim-never-done": "simulator",
    "infra-503": "infrastructure",
    "infra-timeout": "infrastructure",
    "input-missing": "input",
}
SUMMARY = {"agent": 1, "judge": 1, "simulator": 3, "infrastructure": 4, "flake": 1, "input": 1}


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def script(agent: ScriptedAgent, fine: str = "right") -> None:
    """Every agent's known behaviour (`fine`: what the target answers the fine case)."""
    coin = itertools.cycle(["right", "wrong"])
    link = itertools.cycle([fail(503, "connection reset upstream"), say("right")])
    votes = itertools.cycle([True, False, False])
    lock = threading.Lock()
    answers: dict[str, Reply | str] = {
        "fine question": fine,
        "agent question": "wrong",
        "judge question": "hello",
        "infra question": fail(503, "upstream down"),
        "slow question": Reply(content="right", delay=4),
        "input question": ASKING,
    }

    def target(body: Body) -> Reply | str:
        said = last_user_text(body)
        if "coin question" in said:
            with lock:
                return next(coin)
        if "link question" in said:
            with lock:
                return next(link)
        return next((reply for key, reply in answers.items() if key in said), ASKING)

    def judge(body: Body) -> Reply | str:
        with lock:
            return judge_verdict(next(votes), "kind enough?")

    agent.script("target", target)
    agent.script("judge", judge)
    agent.script("sim", lambda body: simulator_turn("Oslo"))
    agent.script("junk-sim", lambda body: say("this is not what a simulator answers"))
    off = {
        "input": "Sure, I can help",
        "left_persona": True,
        "reasoning": "I answered as the agent",
    }
    agent.script("persona-sim", lambda body: say(json.dumps(off)))


class Project:
    """agenttest.yaml and the case file for the agents `script` serves."""

    def __init__(self, agent: ScriptedAgent, tmp_path: Path, capsys: Any = None) -> None:
        self.agent, self.tmp_path, self.capsys = agent, tmp_path, capsys
        gone = {"protocol": "openai", "base_url": f"http://127.0.0.1:{closed_port()}/v1"}
        agents = {
            "bot": agent.entry("target", max_retries=0, timeout=2),
            "grader": agent.entry("judge", max_retries=0),
            "sim": agent.entry("sim", max_retries=0),
            "junk-sim": agent.entry("junk-sim", max_retries=0),
            "persona-sim": agent.entry("persona-sim", max_retries=0),
            "gone": {**gone, "model": "m", "timeout": 2, "max_retries": 0},
        }
        self.config = tmp_path / "agenttest.yaml"
        config = {"agents": agents, "defaults": {"judge": "agents:grader"}}
        self.config.write_text(json.dumps(config), encoding="utf-8")
        self.cases = tmp_path / f"causes-{tmp_path.name}.jsonl"
        self.cases.write_text("".join(json.dumps(c) + "\n" for c in CASES), encoding="utf-8")

    def submit(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(list(args))
        out, err = self.capsys.readouterr()
        return code, out, err

    def args(self, *more: str) -> list[str]:
        args = ["-i", str(self.cases), "-n", "bot", "--config", str(self.config)]
        return [*args, "--parallel", "1", *more]

    def run(self, *more: str) -> tuple[int, str, str]:
        return self.submit(*self.args(*more))

    def last_run(self) -> str:
        return str(
            json.loads(self.submit("runs", "--last", "1", "--format", "json")[1])[0]["run_id"]
        )


@pytest.fixture
def project(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Project]:
    with ScriptedAgent() as agent:
        script(agent)
        yield Project(agent, tmp_path, capsys)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_every_failed_or_skipped_case_says_why(project: Project, tmp_path: Path) -> None:
    out_file = tmp_path / "out.jsonl"
    code, out, err = project.run("-o", str(out_file))
    assert code == 1, out + err
    records = _records(out_file)
    causes = {r["id"]: r.get("cause") for r in records if r.get("repeats") is None}
    assert causes == {"fine": None, **EXPECTED}, records
    statuses = {r["id"]: r["status"] for r in records}
    assert statuses["sim-errors"] == "skipped" and statuses["input-missing"] == "failed"
    off = next(r for r in records if r["id"] == "sim-off-persona")
    assert off["status"] == "skipped"
    assert off["skip_reason"] == (
        "simulator error: agents:persona-sim left its persona: I answered as the agent"
    )
    # The coin's repetitions disagree: the failed one is a flake, the passed one has none.
    coin = sorted((r["status"], r.get("cause")) for r in records if r["id"] == "coin")
    assert coin == [("failed", "flake"), ("passed", None)]
    # The flaky connection's failed repetition is the infrastructure's, not a flake.
    link = sorted((r["status"], r.get("cause")) for r in records if r["id"] == "flaky-link")
    assert link == [("failed", "infrastructure"), ("passed", None)]
    assert "Causes: 1 agent, 1 judge, 3 simulator, 4 infrastructure, 1 flake, 1 input" in out
    assert "(cause: flake)" in out  # on the coin's failed repetition


def test_summaries_by_cause_in_every_report(project: Project) -> None:
    code, _, _ = project.run()
    assert code == 1
    run_id = project.last_run()
    code, out, _ = project.submit("report", run_id, "--format", "json")
    document = json.loads(out)
    assert document["summary"]["causes"] == SUMMARY
    by_id = {r["id"]: r.get("cause") for r in document["results"] if r.get("repeats") is None}
    assert by_id == {"fine": None, **EXPECTED}
    # JUnit: the infrastructure's failures are errors, the agent's a failure.
    _, out, _ = project.submit("report", run_id, "--format", "junit")
    root = ET.fromstring(out)
    outcome = {
        (case.get("name") or "").strip("[]"): [child.tag for child in case]
        for case in root.iter("testcase")
    }
    for case_id in ("infra-503", "infra-timeout", "judge-unreachable", "flaky-link"):
        assert "error" in outcome[case_id], outcome
    assert "failure" in outcome["agent-fails"]
    properties = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert properties["causes"] == (
        "1 agent, 1 judge, 3 simulator, 4 infrastructure, 1 flake, 1 input"
    )
    # HTML: the page's data carries the summary by cause, and each case row its cause.
    _, page, _ = project.submit("report", run_id, "--format", "html")
    assert '"causes":{"agent":1,"judge":1,"simulator":3' in page.replace(" ", "")
    # The viewer reads the same from the store.
    views = RunViews(get_settings().effective_database_url())
    header = views.header(run_id)
    assert header is not None and header["summary"]["causes"] == SUMMARY
    rows = {row["id"]: row.get("cause") for row in views.rows(run_id) or []}
    assert rows["infra-503"] == "infrastructure" and rows["coin"] == "flake"
    assert rows["fine"] is None
    case = views.case(run_id, "coin")
    assert case is not None
    assert sorted(str(r.get("cause")) for r, _ in case["records"]) == ["None", "flake"]


def test_the_nightly_diff_sums_up_why_cases_fail_now(project: Project) -> None:
    project.run()
    project.run()
    _, out, _ = project.submit("diff", "--format", "json")
    document = json.loads(out)
    assert document["causes"] == SUMMARY
    _, out, _ = project.submit("diff")
    assert (
        "Failing now, by cause: 1 agent, 1 judge, 3 simulator, 4 infrastructure, 1 flake, 1 input"
        in out
    )
    _, out, _ = project.submit("diff", "--format", "markdown")
    assert "Failing now, by cause: 1 agent" in out


def _judged(cause: str, criteria: str) -> CaseResult:
    return CaseResult.model_validate(
        {
            "id": "T",
            "status": "failed",
            "cause": cause,
            "turns": [
                {
                    "turn": 1,
                    "input": "hi",
                    "output": "hello",
                    "status": "failed",
                    "assertions": [
                        {
                            "type": "agent",
                            "passed": False,
                            "reason": "not kind",
                            "options": {"metadata": {"criteria": criteria}},
                        }
                    ],
                }
            ],
        }
    )


def test_an_audit_of_the_judges_hands_in_its_unstable_criteria() -> None:
    # Criteria named as the audit names them (report/audit_stats.py).
    unstable = frozenset({"agent: answers kindly"})
    assert audited_cause(_judged("agent", "answers kindly"), unstable) == "judge"
    assert audited_cause(_judged("agent", "answers briefly"), unstable) == "agent"
    assert audited_cause(_judged("agent", "answers kindly"), frozenset()) == "agent"
    # The criteria's bare text is not the audit's name for them.
    assert audited_cause(_judged("agent", "answers kindly"), frozenset({"answers kindly"})) == (
        "agent"
    )
    # A failure the infrastructure explains keeps its cause; an unstable criterion wins
    # over a flake (the judge flipping is why the repetitions disagreed).
    assert audited_cause(_judged("infrastructure", "answers kindly"), unstable) == (
        "infrastructure"
    )
    assert audited_cause(_judged("flake", "answers kindly"), unstable) == "judge"
    assert read_cause(_judged("agent", "answers kindly"), True, unstable) == "judge"
    assert read_cause(_judged("agent", "answers briefly"), True, unstable) == "flake"
