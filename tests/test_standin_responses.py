"""The Responses API stand-in (tests/standins/openai_responses.py) speaks the real format:
the official `openai` client creates responses with it, whole and streamed, and makes a
function call round trip; and it refuses what the API refuses, as the API does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from standins.openai_responses import (
    Answer,
    FunctionCall,
    ResponsesStandIn,
    call_function,
    say,
)

KEY = "sk-responses-test"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture
def api() -> Iterator[ResponsesStandIn]:
    with ResponsesStandIn(api_key=KEY) as running:
        yield running


@pytest.fixture
def client(api: ResponsesStandIn) -> openai.OpenAI:
    return openai.OpenAI(base_url=api.base_url, api_key=KEY, max_retries=0)


def refusal(client: openai.OpenAI, **body: Any) -> dict[str, Any]:
    """The error body of a request the stand-in refuses with HTTP 400."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**body)
    assert caught.value.status_code == 400
    # The whole body as it came (the client's `body` is its `error` object alone).
    error: dict[str, Any] = caught.value.response.json()
    assert caught.value.body == error["error"]
    return error


def test_the_official_client_creates_a_response(
    api: ResponsesStandIn, client: openai.OpenAI
) -> None:
    api.script("gpt-test", [say("Hello there, traveller.")])
    response = client.responses.create(
        model="gpt-test",
        instructions="Be brief.",
        input="Hi",
        temperature=0,
        max_output_tokens=64,
        metadata={"case": "greeting"},
    )
    assert response.status == "completed"
    assert response.output_text == "Hello there, traveller."
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.usage is not None
    # "Be brief." and "Hi" in; three words out.
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 3)
    assert response.usage.total_tokens == 6
    assert response.metadata == {"case": "greeting"}
    [received] = api.requests("gpt-test")
    assert received.headers["Authorization"] == f"Bearer {KEY}"
    assert received.body["input"] == "Hi" and received.body["temperature"] == 0


def test_the_official_client_reads_the_stream(api: ResponsesStandIn, client: openai.OpenAI) -> None:
    api.script("gpt-test", [say("Streaming works fine.")])
    events = list(client.responses.create(model="gpt-test", input="Hi", stream=True))
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert "response.output_item.done" in types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Streaming works fine."
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.usage is not None
    assert completed.response.usage.output_tokens == 3

    # The client's stream helper puts the events together as it does with the API's.
    api.script(
        "gpt-test",
        [Answer(text="Let me look.", calls=(FunctionCall("get_weather", {"city": "Oslo"}),))],
    )
    with client.responses.stream(model="gpt-test", input="Weather?", tools=[WEATHER]) as stream:
        final = stream.get_final_response()
    assert final.output_text == "Let me look."
    call = final.output[1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Oslo"}


def test_a_function_call_round_trip(api: ResponsesStandIn, client: openai.OpenAI) -> None:
    api.script("gpt-test", [call_function("get_weather", city="Oslo"), say("It is 3 °C in Oslo.")])
    first = client.responses.create(model="gpt-test", input="Weather in Oslo?", tools=[WEATHER])
    [call] = first.output
    assert call.type == "function_call"
    assert json.loads(call.arguments) == {"city": "Oslo"}
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": '{"c": 3}'}

    # Stateless: the whole conversation again, the call and its output included.
    items: list[Any] = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        answer,
    ]
    second = client.responses.create(model="gpt-test", input=items, tools=[WEATHER])
    assert second.output_text == "It is 3 °C in Oslo."

    # Continued: only the output, after the earlier response.
    api.script("gpt-test", [call_function("get_weather", city="Bergen"), say("Rain.")])
    third = client.responses.create(model="gpt-test", input="And Bergen?", tools=[WEATHER])
    [again] = third.output
    assert again.type == "function_call"
    fourth = client.responses.create(
        model="gpt-test",
        previous_response_id=third.id,
        input=[{"type": "function_call_output", "call_id": again.call_id, "output": "rain"}],
        tools=[WEATHER],
    )
    assert fourth.output_text == "Rain." and fourth.previous_response_id == third.id
    context = api.requests("gpt-test")[-1].context
    assert [i.get("type") for i in context] == ["message", "function_call", "function_call_output"]


