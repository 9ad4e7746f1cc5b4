"""The report formats, checked against the spec's "Console Output" and "JSONL Output"."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from agenttest_worker.report import REPORTERS, RunReport, register, render
from agenttest_worker.report.common import describe_assertion, format_seconds
from agenttest_worker.results import AssertionResult, CaseResult, ToolCall, TurnResult

SPEC_JSONL_EXAMPLE = Path(__file__).parent / "fixtures" / "spec" / "jsonl_output_example.json"

ASK_TYPE = "What type of expense would you like to submit?"
APPROVAL = "This requires manager approval. Please provide PO number."
SUBMITTED = "Expense submitted. Reference: EXP-2025-001"


def passed(type: str, **fields: Any) -> AssertionResult:
    return AssertionResult(type=type, passed=True, **fields)


def turn(number: int, input: str | None, output: str | None, ms: int, **fields: Any) -> TurnResult:
    return TurnResult(turn=number, input=input, output=output, duration_ms=ms, **fields)


def t001(args: dict[str, Any] | None = None) -> CaseResult:
    """The spec's T001: three static turns, then a json_path final assertion."""
    call = ToolCall(name="create_expense", args=args or {"amount": 3500, "type": "travel"})
    return CaseResult(
        id="T001",
        name="Expense Reimbursement Flow",
        status="passed",
        turns=[
            turn(
                1,
                "I want to submit an expense",
                ASK_TYPE,
                2100,
                input_source="static",
                awaiting_input=True,
                assertions=[passed("contains", value="type of expense")],
            ),
            turn(
                2,
                "Business travel, $3500",
                "",
                3200,
                input_source="static",
                tool_calls=[call],
                awaiting_input=True,
                assertions=[passed("tool_called", name="create_expense")],
            ),
            turn(
                3,
                "Yes, confirm",
                SUBMITTED,
                1800,
                input_source="static",
                assertions=[passed("contains", value="submitted")],
            ),
        ],
        final_assertions=[passed("json_path", path="$.expense.status", value="submitted")],
        total_turns=3,
        duration_ms=7100,
    )


def t002() -> CaseResult:
    """The spec's T002: the agent asks for a PO number and the case has no second turn."""
    reason = "Agent awaiting input, no next turn defined"
    return CaseResult(
        id="T002",
        name="Large Expense Approval",
        status="skipped",
        turns=[
            turn(
                1,
                "Submit $100,000 equipment purchase",
                APPROVAL,
                2000,
                input_source="static",
                awaiting_input=True,
            ),
            turn(2, None, None, 0, status="skipped", skip_reason=reason),
        ],
        total_turns=1,
        duration_ms=2000,
        skip_reason=reason,
    )


def t003() -> CaseResult:
    """The spec's T003: an initial input, three simulated ones, goal achieved."""
    inputs = [
        ("static", "Help me file an expense", 2100),
        ("simulator", "It's for client dinner, $250", 2800),
        ("simulator", "Yesterday evening", 2200),
        ("simulator", "Confirm", 1900),
    ]
    turns = [
        turn(i, text, f"reply {i}", ms, input_source=source, awaiting_input=i < 4)
        for i, (source, text, ms) in enumerate(inputs, start=1)
    ]
    turns[-1].simulator_reasoning = "Expense submitted"
    return CaseResult(
        id="T003",
        name="Dynamic Expense Flow",
        status="passed",
        turns=turns,
        total_turns=4,
        duration_ms=9000,
        goal_achieved=True,
    )


def t004() -> CaseResult:
    """A failing case: a failed assertion with its reason, then a timed-out turn."""
    failed = AssertionResult(
        type="contains",
        value="receipt",
        passed=False,
        reason='reply does not contain "receipt"; reply was "Which type?"',
    )
    return CaseResult(
        id="T004",
        name="Receipt Upload",
        status="failed",
        turns=[
            turn(
                1,
                "Here is my receipt",
                "Which type?",
                1500,
                input_source="static",
                awaiting_input=True,
                status="failed",
                assertions=[failed],
            ),
            turn(
                2,
                "Travel",
                None,
                30000,
                input_source="static",
                status="failed",
                error="timeout after 30s",
            ),
        ],
        total_turns=2,
        duration_ms=31500,
        error="timeout after 30s",
    )


