"""The negative, group and trajectory assertions against a target over real HTTP.

Cases run embedded through the real CLI (`agenttest_submit.cli.main.main`); the target
is a ScriptedAgent that greets, or looks an order up and refunds it over two mocked tool
rounds, so each assertion is seen passing and failing with its reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from scripted_agent import (
    Body,
    Reply,
    ScriptedAgent,
    call,
    fail,
    judge_verdict,
    last_user_text,
    say,
)

from agenttest_submit.cli.main import main

TARGET = "assistants.shop"
REFUND_REPLY = "Your refund of $500 for order A1 is on its way."


def shop(body: Body) -> Reply:
    """Greets; asked for a refund, calls lookup_order, then issue_refund, then answers;
    asked to check both orders, looks both up in one reply."""
    messages = body["messages"]
    since_user = messages[max(i for i, m in enumerate(messages) if m["role"] == "user") :]
    rounds = sum(1 for m in since_user if m["role"] == "tool")
    if "both" in last_user_text(body):
        if rounds:
            return say("Both found.")
        orders = [{"order": "B2"}, {"order": "A1"}]
        return Reply(tool_calls=[{"name": "lookup_order", "args": o} for o in orders])
    if "refund" not in last_user_text(body):
        return say("Hello! How can I help you today?")
    if rounds == 0:
        return call("lookup_order", {"order": "A1"})
    if rounds == 1:
        return call("issue_refund", {"order": "A1", "amount": 500})
    return say(REFUND_REPLY)


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with ScriptedAgent() as server:
        server.script("shop", shop)
        yield server


@pytest.fixture
def project(agent: ScriptedAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    config = {
        "agents": {
            TARGET: agent.entry("shop", max_retries=0),
            "judge": agent.entry("judge", max_retries=0),
        }
    }
    (tmp_path / "agenttest.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return tmp_path


MOCKS = {"lookup_order": {"order": "A1", "paid": 500}, "issue_refund": {"status": "done"}}


def run(project: Path, capsys: pytest.CaptureFixture[str], cases: list[Body]) -> dict[str, Any]:
    """Each case's record, by id, from an embedded run of `cases`."""
    source = project / "cases.jsonl"
    source.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    capsys.readouterr()
    code = main(["-i", str(source), "-n", TARGET, "-o", "out.jsonl"])
    _, err = capsys.readouterr()
    assert code in (0, 1), err
    lines = (project / "out.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def outcomes(results: list[dict[str, Any]]) -> list[tuple[bool, str]]:
    return [(r["passed"], r["reason"]) for r in results]


def test_not_contains_and_not_regex_quote_what_they_found(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assertions = [
        {"type": "not_contains", "value": "refund"},
        {"type": "not_contains", "value": "HELP", "ignore_case": True},
        {"type": "not_contains", "value": "HELP"},
        {"type": "not_regex", "pattern": r"\bbye\b"},
        {"type": "not_regex", "pattern": r"h\w+p", "ignore_case": True},
        {"type": "not_regex", "value": "you t"},
    ]
    records = run(project, capsys, [{"id": "N", "input": "hi", "assertions": assertions}])
    [turn] = records["N"]["turns"]
    assert outcomes(turn["assertions"]) == [
        (True, 'reply does not contain "refund"'),
        (False, 'the reply contains "HELP" at position 17: Hello! How can I help you today?'),
        (True, 'reply does not contain "HELP"'),
        (True, "/\\bbye\\b/ matched nowhere in the reply"),
        (False, '/h\\w+p/ matched "help" at position 17: Hello! How can I help you today?'),
        (False, '/you t/ matched "you t" at position 22: …llo! How can I help you today?'),
    ]
    assert records["N"]["status"] == "failed"


def test_not_contains_excerpt_is_short_and_escaped(
    agent: ScriptedAgent, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long_reply = "a" * 60 + ' the "refund"\nis here ' + "b" * 60
    agent.script("shop", [long_reply])
    records = run(
        project,
        capsys,
        [{"id": "E", "input": "hi", "assertions": [{"type": "not_contains", "value": "refund"}]}],
    )
    [(passed, reason)] = outcomes(records["E"]["turns"][0]["assertions"])
    assert not passed
    assert reason == (
        'the reply contains "refund" at position 66: '
        '…aaaaaaaaaaaaaa the \\"refund\\"\\nis here bbbbbbbbbb…'
    )


def test_tool_not_called_with_and_without_args(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assertions = [
        {"type": "tool_not_called", "name": "issue_refund"},
        {"type": "tool_not_called", "name": "issue_refund", "args": {"amount": 20}},
        {"type": "tool_not_called", "name": "issue_refund", "args": {"amount": 500}},
        {"type": "tool_not_called", "name": "escalate"},
    ]
    records = run(
        project,
        capsys,
        [
            {"id": "R", "input": "refund please", "assertions": assertions, "tool_mocks": MOCKS},
            {"id": "H", "input": "hi", "assertions": assertions[:1]},
        ],
    )
    assert outcomes(records["R"]["turns"][0]["assertions"]) == [
        (False, 'tool issue_refund was called with {"order": "A1", "amount": 500}'),
        (True, 'issue_refund was not called with {"amount": 20} in this turn'),
        (False, 'tool issue_refund was called with {"order": "A1", "amount": 500}'),
        (True, "escalate was not called in this turn"),
    ]
    assert outcomes(records["H"]["turns"][0]["assertions"]) == [
        (True, "issue_refund was not called in this turn")
    ]
    assert records["H"]["status"] == "passed"


def test_groups_not_any_all_list_their_parts(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refund = {"type": "contains", "value": "refund"}
    nope = {"type": "contains", "value": "nope"}
    looked_up = {"type": "tool_called", "name": "lookup_order"}
    assertions = [
        {"type": "not", "assertion": refund},
        {"type": "not", "assertion": nope},
        {"type": "any", "assertions": [nope, refund]},
        {"type": "any", "assertions": [nope]},
        {"type": "all", "assertions": [refund, looked_up]},
        {"type": "all", "assertions": [refund, nope]},
        {
            "type": "not",
            "assertion": {
                "type": "all",
                "assertions": [refund, {"type": "not", "assertion": nope}],
            },
        },
    ]
    records = run(
        project,
        capsys,
        [{"id": "G", "input": "refund please", "assertions": assertions, "tool_mocks": MOCKS}],
    )
    results = records["G"]["turns"][0]["assertions"]
    found = 'contains passed: reply contains "refund"'
    missing = f'contains failed: reply does not contain "nope"; reply was "{REFUND_REPLY}"'
    assert outcomes(results) == [
        (False, f"not: {found}"),
        (True, f"not: {missing}"),
        (True, f"any: 1 of 2 passed ({missing}; {found})"),
        (False, f"any: 0 of 1 passed ({missing})"),
        (True, f"all: 2 of 2 passed ({found}; tool_called passed: lookup_order was called)"),
        (False, f"all: 1 of 2 passed ({found}; {missing})"),
        (False, f"not: all passed: all: 2 of 2 passed ({found}; not passed: not: {missing})"),
    ]
    # The record keeps each group's parts as written.
    assert results[2]["assertions"] == [nope, refund]


def test_groups_hold_judged_parts_and_not_of_an_error_fails(
    agent: ScriptedAgent, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def judge(body: Body) -> Reply:
        criteria = json.dumps(body)
        if "polite" in criteria:
            return judge_verdict(True, "it is polite")
        if "broken" in criteria:
            return fail(500, "judge overloaded")
        return judge_verdict(False, "it is not")

    agent.script("judge", judge)

    def judged(criteria: str) -> Body:
        return {"type": "agent", "use": "judge", "options": {"metadata": {"criteria": criteria}}}

    assertions = [
        {"type": "all", "assertions": [judged("Is polite"), judged("Is rude")]},
        {"type": "any", "assertions": [judged("Is rude"), judged("Is polite")]},
        {"type": "not", "assertion": judged("Is rude")},
        {"type": "not", "assertion": judged("Is broken")},
    ]
    records = run(project, capsys, [{"id": "J", "input": "hi", "assertions": assertions}])
    results = records["J"]["turns"][0]["assertions"]
    assert [r["passed"] for r in results] == [False, True, True, False]
    assert results[0]["reason"] == (
        "all: 1 of 2 passed (agent passed: it is polite; agent failed: it is not)"
    )
    assert results[2]["reason"] == "not: agent failed: it is not"
    assert results[3]["reason"].startswith("not: agent could not be evaluated: judge judge failed")
    assert "HTTP 500" in results[3]["error"]
    assert len(agent.requests("judge")) == 6


def test_a_judge_named_inside_a_group_is_checked_at_load(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nested = {
        "type": "any",
        "assertions": [
            {"type": "contains", "value": "x"},
            {"type": "not", "assertion": {"type": "agent", "use": "nobody", "options": {}}},
        ],
    }
    (project / "j.jsonl").write_text(
        json.dumps({"id": "J1", "input": "x", "assertions": [nested]}) + "\n"
    )
    capsys.readouterr()
    assert main(["-i", "j.jsonl", "-n", TARGET, "--dry-run"]) == 2
    problems = [line.strip() for line in capsys.readouterr().err.splitlines()[1:]]
    assert len(problems) == 1
    assert problems[0].startswith(
        "j.jsonl:1 (test 'J1'): assertions[0].assertions[1].assertion.use: "
    ), problems
    assert "nobody" in problems[0]


def test_tool_sequence_orders_and_argument_modes(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    look = {"name": "lookup_order"}
    refund = {"name": "issue_refund"}
    escalate = {"name": "escalate"}

    def seq(order: str, *calls: dict[str, Any], **more: Any) -> Body:
        return {"type": "tool_sequence", "order": order, "calls": list(calls), **more}

    assertions = [
        seq("exact", look, refund),
        seq("exact", refund, look),
        seq("exact", look),
        seq("in_order", {"name": "lookup_order", "args": {"order": "A1"}}, refund),
        seq("in_order", refund, look),
        seq("any_order", refund, look),
        seq("any_order", refund),
        seq("subset", look, refund, escalate),
        seq("subset", look),
        seq("superset", refund),
        seq("superset", refund, escalate),
        seq("superset", look, look),
        seq("exact", look, {"name": "issue_refund", "args": {"amount": 500}}),
        seq("exact", look, {"name": "issue_refund", "args": {"amount": 500}}, args="exact"),
        seq(
            "exact",
            look,
            {"name": "issue_refund", "args": {"amount": 1}, "args_mode": "ignore"},
            args="exact",
        ),
    ]
    records = run(
        project,
        capsys,
        [{"id": "S", "input": "refund please", "assertions": assertions, "tool_mocks": MOCKS}],
    )
    refunded = 'issue_refund({"order": "A1", "amount": 500})'
    made = f'called: lookup_order({{"order": "A1"}}), {refunded}'
    assert outcomes(records["S"]["turns"][0]["assertions"]) == [
        (True, f"calls match (exact): {made[8:]}"),
        (
            False,
            'call 1 should be issue_refund, was lookup_order({"order": "A1"}); '
            f"expected (exact): issue_refund, lookup_order; {made}",
        ),
        (
            False,
            f"1 more call(s) than listed, from {refunded}; expected (exact): lookup_order; {made}",
        ),
        (True, f"calls match (in order): {made[8:]}"),
        (
            False,
            "no lookup_order after the calls before it in the list; "
            f"expected (in order): issue_refund, lookup_order; {made}",
        ),
        (True, f"calls match (any order): {made[8:]}"),
        (
            False,
            'called more than listed: lookup_order({"order": "A1"}); '
            f"expected (any order): issue_refund; {made}",
        ),
        (True, f"calls match (subset): {made[8:]}"),
        (
            False,
            'called tools not in the list: issue_refund({"order": "A1", "amount": 500}); '
            f"expected (subset): lookup_order; {made}",
        ),
        (True, f"calls match (superset): {made[8:]}"),
        (False, f"not called: escalate; expected (superset): issue_refund, escalate; {made}"),
        (
            False,
            f"not called: lookup_order; expected (superset): lookup_order, lookup_order; {made}",
        ),
        (True, f"calls match (exact): {made[8:]}"),
        (
            False,
            'call 2 should be issue_refund({"amount": 500}), '
            'was issue_refund({"order": "A1", "amount": 500}); '
            'expected (exact): lookup_order, issue_refund({"amount": 500}); ' + made,
        ),
        (True, f"calls match (exact): {made[8:]}"),
    ]


def test_superset_and_any_order_pair_each_listed_call_with_its_own(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loose = {"name": "lookup_order"}
    strict = {"name": "lookup_order", "args": {"order": "B2"}}
    assertions = [
        # The looser entry comes first: it must leave the call the stricter one needs.
        {"type": "tool_sequence", "order": "superset", "calls": [loose, strict]},
        {"type": "tool_sequence", "order": "any_order", "calls": [loose, strict]},
        {"type": "tool_sequence", "order": "superset", "calls": [strict, strict]},
    ]
    records = run(
        project,
        capsys,
        [{"id": "P", "input": "check both", "assertions": assertions, "tool_mocks": MOCKS}],
    )
    results = records["P"]["turns"][0]["assertions"]
    assert [r["passed"] for r in results] == [True, True, False], results
    assert results[2]["reason"].startswith('not called: lookup_order({"order": "B2"}); ')


def test_tool_count_and_turn_count_over_the_conversation(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    final = [
        {"type": "tool_sequence", "calls": [{"name": "lookup_order"}, {"name": "issue_refund"}]},
        {"type": "tool_count", "name": "issue_refund", "min": 1, "max": 1},
        {"type": "tool_count", "max": 1},
        {"type": "turn_count", "min": 2, "max": 2},
        {"type": "turn_count", "max": 1},
    ]
    case = {
        "id": "M",
        "turns": [
            {"input": "hi", "assertions": [{"type": "tool_count", "max": 0}]},
            {"input": "refund please", "assertions": [{"type": "tool_count", "min": 3}]},
        ],
        "on_missing_input": "end",
        "tool_mocks": MOCKS,
        "final_assertions": final,
    }
    records = run(project, capsys, [case])
    turns = records["M"]["turns"]
    assert outcomes(turns[0]["assertions"]) == [
        (True, "tools were called 0 time(s) in this turn, expected at most 0")
    ]
    assert outcomes(turns[1]["assertions"]) == [
        (False, "tools were called 2 time(s) in this turn, expected at least 3")
    ]
    assert outcomes(records["M"]["final_assertions"]) == [
        (
            True,
            'calls match (exact): lookup_order({"order": "A1"}), '
            'issue_refund({"order": "A1", "amount": 500})',
        ),
        (True, "issue_refund was called 1 time(s) in the conversation, expected between 1 and 1"),
        (False, "tools were called 2 time(s) in the conversation, expected at most 1"),
        (True, "the conversation played 2 turn(s), expected between 2 and 2"),
        (False, "the conversation played 2 turn(s), expected at most 1"),
    ]


# -- refused at load -------------------------------------------------------------------------


def test_bad_new_specs_are_refused_with_file_line_and_field(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def case(name: str, assertion: Body) -> Body:
        return {"id": name, "input": "x", "assertions": [assertion]}

    bad = [
        case("B1", {"type": "any", "assertions": [{"type": "contains", "valu": "a"}]}),
        case("B2", {"type": "not", "assertion": {"type": "not_regex", "pattern": "(?=a)"}}),
        case("B3", {"type": "tool_sequence", "order": "sorted", "calls": [{"name": "a"}]}),
        case("B4", {"type": "tool_count", "name": "a"}),
        case("B5", {"type": "any", "assertions": [{"type": "turn_count", "max": 2}]}),
        case("B6", {"type": "all", "assertions": []}),
        case("B7", {"type": "tool_not_called"}),
        case("B8", {"type": "tool_sequence", "calls": [{"nme": "a"}]}),
        case("B9", {"type": "not", "assertion": {"type": "containz"}}),
        case("B10", {"type": "turn_count", "min": 3, "max": 2}),
    ]
    (project / "bad.jsonl").write_text("".join(json.dumps(c) + "\n" for c in bad))
    capsys.readouterr()
    code = main(["-i", "bad.jsonl", "-n", TARGET, "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == ""
    assert "Traceback" not in err
    assert err.splitlines()[0] == "agenttest-submit: 12 input problems; nothing was run:"
    problems = [line.strip() for line in err.splitlines()[1:]]
    assert problems == [
        "bad.jsonl:1 (test 'B1'): assertions[0].assertions[0].value: required field is missing",
        "bad.jsonl:1 (test 'B1'): assertions[0].assertions[0].valu: unknown field (a typo?)",
        "bad.jsonl:2 (test 'B2'): assertions[0].assertion.pattern: "
        "invalid regex '(?=a)': invalid perl operator: (?=",
        "bad.jsonl:3 (test 'B3'): assertions[0].order: "
        "Input should be 'exact', 'in_order', 'any_order', 'subset' or 'superset'",
        "bad.jsonl:4 (test 'B4'): assertions[0]: give min, max or both",
        "bad.jsonl:5 (test 'B5'): assertions[0].assertions[0].type: "
        "turn_count counts the conversation's turns: put it in final_assertions",
        "bad.jsonl:6 (test 'B6'): assertions[0].assertions: "
        "List should have at least 1 item after validation, not 0",
        "bad.jsonl:7 (test 'B7'): assertions[0].name: required field is missing",
        "bad.jsonl:8 (test 'B8'): assertions[0].calls[0].name: required field is missing",
        "bad.jsonl:8 (test 'B8'): assertions[0].calls[0].nme: unknown field (a typo?)",
        "bad.jsonl:9 (test 'B9'): assertions[0].assertion: unknown assertion type 'containz' "
        "(known: contains, equals, regex, not_contains, not_regex, json_path, type, "
        "tool_called, tool_not_called, agent, script, latency, tool_sequence, tool_count, "
        "turn_count, trace_tool_called, trace_span_count, trace_error_spans, trace_duration, "
        "not, any, all, golden)",
        "bad.jsonl:10 (test 'B10'): assertions[0]: min (3) is greater than max (2)",
    ]


def test_the_schema_lists_the_new_types(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "cases"]) == 0
    schema_text = capsys.readouterr().out
    json.loads(schema_text)
    for name in NEW_TYPES:
        assert f'"const": "{name}"' in schema_text or f'"enum": ["{name}"]' in schema_text, name


NEW_TYPES = (
    "not_contains",
    "not_regex",
    "tool_not_called",
    "tool_sequence",
    "tool_count",
    "turn_count",
    "not",
    "any",
    "all",
)


def test_a_typo_deep_in_a_yaml_group_names_its_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "t.yaml").write_text(
        "tests:\n"
        "  - name: grouped\n"
        "    user_input: hi\n"
        "    assertions:\n"
        "      - type: any\n"
        "        assertions:\n"
        "          - {type: contains, value: x}\n"
        "          - type: not\n"
        "            assertion:\n"
        "              type: tool_sequence\n"
        "              calls:\n"
        "                - {name: a, args_mod: exact}\n"
        "    final_assertions:\n"
        "      - {type: turn_count, max: 2}\n",
        encoding="utf-8",
    )
    capsys.readouterr()
    assert main(["-i", "t.yaml", "-n", TARGET, "--dry-run"]) == 2
    assert capsys.readouterr().err.splitlines()[1:] == [
        "  t.yaml:12 (test 'grouped'): assertions[0].assertions[1].assertion.calls[0].args_mod: "
        "unknown field (a typo?)"
    ]
