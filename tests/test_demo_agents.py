"""The demo agents, over real HTTP: every rule their module docstrings document."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agenttest_submit.commands.demo_command import main as cli_main
from agenttest_worker.demo.demo_server import DemoServer

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS = ["expense", "user-sim", "validator", "generator", "echo", "coin"]
GREETING = "Hello! I can help you submit expense reports."
ASK_TYPE = "What type of expense would you like to submit?"
APPROVAL = "This requires manager approval. Please provide PO number."
SUBMITTED = "Expense submitted. Reference: EXP-2025-001"


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with DemoServer() as server:
        yield server.base_url


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=10) as http:
        yield http


def chat(
    client: httpx.Client,
    model: str,
    messages: list[dict[str, Any]],
    metadata: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": messages, **extra}
    if metadata is not None:
        body["metadata"] = metadata
    response = client.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def message(body: dict[str, Any]) -> dict[str, Any]:
    choice = body["choices"][0]
    result: dict[str, Any] = choice["message"]
    return result


def content(body: dict[str, Any]) -> str:
    text = message(body)["content"]
    assert isinstance(text, str)
    return text


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def expense_call(call_id: str, amount: float, kind: str, description: str) -> dict[str, Any]:
    args = {"amount": amount, "type": kind, "description": description}
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "create_expense", "arguments": json.dumps(args)},
    }


def tool_result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def only_tool_call(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(id, parsed arguments) of the single create_expense call the reply makes."""
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    msg = message(body)
    assert msg["content"] is None
    [call] = msg["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "create_expense"
    args: dict[str, Any] = json.loads(call["function"]["arguments"])
    return call["id"], args


def data_url(payload: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(payload).decode()


def image_message(text: str, url: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }


# --- server and protocol -------------------------------------------------------------


def test_models_lists_every_demo_model(client: httpx.Client) -> None:
    response = client.get("/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == MODELS


def test_response_is_a_full_chat_completion_with_word_count_usage(client: httpx.Client) -> None:
    body = chat(client, "expense", [user("Hello there")])
    assert re.fullmatch(r"chatcmpl-demo-\w+", body["id"])
    assert body["object"] == "chat.completion"
    assert body["created"] == 0
    assert body["model"] == "expense"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": GREETING},
            "finish_reason": "stop",
        }
    ]
    # "Hello there" is 2 words; the greeting is 8.
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10}
    assert "state" not in body
    assert "awaiting_input" not in body


def test_identical_requests_get_identical_responses(client: httpx.Client) -> None:
    first = chat(client, "echo", [user("same")], {"k": "v"})
    again = chat(client, "echo", [user("same")], {"k": "v"})
    other = chat(client, "echo", [user("different")], {"k": "v"})
    assert first == again
    assert other["id"] != first["id"]


def test_stream_flag_is_ignored(client: httpx.Client) -> None:
    body = chat(client, "expense", [user("hi")], stream=True)
    assert body["object"] == "chat.completion"
    assert content(body) == GREETING