def test_unknown_fields_are_refused_as_the_api_refuses_them(client: openai.OpenAI) -> None:
    # `seed` is a Chat Completions parameter; the Responses API does not have it.
    body = refusal(client, model="gpt-test", input="Hi", extra_body={"seed": 7})
    assert body == {
        "error": {
            "message": "Unknown parameter: 'seed'.",
            "type": "invalid_request_error",
            "param": "seed",
            "code": "unknown_parameter",
        }
    }
    # A tool in Chat Completions' nested shape.
    nested = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    body = refusal(client, model="gpt-test", input="Hi", tools=[nested])
    assert body["error"]["param"] == "tools[0].name"
    assert body["error"]["code"] == "missing_required_parameter"
    item = {"role": "user", "content": "Hi", "name": "bob"}
    body = refusal(client, model="gpt-test", input=[item])
    assert body["error"]["message"] == "Unknown parameter: 'input[0].name'."


def test_wrong_types_and_values_are_refused(client: openai.OpenAI) -> None:
    body = refusal(client, model="gpt-test", input="Hi", extra_body={"temperature": "0"})
    assert body["error"] == {
        "message": "Invalid type for 'temperature': expected a decimal, but got a string instead.",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "invalid_type",
    }
    body = refusal(client, model="gpt-test", input="Hi", max_output_tokens=5)
    assert body["error"]["code"] == "integer_below_min_value"
    body = refusal(client, model="gpt-test", input="Hi", metadata={"n": 3})  # type: ignore[dict-item]
    assert body["error"]["param"] == "metadata.n" and body["error"]["code"] == "invalid_type"
    # An assistant message's parts are output_text, not input_text.
    parts = [{"type": "input_text", "text": "Hello"}]
    body = refusal(client, model="gpt-test", input=[{"role": "assistant", "content": parts}])
    assert body["error"]["param"] == "input[0].content[0].type"
    assert body["error"]["code"] == "invalid_value"


def test_tool_outputs_and_stored_responses_are_checked(
    api: ResponsesStandIn, client: openai.OpenAI
) -> None:
    orphan = {"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}
    body = refusal(client, model="gpt-test", input=[orphan])
    assert body["error"]["message"] == (
        "No tool call found for function call output with call_id call_nowhere."
    )
    unanswered = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    body = refusal(client, model="gpt-test", input=[unanswered])
    assert body["error"]["message"] == "No tool output found for function call call_1."
    body = refusal(client, model="gpt-test", input="Hi", previous_response_id="resp_nowhere")
    assert body["error"]["code"] == "previous_response_not_found"

    api.script("gpt-test", [say("Not kept.")])
    unstored = client.responses.create(model="gpt-test", input="Hi", store=False)
    body = refusal(client, model="gpt-test", input="Again", previous_response_id=unstored.id)
    assert body["error"]["param"] == "previous_response_id"


def test_a_wrong_key_is_refused(api: ResponsesStandIn) -> None:
    wrong = openai.OpenAI(base_url=api.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.responses.create(model="gpt-test", input="Hi")
    assert caught.value.code == "invalid_api_key"
    assert "sk-wrong" not in str(caught.value.body)


def test_a_cut_off_answer_is_incomplete(api: ResponsesStandIn, client: openai.OpenAI) -> None:
    long = " ".join(f"w{i}" for i in range(40))
    api.script("gpt-test", [Answer(text=long, incomplete="max_output_tokens")])
    response = client.responses.create(model="gpt-test", input="Talk", max_output_tokens=16)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == " ".join(f"w{i}" for i in range(16))


def test_a_failed_model_ends_the_stream_or_answers_500(
    api: ResponsesStandIn, client: openai.OpenAI
) -> None:
    api.script("gpt-test", [Answer(failure="The model had an error.")] * 2)
    events = list(client.responses.create(model="gpt-test", input="Hi", stream=True))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.status == "failed"
    assert failed.response.error is not None
    assert failed.response.error.code == "server_error"
    with pytest.raises(openai.InternalServerError) as caught:
        client.responses.create(model="gpt-test", input="Hi")
    assert caught.value.body == {
        "message": "The model had an error.",
        "type": "server_error",
        "param": None,
        "code": None,
    }