def spec_run(**overrides: Any) -> RunReport:
    fields: dict[str, Any] = {
        "results": [t001(), t002(), t003()],
        "agent": "assistants.expense",
        "input_label": "./tests/expense-flow.jsonl",
        "total_cases": 5,
        "duration_s": 18.1,
        "verbose": False,
        "simulators": {"T003": "workers.test.user-sim"},
    } | overrides
    return RunReport(**fields)


HEADER = """\
═══════════════════════════════════════════════════════════════
  Agent Test (Multi-Turn)
═══════════════════════════════════════════════════════════════
ℹ Agent: assistants.expense
ℹ Input: ./tests/expense-flow.jsonl (5 test cases)

───────────────────────────────────────────────────────────────
  Running Tests
───────────────────────────────────────────────────────────────
"""

T001 = """\
► [T001] Expense Reimbursement Flow (3 turns)
  ├─ Turn 1: "I want to submit an expense" → PASSED (2.1s)
  │          Agent: "What type of expense would you like to submit?"
  │          ✓ contains "type of expense"
  │
  ├─ Turn 2: "Business travel, $3500" → PASSED (3.2s)
  │          Agent: [tool: create_expense({amount: 3500, type: "travel"})]
  │          ✓ tool_called "create_expense"
  │
  ├─ Turn 3: "Yes, confirm" → PASSED (1.8s)
  │          Agent: "Expense submitted. Reference: EXP-2025-001"
  │          ✓ contains "submitted"
  │
  └─ Final Assertions: PASSED
     ✓ $.expense.status = "submitted"
"""

T002 = """\
► [T002] Large Expense Approval
  ├─ Turn 1: "Submit $100,000 equipment purchase" → PASSED (2.0s)
  │          Agent: "This requires manager approval. Please provide PO number."
  │
  ├─ Turn 2: SKIPPED
  │          Reason: Agent awaiting input, no next turn defined
  │          Agent asked: "Please provide PO number"
  │          Hint: Add more turns, use --interactive, configure simulator, \
or set on_missing_input: end
  │
  └─ Result: SKIPPED
"""

T003 = """\
► [T003] Dynamic Expense Flow (simulator: workers.test.user-sim)
  ├─ Turn 1: [Initial] "Help me file an expense" → PASSED (2.1s)
  ├─ Turn 2: [Simulated] "It's for client dinner, $250" → PASSED (2.8s)
  ├─ Turn 3: [Simulated] "Yesterday evening" → PASSED (2.2s)
  ├─ Turn 4: [Simulated] "Confirm" → PASSED (1.9s)
  │          Goal achieved: Expense submitted
  │
  └─ Final Assertions: PASSED
"""

# The spec's totals (10 turns, 3.3 per test) do not add up from its own cases; these do.
SUMMARY = """\
───────────────────────────────────────────────────────────────
  Summary
───────────────────────────────────────────────────────────────
  Total:   3 tests
  Passed:  2
  Failed:  0
  Skipped: 1

  Total turns: 8
  Avg turns/test: 2.7
  Total time: 18.1s
"""


def assert_lines(actual: str, expected: str) -> None:
    """Compare line by line so a mismatch names the line that differs."""
    got, want = actual.splitlines(), expected.splitlines()
    for number, (a, e) in enumerate(zip(got, want, strict=False), start=1):
        assert a == e, f"line {number}:\n  got:  {a!r}\n  want: {e!r}"
    assert len(got) == len(want), f"{len(got)} lines, expected {len(want)}"


# --- console ---------------------------------------------------------------------------


def test_console_matches_the_spec_layout() -> None:
    expected = HEADER + "\n" + T001 + "\n" + T002 + "\n" + T003 + "\n" + SUMMARY
    assert_lines(render("console", spec_run()), expected)


def test_console_names_a_case_once_when_its_name_is_its_id() -> None:
    """A YAML test's name is its id: `► [greeting] greeting` said it twice."""
    case = t002().model_copy(update={"id": "greeting", "name": "greeting"})
    text = render("console", spec_run(results=[case]))
    assert "► [greeting]\n" in text or "► [greeting] (" in text
    assert "[greeting] greeting" not in text