def test_unknown_model_is_404_in_openai_error_shape(client: httpx.Client) -> None:
    response = client.post("/chat/completions", json={"model": "gpt-9", "messages": []})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "gpt-9" in error["message"]


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1, 2]",
        b'{"messages": []}',
        b'{"model": "echo", "messages": "hello"}',
        b'{"model": "echo", "messages": ["hello"]}',
        b'{"model": "echo", "messages": [], "metadata": "x"}',
    ],
    ids=[
        "malformed",
        "not-object",
        "no-model",
        "messages-string",
        "message-not-object",
        "metadata-string",
    ],
)
def test_bad_request_is_400_in_openai_error_shape(client: httpx.Client, raw: bytes) -> None:
    response = client.post(
        "/chat/completions", content=raw, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"]


def test_delay_header_delays_the_answer(client: httpx.Client) -> None:
    started = time.monotonic()
    response = client.post(
        "/chat/completions",
        json={"model": "echo", "messages": []},
        headers={"X-Demo-Delay-Ms": "100"},
    )
    assert response.status_code == 200
    assert time.monotonic() - started >= 0.1


def test_delay_header_makes_a_short_client_timeout_expire(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=0.2) as http, pytest.raises(httpx.ReadTimeout):
        http.post(
            "/chat/completions",
            json={"model": "echo", "messages": []},
            headers={"X-Demo-Delay-Ms": "1500"},
        )


@pytest.mark.parametrize("value", ["soon", "-5"])
def test_bad_delay_header_is_400(client: httpx.Client, value: str) -> None:
    response = client.post(
        "/chat/completions",
        json={"model": "echo", "messages": []},
        headers={"X-Demo-Delay-Ms": value},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_demo_server_picks_free_ports_and_stops() -> None:
    with DemoServer() as first, DemoServer() as second:
        url = first.base_url
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", url)
        assert url != second.base_url
        assert httpx.get(url + "/models").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/models")
    with pytest.raises(RuntimeError):
        _ = first.base_url


def test_demo_server_start_returns_the_base_url_and_is_idempotent() -> None:
    server = DemoServer(port=0)
    try:
        url = server.start()
        assert server.start() == url == server.base_url
        assert httpx.get(url + "/models").status_code == 200
    finally:
        server.stop()
    server.stop()  # a second stop is harmless


# --- cli ---------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cli_serve_prints_the_url_and_exits_0_on_signal(signum: signal.Signals) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with subprocess.Popen(
        [sys.executable, "-m", "agenttest_submit.commands.demo_command", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as process:
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()
            if not url:  # it exited: show why
                pytest.fail(f"serve printed no URL: {process.communicate(timeout=10)[1]}")
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", url)
            assert [m["id"] for m in httpx.get(url + "/models").json()["data"]] == MODELS
            process.send_signal(signum)
            assert process.wait(timeout=10) == 0
        finally:
            if process.poll() is None:
                process.kill()


def test_cli_serve_on_a_taken_port_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with DemoServer() as server:
        port = server.base_url.rsplit(":", 1)[1].split("/")[0]
        assert cli_main(["serve", "--port", port]) == 1
    assert "cannot serve" in capsys.readouterr().err


def test_cli_without_a_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main([])
    assert exited.value.code == 2


# --- expense -----------------------------------------------------------------------


def test_expense_spec_t001_flow_without_tool_results(client: httpx.Client) -> None:
    history = [user("I want to submit an expense report")]
    first = chat(client, "expense", history)
    assert content(first) == ASK_TYPE

    history += [message(first), user("Business travel to Beijing, flight $2000, hotel $1500")]
    second = chat(client, "expense", history)
    call_id, args = only_tool_call(second)
    assert call_id == "call_1"
    assert args == {
        "amount": 2000,
        "type": "travel",
        "description": "Business travel to Beijing, flight $2000, hotel $1500",
    }
    assert isinstance(args["amount"], int)

    # The draft (a create_expense call) awaits confirmation even with no tool result.
    history += [message(second), user("Yes, confirm")]
    third = chat(client, "expense", history)
    assert content(third) == SUBMITTED
    assert third["choices"][0]["finish_reason"] == "stop"
    assert third["state"] == {
        "expense": {
            "status": "submitted",
            "reference": "EXP-2025-001",
            "amount": 2000,
            "type": "travel",
        }
    }
    assert third["awaiting_input"] is False


def test_expense_reads_the_tool_result_and_asks_to_confirm(client: httpx.Client) -> None:
    history = [
        user("Team dinner $250"),
        assistant(None, [expense_call("call_1", 250, "meals", "Team dinner $250")]),
        tool_result("call_1", '{"id": "EXP-42", "status": "draft"}'),
    ]
    body = chat(client, "expense", history)
    assert content(body) == (
        "I've prepared expense EXP-42 for $250 (meals). Shall I submit it? Please confirm."
    )
    assert body["choices"][0]["finish_reason"] == "stop"

    history += [message(body), user("ok")]
    submitted = chat(client, "expense", history)
    assert content(submitted) == SUBMITTED
    assert submitted["state"]["expense"]["amount"] == 250
    assert submitted["state"]["expense"]["type"] == "meals"


@pytest.mark.parametrize(
    "result",
    [
        '{"status": "not executed", "id": "EXP-9"}',
        '{"status": "not executed: no tool mock"}',
        "expense created",
        '{"ok": true}',
        '["EXP-1"]',
        '{"id": ""}',
    ],
)
def test_expense_tool_result_without_usable_id_is_a_draft(
    client: httpx.Client, result: str
) -> None:
    history = [
        user("Flight $300"),
        assistant(None, [expense_call("call_1", 300, "travel", "Flight $300")]),
        tool_result("call_1", result),
    ]
    assert content(chat(client, "expense", history)) == (
        "I've prepared expense EXP-DRAFT for $300 (travel). Shall I submit it? Please confirm."
    )


def test_expense_tool_result_uses_the_call_it_answers(client: httpx.Client) -> None:
    history = [
        user("Flight $300"),
        assistant(None, [expense_call("call_1", 300, "travel", "Flight $300")]),
        tool_result("call_1", '{"id": "EXP-1"}'),
        user("Also a laptop $1,200"),
        assistant(None, [expense_call("call_2", 1200, "equipment", "Also a laptop $1,200")]),
        tool_result("call_1", '{"id": "EXP-1"}'),
    ]
    assert "for $300 (travel)" in content(chat(client, "expense", history))


def test_expense_tool_result_for_an_unknown_call_uses_the_latest_call(
    client: httpx.Client,
) -> None:
    # The call's arguments say travel although "Taxi $40" alone would read as other.
    history = [
        user("Taxi $40"),
        assistant(None, [expense_call("call_1", 40, "travel", "Taxi $40")]),
        {"role": "tool", "content": '{"id": "EXP-5"}'},
    ]
    assert "EXP-5 for $40 (travel)" in content(chat(client, "expense", history))


def test_expense_spec_t002_large_amount_needs_a_po_number(client: httpx.Client) -> None:
    history = [user("Submit $100,000 equipment purchase")]
    first = chat(client, "expense", history)
    assert content(first) == APPROVAL

    history += [message(first), user("PO-12345")]
    call_id, args = only_tool_call(chat(client, "expense", history))
    assert call_id == "call_1"
    assert args == {
        "amount": 100000,
        "type": "equipment",
        "description": "Submit $100,000 equipment purchase",
    }


def test_expense_po_number_without_an_amount_is_recorded(client: httpx.Client) -> None:
    body = chat(client, "expense", [user("my po12345 is ready")])
    assert content(body) == (
        "Thanks, PO PO12345 recorded. What type of expense would you like to submit?"
    )


def test_expense_po_number_in_the_same_message_lifts_the_approval(client: httpx.Client) -> None:
    _, args = only_tool_call(chat(client, "expense", [user("New servers $25,000, PO-77")]))
    assert args["amount"] == 25000


def test_expense_po_number_given_earlier_lifts_the_approval(client: httpx.Client) -> None:
    history = [user("PO-1"), assistant("Thanks, PO PO-1 recorded."), user("Hotel $12,500")]
    _, args = only_tool_call(chat(client, "expense", history))
    assert args == {"amount": 12500, "type": "travel", "description": "Hotel $12,500"}


@pytest.mark.parametrize(
    ("text", "amount", "kind"),
    [
        ("Flight to Paris $300", 300, "travel"),
        ("Business trip, $ 75", 75, "travel"),
        ("Team lunch $45.50", 45.5, "meals"),
        ("New laptop $1,200", 1200, "equipment"),
        ("Office plants $9,999.99", 9999.99, "other"),
    ],
)
def test_expense_amount_creates_a_typed_expense(
    client: httpx.Client, text: str, amount: float, kind: str
) -> None:
    _, args = only_tool_call(chat(client, "expense", [user(text)]))
    assert args == {"amount": amount, "type": kind, "description": text}


def test_expense_approval_threshold_is_10000(client: httpx.Client) -> None:
    assert content(chat(client, "expense", [user("Conference $10,000")])) == APPROVAL


def test_expense_tool_call_ids_count_earlier_calls(client: httpx.Client) -> None:
    history = [
        user("Flight $300"),
        assistant(None, [expense_call("call_1", 300, "travel", "Flight $300")]),
        tool_result("call_1", '{"id": "EXP-1"}'),
        assistant("I've prepared expense EXP-1. Please confirm."),
        user("Another one: taxi $40"),
    ]
    call_id, _ = only_tool_call(chat(client, "expense", history))
    assert call_id == "call_2"


def test_expense_yes_without_a_pending_confirmation_is_a_greeting(client: httpx.Client) -> None:
    history = [user("hello"), assistant(GREETING), user("yes")]
    body = chat(client, "expense", history)
    assert content(body) == GREETING
    assert "state" not in body


def test_expense_yes_after_a_confirm_question_submits_the_typed_amount(
    client: httpx.Client,
) -> None:
    history = [
        user("Dinner with client, $180"),
        assistant("Do you confirm $180 for dinner?"),
        user("proceed"),
    ]
    body = chat(client, "expense", history)
    assert content(body) == SUBMITTED
    assert body["state"]["expense"] == {
        "status": "submitted",
        "reference": "EXP-2025-001",
        "amount": 180,
        "type": "meals",
    }


def test_expense_yes_is_a_whole_word(client: httpx.Client) -> None:
    history = [user("$50 taxi"), assistant("Please confirm."), user("I need to book a taxi")]
    assert content(chat(client, "expense", history)) == GREETING


def test_expense_image_is_a_receipt(client: httpx.Client) -> None:
    body = chat(
        client,
        "expense",
        [image_message("I want to submit an expense with receipt", data_url(b"0123456789"))],
    )
    assert content(body) == "I received your receipt image (10 bytes). What is the amount?"


def test_expense_image_with_a_plain_url_has_0_bytes(client: httpx.Client) -> None:
    body = chat(client, "expense", [image_message("receipt", "https://example.com/r.png")])
    assert content(body) == "I received your receipt image (0 bytes). What is the amount?"


def test_expense_amount_wins_over_an_image(client: httpx.Client) -> None:
    body = chat(client, "expense", [image_message("Taxi $30", data_url(b"x"))])
    _, args = only_tool_call(body)
    assert args == {"amount": 30, "type": "other", "description": "Taxi $30"}


@pytest.mark.parametrize(
    "text", ["I want to SUBMIT something", "Reimbursement please", "my expenses"]
)
def test_expense_mention_asks_for_the_type(client: httpx.Client, text: str) -> None:
    assert content(chat(client, "expense", [user(text)])) == ASK_TYPE


def test_expense_joins_text_parts_with_a_space(client: httpx.Client) -> None:
    parts = [{"type": "text", "text": "Team lunch"}, {"type": "text", "text": "$45"}]
    _, args = only_tool_call(chat(client, "expense", [{"role": "user", "content": parts}]))
    assert args["description"] == "Team lunch $45"


def test_expense_reads_text_content_parts(client: httpx.Client) -> None:
    parts = [{"type": "text", "text": "I want to"}, {"type": "text", "text": "file an expense"}]
    body = chat(client, "expense", [{"role": "user", "content": parts}])
    assert content(body) == ASK_TYPE


@pytest.mark.parametrize(
    "messages",
    [[], [{"role": "system", "content": "You are helpful"}], [user("What's the weather?")]],
    ids=["empty", "system-only", "off-topic"],
)
def test_expense_greets_otherwise(client: httpx.Client, messages: list[dict[str, Any]]) -> None:
    assert content(chat(client, "expense", messages)) == GREETING


def test_expense_french_locale_prefixes_text_replies_only(client: httpx.Client) -> None:
    fr = {"locale": "fr", "other": "ignored"}
    assert content(chat(client, "expense", [user("hi")], fr)) == "[fr] " + GREETING
    assert content(chat(client, "expense", [user("hi")], {"locale": "de"})) == GREETING
    body = chat(client, "expense", [user("Lunch $20")], fr)
    assert only_tool_call(body)[1]["amount"] == 20


# --- user-sim ----------------------------------------------------------------------

SIM_METADATA = {
    "test_mode": "simulator",
    "persona": "New employee",
    "goal": "Submit an expense",
    "turn_number": 2,
    "max_turns": 10,
}


def simulate(client: httpx.Client, messages: list[dict[str, Any]]) -> dict[str, Any]:
    history = [{"role": "system", "content": "You simulate a user."}, *messages]
    reply = json.loads(content(chat(client, "user-sim", history, SIM_METADATA)))
    assert set(reply) == {"input", "goal_achieved", "reasoning"}
    assert isinstance(reply["reasoning"], str) and reply["reasoning"]
    result: dict[str, Any] = reply
    return result


@pytest.mark.parametrize(
    ("agent_says", "expected_input", "achieved"),
    [
        ("Expense submitted. Reference: EXP-2025-001", "", True),
        (ASK_TYPE, "It's for a client dinner, $250", False),
        (APPROVAL, "PO-12345", False),
        ("Shall I submit it? Please CONFIRM.", "Yes, confirm", False),
        ("What is the amount?", "The amount is $500", False),
        ("Interesting.", "Please continue", False),
    ],
)
def test_simulator_answers_the_last_question(
    client: httpx.Client, agent_says: str, expected_input: str, achieved: bool
) -> None:
    reply = simulate(client, [user("Help me file an expense"), assistant(agent_says)])
    assert reply["input"] == expected_input
    assert reply["goal_achieved"] is achieved


def test_simulator_reads_only_the_last_assistant_message(client: httpx.Client) -> None:
    history = [
        assistant("Expense submitted."),
        user("another"),
        {"role": "assistant", "content": [{"type": "text", "text": "What is the amount?"}]},
    ]
    assert simulate(client, history)["input"] == "The amount is $500"


@pytest.mark.parametrize(
    "messages",
    [[user("hi")], [user("hi"), assistant(None, [expense_call("call_1", 1, "other", "x")])]],
    ids=["no-assistant", "tool-call-only"],
)
def test_simulator_continues_without_assistant_text(
    client: httpx.Client, messages: list[dict[str, Any]]
) -> None:
    reply = simulate(client, messages)
    assert reply == {**reply, "input": "Please continue", "goal_achieved": False}


@pytest.mark.parametrize("junk", [True, "true"])
def test_simulator_junk_mode_returns_non_json(client: httpx.Client, junk: object) -> None:
    body = chat(client, "user-sim", [assistant(ASK_TYPE)], {**SIM_METADATA, "junk": junk})
    assert content(body) == "I am not sure what to say"


def test_simulator_junk_false_is_normal(client: httpx.Client) -> None:
    body = chat(client, "user-sim", [assistant(ASK_TYPE)], {"junk": False})
    assert json.loads(content(body))["input"] == "It's for a client dinner, $250"


# --- validator ---------------------------------------------------------------------


def judge(client: httpx.Client, criteria: str | None, *messages: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"test_mode": "validator"}
    if criteria is not None:
        metadata["criteria"] = criteria
    text = content(chat(client, "validator", list(messages), metadata))
    prose, fenced = text.split("\n", 1)
    assert prose == "Here is my evaluation:"
    assert fenced.startswith("```json\n") and fenced.endswith("\n```")
    verdict: dict[str, Any] = json.loads(fenced[len("```json\n") : -len("\n```")])
    assert set(verdict) == {"passed", "score", "reason", "suggestions"}
    return verdict


def test_validator_passes_when_every_phrase_appears(client: httpx.Client) -> None:
    verdict = judge(
        client,
        'Must say "Submitted" and give the "exp-2025" reference',
        user("Yes, confirm"),
        assistant(SUBMITTED),
    )
    assert verdict == {
        "passed": True,
        "score": 1.0,
        "reason": 'found "Submitted", "exp-2025"',
        "suggestions": [],
    }


def test_validator_fails_and_suggests_missing_phrases(client: httpx.Client) -> None:
    verdict = judge(client, 'Mentions "submitted" and "receipt"', user("x"), assistant(SUBMITTED))
    assert verdict["passed"] is False
    assert verdict["score"] == 0.5
    assert verdict["suggestions"] == ["receipt"]
    assert verdict["reason"] == 'found "submitted"; missing "receipt"'


def test_validator_forbidden_phrase_present_fails(client: httpx.Client) -> None:
    verdict = judge(
        client,
        'Says "submitted" but never "reference"',
        user("x"),
        assistant(SUBMITTED),
    )
    assert verdict["passed"] is False
    assert verdict["score"] == 0.5
    assert verdict["suggestions"] == ['do not mention "reference"']
    assert 'present though forbidden "reference"' in verdict["reason"]


def test_validator_forbidden_phrase_absent_passes(client: httpx.Client) -> None:
    verdict = judge(client, 'Must not mention "error"', user("x"), assistant(SUBMITTED))
    assert verdict == {
        "passed": True,
        "score": 1.0,
        "reason": 'avoided "error"',
        "suggestions": [],
    }


def test_validator_negation_reaches_only_12_characters_back(client: httpx.Client) -> None:
    # "not " is 13+ characters before the quote here, so "error" is required.
    verdict = judge(client, 'not harsh, and it says "error"', assistant(SUBMITTED))
    assert verdict["passed"] is False
    assert verdict["suggestions"] == ["error"]


def test_validator_negation_stops_at_the_previous_phrase(client: httpx.Client) -> None:
    # Within 12 characters of the second quote, but before the first phrase ends.
    verdict = judge(client, 'not "x1" or "submitted"', assistant(SUBMITTED))
    assert verdict["passed"] is True
    assert verdict["reason"] == 'found "submitted"; avoided "x1"'


def test_validator_accepts_curly_quotes(client: httpx.Client) -> None:
    verdict = judge(client, "Says “submitted”", assistant("nothing here"))
    assert verdict["suggestions"] == ["submitted"]


@pytest.mark.parametrize("criteria", [None, "Response should be helpful"])
def test_validator_without_quoted_phrases_passes(
    client: httpx.Client, criteria: str | None
) -> None:
    verdict = judge(client, criteria, user("x"), assistant("anything"))
    assert verdict == {
        "passed": True,
        "score": 1.0,
        "reason": "no quoted phrase to check in the criteria",
        "suggestions": [],
    }


def test_validator_judges_only_the_last_assistant_message(client: httpx.Client) -> None:
    conversation = [
        user("Submit"),
        assistant(SUBMITTED),
        user("thanks"),
        {"role": "assistant", "content": [{"type": "text", "text": "You're welcome"}]},
    ]
    verdict = judge(client, 'Says "submitted" and "welcome"', *conversation)
    assert verdict["suggestions"] == ["submitted"]
    assert verdict["score"] == 0.5


def test_validator_score_is_the_fraction_satisfied(client: httpx.Client) -> None:
    verdict = judge(client, '"a1" "b2" "c3"', assistant("a1 only"))
    assert verdict["score"] == pytest.approx(1 / 3)
    assert verdict["suggestions"] == ["b2", "c3"]


# --- generator ---------------------------------------------------------------------


def generate(client: httpx.Client, **metadata: Any) -> list[dict[str, Any]]:
    meta = {"test_mode": "generator", "target_agent": "assistants.expense", **metadata}
    reply = json.loads(content(chat(client, "generator", [user("generate")], meta)))
    assert set(reply) == {"cases"}
    cases: list[dict[str, Any]] = reply["cases"]
    return cases


def test_generator_default_is_three_scenarios(client: httpx.Client) -> None:
    cases = generate(client)
    assert [c["id"] for c in cases] == ["G001", "G002", "G003"]
    assert cases[0] == {
        "id": "G001",
        "name": "Greeting (happy-path)",
        "input": "Hello",
        "assertions": [{"type": "contains", "value": "expense reports"}],
    }
    assert cases[1]["type"] == "multi_turn"
    assert {"type": "tool_called", "name": "create_expense"} in cases[1]["turns"][1]["assertions"]
    assert cases[2]["turns"][0]["input"] == "Submit $100,000 equipment purchase"
    assert cases[2]["turns"][0]["assertions"] == [{"type": "contains", "value": "manager approval"}]


@pytest.mark.parametrize(
    ("count", "expected"), [(5, 5), ("7", 7), (" 2 ", 2), (0, 0), (-1, 0), ("many", 3), (True, 3)]
)
def test_generator_count(client: httpx.Client, count: object, expected: int) -> None:
    cases = generate(client, count=count)
    assert [c["id"] for c in cases] == [f"G{i:03d}" for i in range(1, expected + 1)]


def test_generator_cycles_through_the_scenarios(client: httpx.Client) -> None:
    cases = generate(client, count=7, focus="edge-cases")
    strip = [{k: v for k, v in c.items() if k != "id"} for c in cases]
    assert strip[3] == strip[0] and strip[4] == strip[1] and strip[6] == strip[0]
    assert strip[0] != strip[1] != strip[2]
    assert all(c["name"].endswith(" (edge-cases)") for c in cases)


@pytest.mark.parametrize("flag", [True, "true"])
def test_generator_include_invalid_breaks_the_second_case(
    client: httpx.Client, flag: object
) -> None:
    cases = generate(client, count=3, include_invalid=flag)
    assert cases[1]["turns"][0]["assertions"][0]["type"] == "contanis"
    assert "contanis" not in json.dumps([cases[0], cases[2]])


def test_generator_cases_are_valid_unless_asked(client: httpx.Client) -> None:
    assert "contanis" not in json.dumps(generate(client, count=6, include_invalid=False))


def test_generated_cases_pass_against_the_expense_agent(client: httpx.Client) -> None:
    """The generator's docstring promises it; run each case's turns and check its
    contains / tool_called assertions the way the runner would."""
    for case in generate(client, count=3):
        turns = case.get("turns") or [{"input": case["input"], "assertions": case["assertions"]}]
        history: list[dict[str, Any]] = []
        for turn in turns:
            history.append(user(turn["input"]))
            reply = message(chat(client, "expense", history))
            history.append(reply)
            called = [call["function"]["name"] for call in reply.get("tool_calls", [])]
            for assertion in turn["assertions"]:
                if assertion["type"] == "contains":
                    assert assertion["value"] in (reply["content"] or ""), case["id"]
                else:
                    assert assertion["type"] == "tool_called"
                    assert assertion["name"] in called, case["id"]


# --- echo --------------------------------------------------------------------------


def test_echo_returns_what_it_was_sent(client: httpx.Client) -> None:
    messages = [
        {"role": "system", "content": "sys"},
        image_message("look", "data:image/png;base64,AAAA"),
    ]
    metadata = {"test_mode": "validator", "nested": {"b": 1, "a": [True, None]}}
    tools = [{"type": "function", "function": {"name": "create_expense", "parameters": {}}}]
    body = chat(client, "echo", messages, metadata, tools=tools)
    expected = {"messages": messages, "metadata": metadata, "tools": tools}
    assert content(body) == json.dumps(expected, sort_keys=True)
    assert body["choices"][0]["finish_reason"] == "stop"


def test_echo_reports_absent_fields_as_null(client: httpx.Client) -> None:
    body = chat(client, "echo", [user("hi")])
    assert json.loads(content(body)) == {
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": None,
        "tools": None,
    }
