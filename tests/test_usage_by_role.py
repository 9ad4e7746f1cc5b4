"""Calls, tokens and cost by role: per case (`usage_by_role` on each JSONL record), per
run (with what the run called outside its conversations: generator agents at
submission, a --reporter agent), in `status RUN` while the run goes on and after it,
and added up by report/usage_tally.py.

Embedded, over real HTTP, against agents that report usage and count what they
reported (usage_kit.py): every figure is checked against what the servers counted.
The fleet's run is tests/test_usage_by_role_fleet.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import wait_until
from scripted_agent import ScriptedAgent, judge_verdict, project, run_case, say
from sqlalchemy.exc import OperationalError
from usage_kit import (
    UsageAgents,
    check_status,
    expected_line,
    same_usage,
    status_rows,
    write_suite,
)

from agenttest_submit.cli.main import main
from agenttest_worker.report.aggregation import build_report
from agenttest_worker.report.usage_tally import (
    ROLE_ORDER,
    UsageTally,
    run_usage,
    usage_dict,
    usage_line,
)
from agenttest_worker.results import CaseResult, RoleUsage, UsageRole, add_usage
from agenttest_worker.settings import get_settings
from agenttest_worker.store.sql import runs


@pytest.fixture
def agents() -> Iterator[UsageAgents]:
    with UsageAgents() as served:
        yield served


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _status(capsys: pytest.CaptureFixture[str], run_id: str) -> str:
    capsys.readouterr()
    assert main(["status", run_id]) == 0
    return capsys.readouterr().out


def _run_id() -> str:
    run = runs.latest_run(get_settings().effective_database_url())
    assert run is not None
    return run.id


def test_each_record_run_and_status_show_what_the_agents_counted(
    agents: UsageAgents, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = write_suite(tmp_path, agents)
    out = tmp_path / "out.jsonl"
    args = ["-i", str(cases), "-i", "agents:gen?count=1", "-n", "target", "--config", str(config)]
    assert main([*args, "-o", str(out), "--reporter", "agents:reporter"]) == 0
    records = _records(out)
    assert [r["id"] for r in records] == ["A", "S", "G1"]
    for record in records:
        assert same_usage(record["usage_by_role"], agents.counted(record["id"])), record
    a, s, g1 = (r["usage_by_role"] for r in records)
    # A: two target turns, three judges of which one asked twice; S: the simulator
    # answered once and ended the conversation once; G1 made one target call.
    assert [(role, u["calls"]) for role, u in a.items()] == [("target", 2), ("judge", 4)]
    assert {role: u["calls"] for role, u in s.items()} == {
        "target": 2,
        "simulator": 2,
        "judge": 1,
    }
    assert s["simulator"]["cost"] == 0.0, "an agent without pricing costs nothing"
    assert s["simulator"]["total_tokens"] > 0
    assert list(g1) == ["target"]

    run_id = _run_id()
    report = build_report(get_settings().effective_database_url(), run_id)
    # Outside any conversation: the generator at submission, the reporter after the run.
    outside = agents.counted(None)
    assert set(outside) == {"generator", "reporter"}
    assert same_usage(usage_dict(report.run_usage), outside)

    total = run_usage(report.results, report.run_usage)
    assert same_usage(usage_dict(total), agents.counted_all())
    assert list(total) == ["target", "judge", "simulator", "generator", "reporter"]
    assert usage_line(total) == expected_line(agents.counted_all())

    check_status(_status(capsys, run_id), agents.counted_all(), {"generator", "reporter"})


def test_status_shows_the_calls_of_a_run_still_running(
    agents: UsageAgents, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """S's target is slow: while it answers, status shows A's calls (its conversation is
    over) and the run running; once the run is done, everything."""
    config, cases = write_suite(tmp_path, agents, timeout=120)
    s_answers = agents.hold("S")  # until A's calls have been seen
    command = [sys.executable, "-m", "agenttest_submit.cli", "-i", str(cases), "-n", "target"]
    submitter = subprocess.Popen(
        [*command, "--config", str(config), "--parallel", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = get_settings().effective_database_url()

        def a_recorded() -> str | None:
            try:
                run = (
                    runs.latest_run(url) if Path(url.removeprefix("sqlite:///")).exists() else None
                )
            except OperationalError:  # the submitter is still creating the store's tables
                return None
            if run is None:
                return None
            text = _status(capsys, run.id)
            return text if ("judge", "judge") in status_rows(text) else None

        try:
            text = wait_until(a_recorded, 90, "A's calls to be recorded", step=0.1)
        finally:
            s_answers.set()
        assert "status    running" in text
        check_status(text, agents.counted("A"), set())
        _, err = submitter.communicate(timeout=60)
        assert submitter.returncode == 0, err
    finally:
        if submitter.poll() is None:
            submitter.kill()
            submitter.communicate()
    text = _status(capsys, _run_id())
    assert "status    done" in text
    check_status(text, agents.counted_all(), set())


def test_reeval_counts_the_new_judge_calls(
    agents: UsageAgents, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, cases = write_suite(tmp_path, agents)
    first = tmp_path / "first.jsonl"
    assert main(["-i", str(cases), "-n", "target", "--config", str(config), "-o", str(first)]) == 0
    played = {r["id"]: r["usage_by_role"] for r in _records(first)}
    agents.reset()
    again = tmp_path / "again.jsonl"
    assert main(["--reeval", "last", "--config", str(config), "-o", str(again)]) == 0
    for record in _records(again):
        usage = record["usage_by_role"]
        judged = agents.counted(record["id"])
        assert set(judged) == {"judge"}, "re-judging calls no target and no simulator"
        assert same_usage({"judge": usage["judge"]}, judged), record
        # What made the conversation is the stored conversation's, as its turns keep it.
        assert {r: u for r, u in usage.items() if r != "judge"} == {
            r: u for r, u in played[record["id"]].items() if r != "judge"
        }
    text = _status(capsys, _run_id())
    judge = status_rows(text)[("judge", "judge")]
    assert judge[:2] == (
        agents.counted_all()["judge"].calls,
        agents.counted_all()["judge"].total_tokens,
    )


def test_repeats_multiply_the_calls_of_each_repetition(agents: UsageAgents, tmp_path: Path) -> None:
    config, cases = write_suite(tmp_path, agents)
    out = tmp_path / "out.jsonl"
    args = ["-i", str(cases), "--id", "A", "-n", "target", "--config", str(config)]
    assert main([*args, "--repeat", "3", "-o", str(out)]) == 0
    records = _records(out)
    assert [(r["id"], r["repeat"]) for r in records] == [("A", 1), ("A", 2), ("A", 3)]
    for record in records:
        calls = {role: u["calls"] for role, u in record["usage_by_role"].items()}
        assert calls == {"target": 2, "judge": 4}, "each repetition its own calls"
    total = run_usage(CaseResult.model_validate(r) for r in records)
    assert same_usage(usage_dict(total), agents.counted("A"))
    assert total["target"].calls == 6 and total["judge"].calls == 12


def test_case_result_without_a_config_counts_calls_at_no_cost() -> None:
    """The engine's record keeps its old call (no config): calls and tokens by role, a
    validator's as the judge's, every cost 0."""
    with ScriptedAgent() as agent:
        agent.script("target", [say("Noted.")])
        agent.script("judge", [judge_verdict(True, "ok")])
        priced = {"pricing": {"prompt_per_million": 1000, "completion_per_million": 1000}}
        config = project(
            {"target": agent.entry("target", **priced), "judge": agent.entry("judge", **priced)}
        )
        case = {
            "id": "C",
            "input": "Hi",
            "assertions": [{"type": "agent", "use": "agents:judge"}],
        }
        result, _ = run_case(case, config)
    assert result.usage_by_role == {
        "target": RoleUsage(calls=1, prompt_tokens=10, completion_tokens=5, total_tokens=15),
        "judge": RoleUsage(calls=1, prompt_tokens=10, completion_tokens=5, total_tokens=15),
    }


# -- report/usage_tally.py -------------------------------------------------------------------------


def _usage(calls: int, prompt: int, completion: int, cost: float) -> RoleUsage:
    return RoleUsage(
        calls=calls,
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        cost=cost,
    )


def _record(case_id: str, usage: dict[UsageRole, RoleUsage] | None) -> CaseResult:
    return CaseResult(id=case_id, status="passed", usage_by_role=usage)


def test_the_tally_adds_records_as_they_stream_and_the_runs_own_usage() -> None:
    records = [
        _record("a", {"target": _usage(2, 100, 20, 0.1), "judge": _usage(1, 50, 5, 0.2)}),
        _record("b", None),  # a record from before usage_by_role, or one that called none
        _record("c", {"simulator": _usage(3, 30, 30, 0.0), "target": _usage(1, 10, 2, 0.2)}),
    ]
    tally = UsageTally({"generator": _usage(1, 1000, 500, 0.05)})
    for record in records:
        tally.add(record)
    assert tally.usage == {
        "target": _usage(3, 110, 22, 0.3),
        "judge": _usage(1, 50, 5, 0.2),
        "simulator": _usage(3, 30, 30, 0.0),
        "generator": _usage(1, 1000, 500, 0.05),
    }
    assert list(tally.usage) == ["target", "judge", "simulator", "generator"]
    assert tally.usage["target"].cost == 0.3, "rounded: 0.1 + 0.2 is not 0.30000000000000004"
    assert tally.as_dict() == {
        "target": {
            "calls": 3,
            "prompt_tokens": 110,
            "completion_tokens": 22,
            "total_tokens": 132,
            "cost": 0.3,
        },
        "judge": {
            "calls": 1,
            "prompt_tokens": 50,
            "completion_tokens": 5,
            "total_tokens": 55,
            "cost": 0.2,
        },
        "simulator": {
            "calls": 3,
            "prompt_tokens": 30,
            "completion_tokens": 30,
            "total_tokens": 60,
            "cost": 0.0,
        },
        "generator": {
            "calls": 1,
            "prompt_tokens": 1000,
            "completion_tokens": 500,
            "total_tokens": 1500,
            "cost": 0.05,
        },
    }
    json.dumps(tally.as_dict())  # JSON-ready
    assert tally.line() == (
        "Usage: target 3 calls, 132 tokens, $0.3000 · judge 1 call, 55 tokens, $0.2000"
        " · simulator 3 calls, 60 tokens, $0.0000 · generator 1 call, 1,500 tokens, $0.0500"
    )
    assert run_usage(records, {"generator": _usage(1, 1000, 500, 0.05)}) == tally.usage


def test_the_line_shows_cost_only_when_priced_and_nothing_without_calls() -> None:
    free = {"target": _usage(120, 40_000, 5_000, 0.0), "reporter": _usage(1, 1, 0, 0.0)}
    assert usage_line(free) == "Usage: target 120 calls, 45,000 tokens · reporter 1 call, 1 token"
    assert usage_line(free, priced=True) == (
        "Usage: target 120 calls, 45,000 tokens, $0.0000 · reporter 1 call, 1 token, $0.0000"
    )
    assert usage_line({}) == ""
    assert UsageTally().line() == ""
    assert UsageTally().as_dict() == {}
    assert usage_line({"judge": RoleUsage()}) == "", "a role with no call is left out"


def test_add_usage_adds_in_place() -> None:
    total: dict[UsageRole, RoleUsage] = {"judge": _usage(1, 10, 1, 0.25)}
    same = add_usage(total, {"judge": _usage(2, 20, 2, 0.5), "target": _usage(1, 1, 1, 0.0)})
    assert same is total
    assert total == {"judge": _usage(3, 30, 3, 0.75), "target": _usage(1, 1, 1, 0.0)}
    assert ROLE_ORDER == ("target", "judge", "simulator", "generator", "reporter")


def test_a_hundred_thousand_records_tally_in_one_pass() -> None:
    """Streaming: each record is read once and nothing of it is kept."""
    one = _record("x", {"target": _usage(1, 10, 5, 0.0001), "judge": _usage(2, 20, 4, 0.0002)})
    read = 0

    def stream() -> Iterator[CaseResult]:
        nonlocal read
        for _ in range(100_000):
            read += 1
            yield one

    total = run_usage(stream())
    assert read == 100_000
    assert total["target"].model_dump(exclude={"cost"}) == {
        "calls": 100_000,
        "prompt_tokens": 1_000_000,
        "completion_tokens": 500_000,
        "total_tokens": 1_500_000,
    }
    assert total["target"].cost == pytest.approx(10.0)
    assert total["judge"].calls == 200_000