def test_console_verbose_adds_every_reply() -> None:
    # -v adds the agent's reply to the turns the spec's layout leaves bare (T003's
    # simulated turns); everything else stays as the spec shows it.
    t003_verbose = """\
► [T003] Dynamic Expense Flow (simulator: workers.test.user-sim)
  ├─ Turn 1: [Initial] "Help me file an expense" → PASSED (2.1s)
  │          Agent: "reply 1"
  │
  ├─ Turn 2: [Simulated] "It's for client dinner, $250" → PASSED (2.8s)
  │          Agent: "reply 2"
  │
  ├─ Turn 3: [Simulated] "Yesterday evening" → PASSED (2.2s)
  │          Agent: "reply 3"
  │
  ├─ Turn 4: [Simulated] "Confirm" → PASSED (1.9s)
  │          Agent: "reply 4"
  │          Goal achieved: Expense submitted
  │
  └─ Final Assertions: PASSED
"""
    expected = HEADER + "\n" + T001 + "\n" + T002 + "\n" + t003_verbose + "\n" + SUMMARY
    assert_lines(render("console", spec_run(verbose=True)), expected)


def test_console_failed_case_shows_reasons_and_errors_without_verbose() -> None:
    run = spec_run(results=[t004()], verbose=False, total_cases=1, duration_s=31.5)
    text = render("console", run)
    case = text.split("Running Tests\n" + "─" * 63 + "\n\n")[1].split("\n\n")[0]
    assert_lines(
        case,
        """\
► [T004] Receipt Upload (2 turns)
  ├─ Turn 1: "Here is my receipt" → FAILED (1.5s)
  │          Agent: "Which type?"
  │          ✗ contains "receipt"
  │            reply does not contain "receipt"; reply was "Which type?"
  │
  ├─ Turn 2: "Travel" → FAILED (30.0s)
  │          Error: timeout after 30s
  │
  └─ Result: FAILED""",
    )
    assert "  Failed:  1" in text
    assert "ℹ Input: ./tests/expense-flow.jsonl (1 test case)" in text


def test_console_case_error_and_failed_final_assertion() -> None:
    case = t001()
    case.status = "failed"
    case.error = "max turns (3) exceeded"
    case.final_assertions[0].passed = False
    case.final_assertions[0].reason = '$.expense.status is "draft", expected "submitted"'
    text = render("console", spec_run(results=[case], verbose=False))
    assert_lines(
        text.split('│          ✓ contains "submitted"\n  │\n')[1].split("\n\n")[0],
        """\
  ├─ Final Assertions: FAILED
  │  ✗ $.expense.status = "submitted"
  │    $.expense.status is "draft", expected "submitted"
  │
  └─ Result: FAILED
     Error: max turns (3) exceeded""",
    )


def test_console_skip_recorded_only_on_the_case() -> None:
    case = t002()
    del case.turns[1]
    case.name = None
    text = render("console", spec_run(results=[case]))
    assert "► [T002]\n" in text
    assert "  ├─ Turn 2: SKIPPED\n  │          Reason: Agent awaiting input" in text
    assert text.count("Reason:") == 1


def test_console_colors_only_when_asked() -> None:
    plain = render("console", spec_run())
    colored = render("console", spec_run(color=True))
    assert "\x1b[" not in plain
    assert "\x1b[32mPASSED\x1b[0m" in colored
    assert "\x1b[33mSKIPPED\x1b[0m" in colored
    assert "\x1b[32m✓\x1b[0m" in colored


