"""Conversations as the spec means them, embedded and on a fleet: a single-turn case ends
after its turn, a reply cut off by its length awaits nothing, what the simulator is sent,
tdx's chat history and its evaluator's plan and thinking, and a blank first input. Each
run is played by the embedded default and by a worker fleet (one worker for the module),
and both must give the records the spec means.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from agent_servers import Reply, completion
from browser import chromium, open_page
from fleet import Fleet, fleet_on
from scripted_agent import ScriptedAgent, project, run_case, simulator_turn
from stream_servers import (
    HistoryAgent,
    Stream,
    StreamServer,
    anthropic_events,
    anthropic_message,
    openai_chunks,
)

from agenttest_submit.cli.main import main as submit_main
from agenttest_worker.demo._protocol import metadata_of

Records = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def module_fleet(
    redis_db: str, pg_database: str, demo_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker for every fleet test of this module (starting one is the slow part)."""
    for fleet in fleet_on(redis_db, pg_database, demo_url, tmp_path_factory.mktemp("fleet")):
        fleet.start("w1", concurrency=2)
        yield fleet


def write_lines(path: Path, cases: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


def read_records(path: Path) -> Records:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def run_embedded(args: list[str], out: Path) -> tuple[int, Records]:
    code = submit_main([*args, "-o", str(out)])
    return code, read_records(out)


def run_on_fleet(fleet: Fleet, args: list[str], out: Path) -> tuple[int, Records]:
    done = fleet.submit([*args, "-o", str(out)])
    assert "case(s) enqueued" in done.stderr, done.stderr  # it did run on the fleet
    return done.returncode, read_records(out)


def demo_project(folder: Path, demo_url: str, extra: str = "") -> Path:
    """An agenttest.yaml with the demo's expense assistant as `expense`, plus `extra`."""
    path = folder / "agenttest.yaml"
    path.write_text(
        "agents:\n"
        "  expense:\n"
        "    protocol: openai\n"
        f"    base_url: {demo_url}\n"
        "    model: expense\n"
        "    max_retries: 0\n" + extra,
        encoding="utf-8",
    )
    return path


def statuses(records: Records) -> dict[str, str]:
    return {case: record["status"] for case, record in records.items()}


# -- 1. a single-turn case ends after its turn --------------------------------------------

ASKING_INPUT = "I want to submit an expense"  # the demo assistant asks "What type ...?"
MISSING_INPUT_CASES = [
    {
        "id": "Q1",
        "input": ASKING_INPUT,
        "assertions": [{"type": "contains", "value": "type of expense"}],
    },
    {"id": "Q1-TURNS", "type": "single_turn", "turns": [{"input": ASKING_INPUT}]},
    {"id": "T002", "type": "multi_turn", "input": ASKING_INPUT},
    {"id": "MULTI", "turns": [{"input": ASKING_INPUT}]},
    {"id": "OWN", "input": ASKING_INPUT, "on_missing_input": "fail"},
]


def missing_input_runs(folder: Path, demo_url: str, default: str | None) -> tuple[Path, Path]:
    folder.mkdir()
    extra = f"defaults:\n  on_missing_input: {default}\n" if default else ""
    return (
        write_lines(folder / "cases.jsonl", MISSING_INPUT_CASES),
        demo_project(folder, demo_url, extra),
    )


def check_missing_input(records: Records, default: str | None) -> None:
    # Single-turn cases are over after their turn; multi-turn ones miss their next input.
    single = "passed" if default in (None, "end") else "skipped"
    multi = "passed" if default == "end" else "skipped"
    assert statuses(records) == {
        "Q1": single,
        "Q1-TURNS": single,
        "T002": multi,
        "MULTI": multi,
        "OWN": "failed",  # the case's own value beats the project's default
    }
    q1 = records["Q1"]
    assert q1["turns"][0]["awaiting_input"] is True and q1["turns"][0]["assertions"][0]["passed"]
    if single == "passed":
        assert len(q1["turns"]) == 1 and "skip_reason" not in q1
    assert records["T002"]["total_turns"] == 1
    assert records["OWN"]["error"].endswith("(on_missing_input: fail)")


@pytest.mark.parametrize("default", [None, "skip", "end"])
def test_single_turn_cases_end_after_their_turn_embedded(
    demo_url: str, tmp_path: Path, default: str | None
) -> None:
    cases, config = missing_input_runs(tmp_path / "p", demo_url, default)
    args = ["-i", str(cases), "-n", "expense", "--config", str(config)]
    code, records = run_embedded(args, tmp_path / "out.jsonl")
    assert code == 1  # OWN failed
    check_missing_input(records, default)


@pytest.mark.fleet
def test_single_turn_cases_end_after_their_turn_on_a_fleet(
    module_fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    for default in (None, "skip"):
        folder = tmp_path / f"default-{default}"
        cases, config = missing_input_runs(folder, demo_url, default)
        args = ["-i", str(cases), "-n", "expense", "--config", str(config)]
        code, records = run_on_fleet(module_fleet, args, folder / "out.jsonl")
        assert code == 1
        check_missing_input(records, default)


# -- 2. a reply cut off by its length awaits nothing ---------------------------------------

CUT = "Shall I go on and"  # where a reply ran out of tokens: a question by its first words
CUT_CASE = {"id": "CUT", "turns": [{"input": "Tell me everything"}]}  # multi-turn: skip


def _openai(server: StreamServer, **fields: Any) -> dict[str, Any]:
    return {"protocol": "openai", "base_url": server.url("/v1"), "model": "m", **fields}


def _anthropic(server: StreamServer, **fields: Any) -> dict[str, Any]:
    return {"protocol": "anthropic", "base_url": server.url(), "model": "claude-test", **fields}


CUT_REPLIES: dict[str, tuple[str, Any, Any, str]] = {
    # protocol: (path, its entry, the cut reply, the finish reason it records)
    "openai": (
        "/v1/chat/completions",
        _openai,
        Reply(body=completion(CUT, finish_reason="length")),
        "length",
    ),
    "openai-stream": (
        "/v1/chat/completions",
        partial(_openai, stream=True),
        Stream(openai_chunks(["Shall I go", " on and"], finish_reason="length")),
        "length",
    ),
    "anthropic": (
        "/v1/messages",
        _anthropic,
        Reply(body=anthropic_message(CUT, stop_reason="max_tokens")),
        "max_tokens",
    ),
    "anthropic-stream": (
        "/v1/messages",
        partial(_anthropic, stream=True),
        Stream(anthropic_events(["Shall I go", " on and"], stop_reason="max_tokens")),
        "max_tokens",
    ),
    "http": (
        "/agent",
        lambda server: {"protocol": "http", "url": server.url("/agent")},
        Reply(body={"content": CUT, "finish_reason": "length"}),
        "length",
    ),
}


@pytest.mark.parametrize("protocol", list(CUT_REPLIES))
def test_a_reply_cut_off_by_its_length_awaits_no_input(protocol: str) -> None:
    path, entry, reply, reason = CUT_REPLIES[protocol]
    with StreamServer() as server:
        server.script(path, reply)
        config = project({"target": {**entry(server), "max_retries": 0}})
        result, _ = run_case(CUT_CASE, config)
    [turn] = result.turns
    assert turn.output == CUT
    assert (turn.finish_reason, turn.awaiting_input) == (reason, False)
    assert turn.awaiting_reason == "response_truncated"
    assert result.status == "passed"
    assert json.loads(result.to_json_line())["turns"][0]["finish_reason"] == reason


def test_the_same_reply_stopped_awaits_input() -> None:
    with StreamServer() as server:
        server.script("/v1/chat/completions", Reply(body=completion(CUT)))
        result, _ = run_case(CUT_CASE, project({"target": _openai(server, max_retries=0)}))
    assert result.turns[0].finish_reason == "stop"
    assert result.turns[0].awaiting_reason == "content_is_question"
    assert result.status == "skipped"


def cut_off_runs(folder: Path, demo_url: str) -> list[str]:
    """The demo assistant asks "What type of expense ...?"; with 4 tokens it is cut off
    after "What type of expense", a question by its first word."""
    folder.mkdir()
    extra = (
        "  expense.short:\n"
        "    protocol: openai\n"
        f"    base_url: {demo_url}\n"
        "    model: expense\n"
        "    max_retries: 0\n"
        "    params: {max_completion_tokens: 4}\n"
    )
    cases = [
        {"id": "FULL", "turns": [{"input": ASKING_INPUT}]},
        {"id": "SHORT", "agent": "expense.short", "turns": [{"input": ASKING_INPUT}]},
    ]
    config = demo_project(folder, demo_url, extra)
    cases_file = write_lines(folder / "cases.jsonl", cases)
    return ["-i", str(cases_file), "-n", "expense", "--config", str(config)]


def check_cut_off(records: Records) -> None:
    assert statuses(records) == {"FULL": "skipped", "SHORT": "passed"}
    full, short = records["FULL"]["turns"][0], records["SHORT"]["turns"][0]
    assert (full["finish_reason"], full["awaiting_reason"]) == ("stop", "content_is_question")
    assert short["output"] == "What type of expense"
    assert (short["finish_reason"], short["awaiting_reason"]) == ("length", "response_truncated")


def test_a_cut_off_reply_ends_the_conversation_embedded(demo_url: str, tmp_path: Path) -> None:
    args = cut_off_runs(tmp_path / "p", demo_url)
    code, records = run_embedded(args, tmp_path / "out.jsonl")
    assert code == 0
    check_cut_off(records)


@pytest.mark.fleet
def test_a_cut_off_reply_ends_the_conversation_on_a_fleet(
    module_fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    args = cut_off_runs(tmp_path / "p", demo_url)
    code, records = run_on_fleet(module_fleet, args, tmp_path / "out.jsonl")
    assert code == 0
    check_cut_off(records)


# -- 3. what the simulator is sent ------------------------------------------------------------

ASKED = "What type of expense would you like to submit?"  # the demo assistant's question
SIMULATORS = {"SIM-TRANSCRIPT": "transcript", "SIM-AS-IS": "as_is", "SIM-SWAPPED": "swapped"}


def simulator_runs(folder: Path, demo_url: str, sim: ScriptedAgent) -> list[str]:
    """Three cases, each with a simulator entry of its own `messages` mode, at `sim`."""
    folder.mkdir()
    sim.script("sim", lambda body: simulator_turn("", goal_achieved=True, reasoning="done"))
    extra = "".join(
        f"  sim.{mode}:\n"
        "    protocol: openai\n"
        f"    base_url: {sim.base_url}\n"
        "    model: sim\n"
        "    max_retries: 0\n"
        f"    messages: {mode}\n"
        for mode in SIMULATORS.values()
    )
    cases = [
        {
            "id": case_id,
            "input": f"{ASKING_INPUT} [{case_id}]",
            "simulator": {
                "use": f"agents:sim.{mode}",
                "metadata": {"persona": "New employee", "goal": "Submit a dinner expense"},
            },
        }
        for case_id, mode in SIMULATORS.items()
    ]
    config = demo_project(folder, demo_url, extra)
    return [
        "-i",
        str(write_lines(folder / "cases.jsonl", cases)),
        "-n",
        "expense",
        "--config",
        str(config),
    ]


def check_simulator_requests(records: Records, sim: ScriptedAgent) -> None:
    assert statuses(records) == dict.fromkeys(SIMULATORS, "passed")
    assert all(r["goal_achieved"] is True for r in records.values())
    seen: dict[str, list[dict[str, Any]]] = {}
    for body in sim.requests("sim"):
        system, *conversation = body["messages"]
        metadata = metadata_of(body)
        case_id = metadata["test_id"]
        seen[case_id] = conversation
        assert system["role"] == "system"
        assert system["content"].startswith(
            "You are simulating a user with the following characteristics:\n\n"
            "Persona: New employee\nGoal: Submit a dinner expense\n"
        )
        assert (metadata["turn_number"], metadata["turn_count"]) == (2, 2)
        assert metadata["last_response"] == ASKED
        if SIMULATORS[case_id] != "transcript":
            assert f'The agent just responded:\n"{ASKED}"' in system["content"]
    said = {case_id: f"{ASKING_INPUT} [{case_id}]" for case_id in SIMULATORS}
    assert seen == {
        "SIM-TRANSCRIPT": [
            {
                "role": "user",
                "content": f"Current conversation:\nUser: {said['SIM-TRANSCRIPT']}\n\n"
                f'Agent: {ASKED}\n\nThe agent just responded:\n"{ASKED}"',
            }
        ],
        "SIM-AS-IS": [
            {"role": "user", "content": said["SIM-AS-IS"]},
            {"role": "assistant", "content": ASKED},
        ],
        "SIM-SWAPPED": [
            {"role": "assistant", "content": said["SIM-SWAPPED"]},
            {"role": "user", "content": ASKED},
        ],
    }


def test_what_the_simulator_is_sent_embedded(demo_url: str, tmp_path: Path) -> None:
    with ScriptedAgent() as sim:
        code, records = run_embedded(simulator_runs(tmp_path / "p", demo_url, sim), tmp_path / "o")
        check_simulator_requests(records, sim)
    assert code == 0


@pytest.mark.fleet
def test_what_the_simulator_is_sent_on_a_fleet(
    module_fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    with ScriptedAgent() as sim:
        args = simulator_runs(tmp_path / "p", demo_url, sim)
        code, records = run_on_fleet(module_fleet, args, tmp_path / "out.jsonl")
        check_simulator_requests(records, sim)
    assert code == 0


# -- 4. tdx's chat history and its evaluator's plan and thinking ----------------------------

TDX_ROUNDS = [
    [
        {"content": "Let me look that up.", "at": "2026-01-01T00:00:10Z"},
        {
            "tool": {"functionName": "search_flights", "content": '{"flights": 3}'},
            "at": "2026-01-01T00:00:11Z",
        },
        {"content": "I found 3 flights. Which one?", "at": "2026-01-01T00:00:12Z"},
    ],
    [{"content": "Booked flight 2.", "at": "2026-01-01T00:00:20Z"}],
]
TDX_TESTS = """\
tests:
  - name: flight_booking
    rounds:
      - user_input: Find me a flight to Oslo
        criteria: Must say how many flights it found
        assertions:
          - {type: tool_called, name: search_flights}
          - {type: json_path, path: "$.events[1].tool.functionName", value: search_flights}
      - user_input: The second one
        criteria: Must confirm the booking
"""
PLAN = "1. Find the number of flights in the reply. 2. Check it is stated."
THINKING = "The agent says it found 3 flights: the criteria are met."


def tdx_evaluator(body: dict[str, Any]) -> str:
    """tdx's evaluator output: {pass, reason, plan, thinking}."""
    verdict = {"pass": True, "reason": "Meets the criteria", "plan": PLAN, "thinking": THINKING}
    return json.dumps(verdict)


def tdx_runs(folder: Path, history: HistoryAgent, judge: ScriptedAgent) -> list[str]:
    folder.mkdir()
    judge.script("judge", tdx_evaluator)
    config = folder / "agenttest.yaml"
    config.write_text(
        "agents:\n"
        "  travel.agent:\n"
        "    protocol: http\n"
        f"    url: {history.base_url}/chat\n"
        '    request: {"session_id": "{{session_id}}", "input": "{{input}}"}\n'
        "    max_retries: 0\n"
        "    history:\n"
        f"      url: {history.base_url}/history?session={{{{session_id}}}}\n"
        "      when: end\n"
        "      response:\n"
        "        events: $.data\n"
        "        input: $.input\n"
        "        tool: $.tool\n"
        "        tool_name: $.tool.functionName\n"
        "        tool_content: $.tool.content\n"
        "        content: $.content\n"
        "  evaluator:\n"
        "    protocol: openai\n"
        f"    base_url: {judge.base_url}\n"
        "    model: judge\n"
        "    max_retries: 0\n"
        "defaults:\n"
        "  judge: evaluator\n",
        encoding="utf-8",
    )
    tests = folder / "tests.yaml"
    tests.write_text(TDX_TESTS, encoding="utf-8")
    return ["-i", str(tests), "-n", "travel.agent", "--config", str(config)]


def check_tdx_run(records: Records) -> None:
    record = records["flight_booking"]
    assert record["status"] == "passed", record
    first, second = record["turns"]
    assert first["output"] == "Let me look that up.\n\nI found 3 flights. Which one?"
    assert first["tool_calls"] == [{"name": "search_flights", "args": {}}]
    assert first["tool_results"] == {"search_flights": {"flights": 3}}
    assert first["events"] == TDX_ROUNDS[0]
    assert second["output"] == "Booked flight 2."
    for turn in (first, second):
        criteria = turn["assertions"][-1]
        assert criteria["type"] == "agent" and criteria["passed"] is True
        assert (criteria["reason"], criteria["plan"], criteria["thinking"]) == (
            "Meets the criteria",
            PLAN,
            THINKING,
        )


def test_a_tdx_history_and_its_evaluator_embedded(tmp_path: Path) -> None:
    with HistoryAgent(TDX_ROUNDS, tdx=True) as history, ScriptedAgent() as judge:
        args = tdx_runs(tmp_path / "p", history, judge)
        code, records = run_embedded(args, tmp_path / "out.jsonl")
    assert code == 0
    check_tdx_run(records)
    # The HTML report shows the judge's plan and thinking.
    report = tmp_path / "report.html"
    assert submit_main(["report", "last", "--format", "html", "-o", str(report)]) == 0
    with chromium() as browser:
        page, _ = open_page(browser, f"{report.as_uri()}#case=flight_booking")
        page.wait_for_selector("#conversation .assertions")
        page.click("#conversation details.judge-plan summary >> nth=0")
        page.click("#conversation details.judge-thinking summary >> nth=0")
        text = page.inner_text("#conversation")
    assert "Judge's plan" in text and PLAN in text
    assert "Judge's thinking" in text and THINKING in text


@pytest.mark.fleet
def test_a_tdx_history_and_its_evaluator_on_a_fleet(module_fleet: Fleet, tmp_path: Path) -> None:
    with HistoryAgent(TDX_ROUNDS, tdx=True) as history, ScriptedAgent() as judge:
        args = tdx_runs(tmp_path / "p", history, judge)
        code, records = run_on_fleet(module_fleet, args, tmp_path / "out.jsonl")
    assert code == 0
    check_tdx_run(records)


# -- 5. a blank first input is no initial input -------------------------------------------

BLANK_CASES = [
    {"id": "BLANK", "input": "   "},
    {"id": "BLANK-TURN", "turns": [{"input": "\n\t "}, {"input": "Hello"}]},
    {"id": "GREETED", "input": "Hello", "assertions": [{"type": "contains", "value": "help you"}]},
]
BLANK_ERROR = "no initial input: the first input is blank (empty or whitespace only)"


def blank_runs(folder: Path, demo_url: str) -> list[str]:
    folder.mkdir()
    cases = write_lines(folder / "cases.jsonl", BLANK_CASES)
    config = demo_project(folder, demo_url)
    return ["-i", str(cases), "-n", "expense", "--config", str(config)]


def check_blank(records: Records) -> None:
    assert statuses(records) == {"BLANK": "failed", "BLANK-TURN": "failed", "GREETED": "passed"}
    for case_id in ("BLANK", "BLANK-TURN"):
        record = records[case_id]
        assert (record["error"], record["total_turns"], record["turns"]) == (BLANK_ERROR, 0, [])


def test_a_blank_first_input_fails_its_case_alone_embedded(
    demo_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, records = run_embedded(blank_runs(tmp_path / "p", demo_url), tmp_path / "out.jsonl")
    assert code == 1
    check_blank(records)
    assert f"Error: {BLANK_ERROR}" in capsys.readouterr().out


@pytest.mark.fleet
def test_a_blank_first_input_fails_its_case_alone_on_a_fleet(
    module_fleet: Fleet, demo_url: str, tmp_path: Path
) -> None:
    args = blank_runs(tmp_path / "p", demo_url)
    code, records = run_on_fleet(module_fleet, args, tmp_path / "out.jsonl")
    assert code == 1
    check_blank(records)
