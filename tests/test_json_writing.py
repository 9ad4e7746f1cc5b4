"""The JSON a turn writes each time it runs: an agent's request body, and the state
saved with each step. Both hold the conversation so far and grow with it, so both are
written by orjson (json_values.compact_json); they must say what json.dumps and the
state model's own dump said, and what orjson refuses must go the old way. A case's
record is stored as json.dumps's text, whichever way its run is stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agenttest_submit.inputs.expand import CaseStream, Spool
from agenttest_submit.inputs.sources import FileInput
from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.engine.state import ConversationState
from agenttest_worker.json_values import body_bytes, compact_json
from agenttest_worker.results import AssertionResult, ToolCall, TurnResult

BODIES: list[Any] = [
    {"model": "m", "messages": [{"role": "user", "content": "héllo ✓ 日本 \u2028 \x00"}]},
    {"temperature": 0.1, "top_p": 1e-7, "n": 3, "stop": None, "stream": False},
    {"nested": [[1, 2.5, {"a": [True, None]}]], "empty": {}, "list": []},
    {1: "an integer key", 2.5: "a float key", None: "a null key"},
    {True: "a bool key", False: "another"},
]


@pytest.mark.parametrize("body", BODIES)
def test_a_request_body_says_what_json_dumps_said(body: Any) -> None:
    written = body_bytes(body)
    assert compact_json(body) == written
    assert json.loads(written) == json.loads(json.dumps(body, ensure_ascii=False))


def test_what_orjson_refuses_is_written_or_refused_as_before() -> None:
    huge = {"n": 2**70}
    assert compact_json(huge) is None
    assert body_bytes(huge) == json.dumps(huge, ensure_ascii=False).encode()
    lone = {"content": "\ud800"}
    assert compact_json(lone) is None
    with pytest.raises(UnicodeEncodeError):
        body_bytes(lone)


def _state(messages: list[dict[str, Any]]) -> ConversationState:
    turn = TurnResult(
        turn=1,
        input="Book it?",
        input_source="static",
        output="Booked ✓",
        tool_calls=[ToolCall(name="book", args={"when": "tomorrow"}, id="call_1")],
        assertions=[AssertionResult(type="contains", passed=True, reason="ok")],
        status="passed",
    )
    return ConversationState(
        case_id="c1",
        session_id="s1",
        messages=messages,
        turns=[turn],
        tool_results={"call_1": {"ok": True}},
        earlier_turns=3,
        earlier_run=3,
    )


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [
            {"role": "user", "content": "héllo"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1"}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}'},
            {"role": "user", "content": [{"type": "text", "text": "日本"}]},
        ],
        # orjson refuses it: the model's own dump writes the state.
        [{"role": "tool", "content": "x", "big": 2**70}],
    ],
)
def test_a_stored_state_reads_back_as_the_model_dumped_it(messages: list[dict[str, Any]]) -> None:
    state = _state(messages)
    stored = state.stored_json()
    assert json.loads(stored) == json.loads(state.model_dump_json())
    again = ConversationState.model_validate_json(stored)
    assert again.model_dump_json() == state.model_dump_json()


def test_a_spooled_case_is_stored_as_json_dumps_text(tmp_path: Path) -> None:
    """A fleet's run stores the spool's text as it is; an embedded run writes the parsed
    records with json.dumps: both store the same text, escaped to ASCII."""
    cases = [
        {"id": "c1", "input": "héllo ✓ 日本 \u2028", "tags": ["a\tb"]},
        {"id": "c2", "input": "twice", "repeat": 2},
    ]
    path = tmp_path / "cases.jsonl"
    path.write_text("\n" + "".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    config = ProjectConfig.model_validate({"agents": {"bot": {"base_url": "http://x/v1"}}})
    stream = CaseStream([FileInput(path)], config, target="bot")
    with Spool(stream, "bot") as spool:
        stored = list(spool.stored_records())
        records = list(spool.records())
    assert [key for key, _, _ in stored] == ["c1", "c2#1", "c2#2"]
    for (_, _, text), (_, _, record) in zip(stored, records, strict=True):
        assert text.text == json.dumps(record) and text.text.isascii()
    assert records[0][2]["source_line"] == 2 and records[2][2]["repetition"] == 2