def test_console_run_id_and_missing_agent() -> None:
    text = render("console", spec_run(agent=None, run_id="r-42", results=[]))
    assert "ℹ Agent" not in text
    assert "ℹ Run: r-42" in text
    assert "No test cases ran." in text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.045, "45ms"),
        (0.999, "999ms"),
        (2.1, "2.1s"),
        (18.1, "18.1s"),
        (185, "3m05s"),
        (3725, "1h02m"),
    ],
)
def test_durations(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(
    ("fields", "label"),
    [
        ({"type": "contains", "value": "x"}, 'contains "x"'),
        ({"type": "equals", "value": "OK"}, 'equals "OK"'),
        ({"type": "equals", "value": {"a": 1}}, 'equals {"a": 1}'),
        ({"type": "regex", "pattern": r"order-\d+"}, r"regex /order-\d+/"),
        ({"type": "regex", "pattern": "ok", "ignore_case": True}, "regex /ok/i"),
        ({"type": "tool_called", "name": "create_expense"}, 'tool_called "create_expense"'),
        (
            {"type": "tool_called", "name": "c", "args": {"amount": 3500}},
            'tool_called "c" with {amount: 3500}',
        ),
        ({"type": "json_path", "path": "$.status", "value": "ok"}, '$.status = "ok"'),
        ({"type": "json_path", "path": "$.id"}, "$.id exists"),
        ({"type": "type", "path": "$.count", "value": "number"}, "type $.count is number"),
        (
            {
                "type": "agent",
                "use": "agents:workers.test.validator",
                "options": {"metadata": {"criteria": "Should be\n polite"}},
            },
            "agent: Should be polite",
        ),
        (
            {"type": "script", "use": "scripts:tests.validate-expense"},
            "script scripts:tests.validate-expense",
        ),
        ({"type": "custom", "level": 3}, "custom level=3"),
        (
            {"type": "not_contains", "value": "x", "ignore_case": True},
            'not_contains "x" (ignore case)',
        ),
        ({"type": "not_regex", "pattern": "a+"}, "not_regex /a+/"),
        ({"type": "tool_not_called", "name": "refund"}, 'tool_not_called "refund"'),
        (
            {"type": "tool_sequence", "order": "in_order", "calls": [{"name": "a"}, {"name": "b"}]},
            "tool_sequence in_order: a, b",
        ),
        ({"type": "tool_count", "name": "a", "min": 1, "max": 2}, 'tool_count "a" between 1 and 2'),
        ({"type": "tool_count", "max": 0}, "tool_count at most 0"),
        ({"type": "turn_count", "min": 2}, "turn_count at least 2"),
        ({"type": "not", "assertion": {"type": "contains", "value": "x"}}, 'not (contains "x")'),
        (
            {
                "type": "any",
                "assertions": [
                    {"type": "regex", "pattern": "a"},
                    {"type": "all", "assertions": [{"type": "tool_called", "name": "t"}]},
                ],
            },
            'any of (regex /a/; all of (tool_called "t"))',
        ),
    ],
)
def test_assertion_labels(fields: dict[str, Any], label: str) -> None:
    assert describe_assertion(AssertionResult(passed=True, **fields)) == label


def test_console_dynamic_cases() -> None:
    """Interactive inputs get a marker; a simulator case shows replies only where they
    explain something, and a simulator failure gets no "add more turns" hint."""
    case = t003()
    case.status = "skipped"
    case.goal_achieved = None
    case.turns[1].input_source = "interactive"
    case.turns[2].status = "failed"
    case.turns[3] = turn(4, None, None, 0, status="skipped", skip_reason="simulator error")
    case.turns[2].awaiting_input = True
    text = render("console", spec_run(results=[case], verbose=False))
    assert '  ├─ Turn 2: [Interactive] "It\'s for client dinner, $250" → PASSED (2.8s)\n' in text
    assert '  ├─ Turn 3: [Simulated] "Yesterday evening" → FAILED (2.2s)\n' in text
    assert '  │          Agent: "reply 3"\n' in text
    assert '"reply 1"' not in text and '"reply 2"' not in text
    assert "  │          Reason: simulator error\n" in text
    assert "Agent asked" not in text, '"reply 3" asks nothing'
    assert "Hint:" not in text
    assert "Goal achieved" not in text
    assert "► [T003] Dynamic Expense Flow (simulator: workers.test.user-sim)\n" in text


def test_console_hybrid_case_marks_only_its_first_scripted_turn_initial() -> None:
    """The spec marks a simulated case's first input [Initial]; a hybrid case's later
    scripted turns are [Static], its simulated ones [Simulated]."""
    case = t003()
    case.turns[1].input_source = "static"
    text = render("console", spec_run(results=[case], verbose=False))
    assert '  ├─ Turn 1: [Initial] "Help me file an expense" → PASSED (2.1s)\n' in text
    assert '  ├─ Turn 2: [Static] "It\'s for client dinner, $250" → PASSED (2.8s)\n' in text
    assert '  ├─ Turn 3: [Simulated] "Yesterday evening" → PASSED (2.2s)\n' in text


# --- JSONL and JSON --------------------------------------------------------------------


def spec_jsonl_example() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SPEC_JSONL_EXAMPLE.read_text())
    return data


