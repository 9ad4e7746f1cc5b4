"""Timeouts that hold whatever runs the turn: per call, per turn, per case, per run.

They are enforced in the event loop around the turn's work, not by the worker pool
(Celery's time limits need prefork and signals), so the same limits hold in the
embedded runner and on a threads-pool worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted_agent import ScriptedAgent, project, run_case, say

from agenttest_submit.cli.main import main
from agenttest_worker.engine import RunOptions


def _judged_case() -> dict:
    return {
        "id": "J1",
        "type": "multi_turn",
        "turns": [
            {
                "input": "Hello",
                "assertions": [
                    {
                        "type": "agent",
                        "use": "agents:judge",
                        "options": {"metadata": {"criteria": "c"}},
                    }
                ],
            },
            {"input": "Again"},
        ],
    }


def test_a_slow_judge_is_cut_by_the_turn_timeout() -> None:
    with ScriptedAgent() as agent:
        agent.script("target", ["Hi.", "Hi again."])
        agent.script("judge", [say(json.dumps({"passed": True, "reason": "fine"}), delay=1.5)])
        config = project(
            {"target": agent.entry("target"), "judge": agent.entry("judge", timeout=5)}
        )
        result, _ = run_case(_judged_case(), config, RunOptions(target="target", turn_timeout=0.15))
    assert result.status == "failed"
    assert result.turns[0].error == "timeout after 150ms (the turn's time limit)"
    assert result.total_turns == 1, "the conversation ends at the turn that ran out of time"


def test_the_case_timeout_bounds_the_judge_too() -> None:
    with ScriptedAgent() as agent:
        agent.script("target", ["Hi.", "Hi again."])
        agent.script("judge", [say(json.dumps({"passed": True, "reason": "fine"}), delay=1.5)])
        config = project(
            {"target": agent.entry("target"), "judge": agent.entry("judge", timeout=5)}
        )
        result, _ = run_case(_judged_case(), config, RunOptions(target="target", case_timeout=0.15))
    assert result.status == "failed"
    assert result.turns[0].error == "timeout after 150ms (the case's time limit)"


def test_a_slow_simulator_after_a_recorded_turn_fails_the_case() -> None:
    case = {
        "id": "S1",
        "input": "Hello",
        "simulator": {"use": "agents:sim", "metadata": {"goal": "g"}},
    }
    with ScriptedAgent() as agent:
        agent.script("target", [say("What amount?")])
        agent.script("sim", [say('{"input": "5", "goal_achieved": false}', delay=1.5)])
        config = project({"target": agent.entry("target"), "sim": agent.entry("sim", timeout=5)})
        result, _ = run_case(case, config, RunOptions(target="target", turn_timeout=0.15))
    # Turn 1 itself ran and is kept; the time ran out writing the next input.
    assert result.turns[0].error is None and result.turns[0].output == "What amount?"
    assert result.status == "failed"
    assert result.error == "timeout after 150ms (the turn's time limit)"


def test_turn_timeout_flag_on_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ScriptedAgent() as agent:
        agent.script("target", lambda body: say("Slow reply.", delay=1.0))
        config = tmp_path / "agenttest.yaml"
        config.write_text(json.dumps({"agents": {"target": agent.entry("target", timeout=5)}}))
        cases = tmp_path / "cases.jsonl"
        cases.write_text(json.dumps({"id": "T", "input": "Hi"}) + "\n")
        out = tmp_path / "out.jsonl"
        code = main(
            [
                "-i",
                str(cases),
                "-n",
                "target",
                "--config",
                str(config),
                "--turn-timeout",
                "150ms",
                "-o",
                str(out),
            ]
        )
    assert code == 1
    record = json.loads(out.read_text())
    assert record["turns"][0]["error"] == "timeout after 150ms (the turn's time limit)"