# What our record adds to the spec's: the layout version, each turn's status, an empty
# tool_calls list, and each assertion's reason. Nothing of the spec's is renamed or moved.
ADDED_CASE_KEYS = {"version"}
ADDED_TURN_KEYS = {"status", "tool_calls"}
ADDED_ASSERTION_KEYS = {"reason"}


def without_additions(record: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    def strip(item: dict[str, Any], spec_item: dict[str, Any], added: set[str]) -> dict[str, Any]:
        return {k: v for k, v in item.items() if k in spec_item or k not in added}

    out = strip(record, spec, ADDED_CASE_KEYS)
    out["turns"] = []
    for ours, theirs in zip(record["turns"], spec["turns"], strict=True):
        t = strip(ours, theirs, ADDED_TURN_KEYS)
        t["assertions"] = [strip(a, {}, ADDED_ASSERTION_KEYS) for a in ours["assertions"]]
        out["turns"].append(t)
    out["final_assertions"] = [
        strip(a, {}, ADDED_ASSERTION_KEYS) for a in record["final_assertions"]
    ]
    return out


def test_jsonl_record_is_the_spec_example() -> None:
    spec = spec_jsonl_example()
    text = render("jsonl", spec_run(results=[t001(args={"amount": 3500})]))
    assert text.endswith("\n") and text.count("\n") == 1
    record = json.loads(text)
    assert without_additions(record, spec) == spec
    assert set(record) - set(spec) == ADDED_CASE_KEYS


def test_jsonl_records_always_carry_the_spec_fields() -> None:
    """The spec's fields without a `?` are in every record, null when there is no value:
    a case without a name, and the turn recorded for a missing input (no source)."""
    unnamed = t002().model_copy(update={"name": None})
    record = json.loads(render("jsonl", spec_run(results=[unnamed])))
    spec = spec_jsonl_example()
    assert set(spec) <= set(record)
    assert record["name"] is None
    spec_turn_keys = set(spec["turns"][0]) - {"error", "skip_reason"}
    skipped = record["turns"][1]
    assert spec_turn_keys <= set(skipped), spec_turn_keys - set(skipped)
    assert (skipped["input"], skipped["input_source"], skipped["output"]) == (None, None, None)


def test_jsonl_one_line_per_case_round_trips() -> None:
    run = spec_run(results=[t001(), t003(), t004()])
    lines = render("jsonl", run).splitlines()
    assert [CaseResult.model_validate_json(line) for line in lines] == run.results


def test_jsonl_skipped_turn_round_trips() -> None:
    line = render("jsonl", spec_run(results=[t002()]))
    assert CaseResult.model_validate_json(line) == t002()


def test_json_document() -> None:
    run = spec_run(run_id="r-1")
    doc = json.loads(render("json", run))
    assert list(doc) == ["run_id", "agent", "summary", "results"]
    assert doc["run_id"] == "r-1" and doc["agent"] == "assistants.expense"
    assert doc["summary"] == {
        "total": 3,
        "passed": 2,
        "failed": 0,
        "skipped": 1,
        "total_turns": 8,
        "avg_turns": 2.67,
        "duration_s": 18.1,
    }
    assert doc["results"] == [json.loads(c.to_json_line()) for c in run.results]


# --- TSV and table ---------------------------------------------------------------------


def test_tsv_rows_and_escaping() -> None:
    case = t004()
    case.name = "Receipt\tUpload\nflow"
    rows = render("tsv", spec_run(results=[t001(), t002(), case])).splitlines()
    assert rows[0].split("\t") == [
        "id",
        "name",
        "status",
        "turns",
        "duration_ms",
        "passed_assertions",
        "failed_assertions",
        "error_or_reason",
    ]
    assert len(rows) == 4
    cells = [row.split("\t") for row in rows[1:]]
    assert all(len(c) == 8 for c in cells)
    assert cells[0] == ["T001", "Expense Reimbursement Flow", "passed", "3", "7100", "4", "0", ""]
    assert cells[1][2:] == [
        "skipped",
        "1",
        "2000",
        "0",
        "0",
        "Agent awaiting input, no next turn defined",
    ]
    assert cells[2][1] == "Receipt\\tUpload\\nflow"
    assert cells[2][5:7] == ["0", "1"]
    assert cells[2][7].startswith('turn 1: contains "receipt": reply does not contain')
    assert cells[2][7].endswith("; turn 2: timeout after 30s")


def test_a_turns_error_copied_onto_its_case_is_said_once() -> None:
    """The engine records a failing turn's error on the case as "turn N: ..."."""
    case = t004()
    case.error = "turn 2: timeout after 30s"
    cell = render("tsv", spec_run(results=[case])).splitlines()[1].split("\t")[7]
    assert cell.count("timeout after 30s") == 1
    error = ET.fromstring(render("junit", spec_run(results=[case]))).find(
        "testsuite/testcase/error"
    )
    assert error is not None and (error.text or "").count("timeout after 30s") == 1


def test_table_is_fixed_width() -> None:
    text = render("table", spec_run(results=[t001(), t002(), t004()]))
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "TURNS", "DURATION", "REASON"]
    reason_column = lines[0].index("REASON")
    assert lines[1].split() == ["T001", "PASSED", "3", "7.1s"]
    assert lines[2][reason_column:].startswith("Agent awaiting input, no next turn defined")
    assert lines[3][reason_column:].startswith('turn 1: contains "receipt": reply does not')
    assert lines[3].endswith("…") and len(lines[3]) == reason_column + 60
    assert lines[-1] == "3 cases: 1 passed, 1 failed, 1 skipped in 18.1s"


# --- JUnit -----------------------------------------------------------------------------


def test_junit_parses_with_counts() -> None:
    run = spec_run(results=[t001(), t002(), t003(), t004()], run_id="r-9")
    root = ET.fromstring(render("junit", run))
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    for element in (root, suite):
        assert element.get("tests") == "4"
        # T004's timeout makes it an error (the run broke), not a failure.
        assert (element.get("failures"), element.get("errors")) == ("0", "1")
        assert element.get("time") == "18.100"
    # junit-10.xsd allows `skipped` on a testsuite only (tests/test_junit_schema.py).
    assert suite.get("skipped") == "1" and root.get("skipped") is None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props == {"run_id": "r-9", "agent": "assistants.expense"}
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [
        "[T001] Expense Reimbursement Flow",
        "[T002] Large Expense Approval",
        "[T003] Dynamic Expense Flow",
        "[T004] Receipt Upload",
    ]
    assert cases[0].get("time") == "7.100" and len(cases[0]) == 0
    skipped = cases[1].find("skipped")
    assert skipped is not None
    assert skipped.get("message") == "Agent awaiting input, no next turn defined"
    error = cases[3].find("error")
    assert error is not None and error.text is not None
    assert error.get("message", "").startswith('turn 1: contains "receipt"')
    assert error.get("type") == "error"
    assert "turn 2: timeout after 30s" in error.text
    system_out = cases[3].findtext("system-out") or ""
    assert "► [T004] Receipt Upload (2 turns)" in system_out


def test_junit_survives_control_characters() -> None:
    case = t004()
    case.turns[0].assertions[0].reason = "reply was \x1b[31mred\x1b[0m\x00"
    root = ET.fromstring(render("junit", spec_run(results=[case])))
    error = root.find("testsuite/testcase/error")
    assert error is not None and "\x1b" not in error.get("message", "")


# --- registry --------------------------------------------------------------------------


def test_registry_names_match_the_cli() -> None:
    assert set(REPORTERS) == {
        "console",
        "json",
        "jsonl",
        "table",
        "tsv",
        "junit",
        "html",
        "markdown",
    }
    with pytest.raises(ValueError, match="choose from: console, html, json, jsonl"):
        render("pdf", spec_run())
    with pytest.raises(ValueError, match="registered twice"):
        register("json", REPORTERS["json"])


def test_every_format_renders_the_same_from_stored_text() -> None:
    """The aggregator keeps a run's records as their stored JSON text (StoredResults)
    and parses them as each report reads them: the same reports as from objects."""
    from agenttest_worker.report.report_model import StoredResults

    objects = spec_run(verbose=True)
    stored = spec_run(
        verbose=True,
        results=StoredResults.held([case.model_dump_json() for case in objects.results]),
    )
    assert len(stored.results) == len(objects.results) == 3
    assert stored.results[1] == objects.results[1]
    assert list(stored.results[1:]) == list(objects.results[1:])
    assert stored.summary() == objects.summary()
    for fmt in REPORTERS:
        assert render(fmt, stored) == render(fmt, objects), fmt


def test_stored_text_in_any_layout_gives_the_records_jsonl_lines() -> None:
    """A record stored as the model writes it is given to the JSONL as it is; one stored
    in another layout (spaced, keys in another order, a null the model leaves out) is
    written anew: both give the line the model writes."""
    from agenttest_worker.report.report_model import StoredResults

    objects = spec_run()
    spaced = [json.dumps(case.model_dump(mode="json")) for case in objects.results]
    reordered = json.loads(spaced[0])
    reordered = {"error": None, **dict(reversed(list(reordered.items())))}
    texts = [objects.results[0].model_dump_json(), spaced[1], json.dumps(reordered)]
    stored = spec_run(results=StoredResults.held(texts))
    cases = [*objects.results[:2], objects.results[0]]
    expected = "".join(f"{case.to_json_line()}\n" for case in cases)
    assert render("jsonl", stored) == expected
    assert texts[1] != objects.results[1].to_json_line()  # (spaced: not the model's layout)


def test_a_record_whose_nul_the_store_replaced_is_written_as_the_other_reports_show_it() -> None:
    """Postgres keeps no NUL, so the store writes it as the escape of U+FFFD; the model
    writes U+FFFD as the character. The JSONL gives the record as the model writes it
    (the character), not as stored, as it does a reply holding that escape's text."""
    from agenttest_worker.report.report_model import StoredResults
    from agenttest_worker.store.storable import storable_json

    case = spec_run().results[0]
    turn = case.turns[0]
    replies = ["bad\x00byte", "says \\ufffd as text"]
    records = [
        case.model_copy(update={"turns": [turn.model_copy(update={"output": reply})]})
        for reply in replies
    ]
    texts = [storable_json(record.model_dump_json()) for record in records]
    assert "\\ufffd" in texts[0] and "\ufffd" not in texts[0]
    lines = render("jsonl", spec_run(results=StoredResults.held(texts))).splitlines()
    assert [json.loads(line)["turns"][0]["output"] for line in lines] == [
        "bad\ufffdbyte",
        "says \\ufffd as text",
    ]
    assert "\ufffd" in lines[0]
    assert lines[1] == records[1].to_json_line()


def test_assertion_labels_show_each_value_as_written() -> None:
    # 1, 1.0 and true are equal as Python values; each is shown as written.
    shown = [
        describe_assertion(passed("contains", value=value)) for value in (1, True, 1.0, "1", 1)
    ]
    assert shown == ["contains 1", "contains true", "contains 1.0", 'contains "1"', "contains 1"]
    listed = passed("tool_called", name="f", args={"a": [1, 2]})
    assert describe_assertion(listed) == 'tool_called "f" with {a: [1, 2]}'


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_a_rendered_report_keeps_the_summary_it_counted(fmt: str) -> None:
    # The exit code reads report.summary() after the report is printed; the summary the
    # format counted as it read the records must be the one the records make.
    repeated = [
        t001().model_copy(update={"repeat": k, "repeats": 3, "status": status})
        for k, status in enumerate(["passed", "failed", "passed"], start=1)
    ]
    records = [*repeated, t002(), t004()]
    fresh = spec_run(results=records, pass_rule="majority")
    rendered = spec_run(results=records, pass_rule="majority")
    render(fmt, rendered)
    assert rendered.counted is not None
    assert rendered.summary() == fresh.summary()
    assert (fresh.summary().passed, fresh.summary().failed) == (1, 1)
