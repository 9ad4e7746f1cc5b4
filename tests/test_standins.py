"""The provider stand-ins (tests/standins/) speak the real APIs: the official `openai`
(OpenAI and AzureOpenAI) and `anthropic` clients drive each one, plain, streamed and
with tools, and each refuses an unknown field and a wrong type as its provider does,
in the provider's own error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from standins.anthropic_messages import AnthropicMessagesStandIn
from standins.azure_openai import AzureOpenAIStandIn
from standins.openai_chat import OpenAIChatStandIn
from standins.scripting import Answer, Call

KEY = "sk-standin-3c9d1e"
AZURE_KEY = "azure-standin-81f0"
AD_TOKEN = "entra-token-5a2b"
API_VERSION = "2024-10-21"
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a city up",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
HI: list[Any] = [{"role": "user", "content": "Hi there"}]


@pytest.fixture
def chat() -> Iterator[OpenAIChatStandIn]:
    with OpenAIChatStandIn(api_key=KEY) as running:
        yield running


@pytest.fixture
def azure() -> Iterator[AzureOpenAIStandIn]:
    with AzureOpenAIStandIn(["gpt-prod"], api_key=AZURE_KEY, ad_token=AD_TOKEN) as running:
        yield running


@pytest.fixture
def messages() -> Iterator[AnthropicMessagesStandIn]:
    with AnthropicMessagesStandIn(api_key=KEY) as running:
        yield running


# -- OpenAI Chat Completions -----------------------------------------------------------------


def test_the_openai_client_reads_a_completion_a_stream_and_tool_calls(
    chat: OpenAIChatStandIn,
) -> None:
    client = openai.OpenAI(base_url=chat.base_url, api_key=KEY, max_retries=0)
    chat.script("gpt-test", Answer("Hello there friend"), "Streamed words here")
    whole = client.chat.completions.create(model="gpt-test", messages=HI, temperature=0, seed=7)
    assert whole.choices[0].message.content == "Hello there friend"
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None and whole.usage.completion_tokens == 3

    stream = client.chat.completions.create(
        model="gpt-test", messages=HI, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Streamed words here"
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3
    assert chat.received()[-1].raw  # the stream ended in data: [DONE]: the client returned

    chat.script("gpt-test", Answer(tool_calls=[Call("lookup", {"city": "Oslo"})]))
    with client.chat.completions.stream(model="gpt-test", messages=HI, tools=[LOOKUP]) as events:
        final = events.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {
        "city": "Oslo"
    }
    assert final.choices[0].finish_reason == "tool_calls"

    chat.script("gpt-test", "It is sunny in Oslo")
    answered = client.chat.completions.create(
        model="gpt-test",
        messages=[
            *HI,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": "lookup", "arguments": call.function.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ],
        tools=[LOOKUP],
    )
    assert answered.choices[0].message.content == "It is sunny in Oslo"
    assert [b["temperature"] for b in chat.bodies("gpt-test")[:1]] == [0]
    assert chat.bodies("gpt-test")[0]["seed"] == 7


def openai_refusal(client: openai.OpenAI, **fields: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**{"model": "gpt-test", "messages": HI, **fields})
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict)
    return body


def test_openai_refuses_an_unknown_field_and_a_wrong_type_as_the_api_does(
    chat: OpenAIChatStandIn,
) -> None:
    client = openai.OpenAI(base_url=chat.base_url, api_key=KEY, max_retries=0)
    # The client unwraps {"error": {...}} into the exception's body.
    assert openai_refusal(client, extra_body={"options": {"mode": "x"}}) == {
        "message": "Unrecognized request argument supplied: options",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert openai_refusal(client, extra_body={"seed": "7"}) == {
        "message": "Invalid type for 'seed': expected an integer, but got a string instead.",
        "type": "invalid_request_error",
        "param": "seed",
        "code": "invalid_type",
    }
    wrong = openai_refusal(client, extra_body={"temperature": "0"})
    assert wrong["code"] == "invalid_type" and "expected a decimal" in wrong["message"]
    metadata = openai_refusal(client, metadata={"case": "c1"})
    assert metadata["param"] == "metadata" and "'store'" in metadata["message"]
    options = openai_refusal(client, stream_options={"include_usage": True})
    assert options["param"] == "stream_options"
    unanswered = openai_refusal(
        client,
        messages=[
            *HI,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            },
        ],
    )
    assert "call_1" in unanswered["message"]
    assert openai_refusal(client, tool_choice="auto")["param"] == "tool_choice"
    json_mode = openai_refusal(client, response_format={"type": "json_object"})
    assert "must contain the word 'json'" in json_mode["message"]
    assert len(chat.refusals()) == 8 and chat.accepted() == []

    with pytest.raises(openai.AuthenticationError) as caught:
        wrong_key = openai.OpenAI(base_url=chat.base_url, api_key="sk-wrong", max_retries=0)
        wrong_key.chat.completions.create(model="gpt-test", messages=HI)
    assert caught.value.status_code == 401
    # What is sent with store: true is accepted, metadata and all.
    chat.script("gpt-test", "Stored")
    client.chat.completions.create(
        model="gpt-test", messages=HI, store=True, metadata={"case": "c1"}
    )
    assert chat.bodies("gpt-test")[0]["metadata"] == {"case": "c1"}


def test_a_scripted_call_to_a_tool_the_request_does_not_declare_is_a_server_error(
    chat: OpenAIChatStandIn,
) -> None:
    client = openai.OpenAI(base_url=chat.base_url, api_key=KEY, max_retries=0)
    chat.script("gpt-test", Answer(tool_calls=[Call("lookup")]))
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="gpt-test", messages=HI)
    assert "does not declare" in str(caught.value)


# -- Azure OpenAI ------------------------------------------------------------------------------


def test_the_azure_client_reads_a_completion_a_stream_and_tool_calls(
    azure: AzureOpenAIStandIn,
) -> None:
    client = openai.AzureOpenAI(
        azure_endpoint=azure.base_url, api_key=AZURE_KEY, api_version=API_VERSION, max_retries=0
    )
    azure.script("gpt-prod", "Hello from Azure", "Streamed from Azure")
    whole = client.chat.completions.create(model="gpt-prod", messages=HI)
    assert whole.choices[0].message.content == "Hello from Azure"
    [seen] = azure.accepted()
    assert seen.path == "/openai/deployments/gpt-prod/chat/completions"
    assert seen.query == {"api-version": API_VERSION} and seen.headers["api-key"] == AZURE_KEY

    stream = client.chat.completions.create(model="gpt-prod", messages=HI, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == (
        "Streamed from Azure"
    )

    entra = openai.AzureOpenAI(
        azure_endpoint=azure.base_url,
        azure_ad_token=AD_TOKEN,
        api_version=API_VERSION,
        max_retries=0,
    )
    azure.script("gpt-prod", Answer(tool_calls=[Call("lookup", {"city": "Bergen"})]))
    called = entra.chat.completions.create(model="gpt-prod", messages=HI, tools=[LOOKUP])
    [call] = called.choices[0].message.tool_calls or []
    assert call.function.name == "lookup"
    assert azure.received()[-1].headers["Authorization"] == f"Bearer {AD_TOKEN}"


def test_azure_refuses_wrong_paths_versions_keys_fields_and_types_as_azure_does(
    azure: AzureOpenAIStandIn,
) -> None:
    url = azure.base_url + "/openai/deployments/gpt-prod/chat/completions"
    body = {"messages": HI}
    headers = {"api-key": AZURE_KEY}
    not_found = {"error": {"code": "404", "message": "Resource not found"}}

    def post(target: str, sent: Any = body, **params: str) -> httpx.Response:
        return httpx.post(target, json=sent, headers=headers, params=params)

    assert post(url).status_code == 404 and post(url).json() == not_found  # no api-version
    assert post(url, **{"api-version": "latest"}).json() == not_found
    wrong_path = azure.base_url + "/openai/deployments/gpt-prod/completions"
    assert post(wrong_path, **{"api-version": API_VERSION}).json() == not_found
    missing = post(url.replace("gpt-prod", "gpt-gone"), **{"api-version": API_VERSION})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "DeploymentNotFound"

    unknown = post(url, {**body, "metadata_mode": "x"}, **{"api-version": API_VERSION})
    assert unknown.status_code == 400
    assert (
        unknown.json()["error"]["message"]
        == "Unrecognized request argument supplied: metadata_mode"
    )
    wrong = post(url, {**body, "temperature": "low"}, **{"api-version": API_VERSION})
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "invalid_type"

    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    older = post(url, streamed, **{"api-version": "2024-06-01"})
    assert older.status_code == 400
    assert older.json()["error"]["message"] == (
        "Unrecognized request argument supplied: stream_options"
    )

    client = openai.AzureOpenAI(
        azure_endpoint=azure.base_url, api_key="wrong", api_version=API_VERSION, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="gpt-prod", messages=HI)
    assert azure.accepted() == []


# -- Anthropic Messages ----------------------------------------------------------------------


def test_the_anthropic_client_reads_a_message_a_stream_and_tool_use(
    messages: AnthropicMessagesStandIn,
) -> None:
    client = anthropic.Anthropic(base_url=messages.base_url, api_key=KEY, max_retries=0)
    messages.script("claude-test", "Hello from Claude", "Streamed from Claude")
    whole = client.messages.create(
        model="claude-test",
        max_tokens=64,
        system="Be brief.",
        messages=HI,
        extra_body={"temperature": 0},
    )
    assert [b.type for b in whole.content] == ["text"] and whole.stop_reason == "end_turn"
    assert whole.usage.output_tokens == 3 and whole.usage.input_tokens == 4
    [seen] = messages.accepted()
    # The client sends the key as a bearer token, which the API takes as it takes x-api-key.
    assert seen.headers["Authorization"] == f"Bearer {KEY}"
    assert seen.headers["anthropic-version"] == anthropic._constants.ANTHROPIC_API_VERSION

    with client.messages.stream(model="claude-test", max_tokens=64, messages=HI) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == "Streamed from Claude"

    tools: Any = [{"name": "lookup", "input_schema": {"type": "object", "properties": {}}}]
    messages.script("claude-test", Answer("Let me check.", [Call("lookup", {"city": "Oslo"})]))
    with client.messages.stream(
        model="claude-test", max_tokens=64, messages=HI, tools=tools
    ) as stream:
        used = stream.get_final_message()
    text, tool_use = used.content
    assert text.type == "text" and tool_use.type == "tool_use"
    assert tool_use.input == {"city": "Oslo"} and used.stop_reason == "tool_use"

    messages.script("claude-test", "Sunny in Oslo")
    answered = client.messages.create(
        model="claude-test",
        max_tokens=64,
        tools=tools,
        messages=[
            *HI,
            {"role": "assistant", "content": [b.model_dump() for b in used.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "sun"}],
            },
        ],
    )
    assert answered.content[0].type == "text" and answered.content[0].text == "Sunny in Oslo"


def anthropic_refusal(client: anthropic.Anthropic, **fields: Any) -> dict[str, Any]:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            **{"model": "claude-test", "max_tokens": 64, "messages": HI, **fields}
        )
    body = caught.value.body
    assert isinstance(body, dict)
    return body


def test_anthropic_refuses_an_unknown_field_and_a_wrong_type_as_the_api_does(
    messages: AnthropicMessagesStandIn,
) -> None:
    client = anthropic.Anthropic(base_url=messages.base_url, api_key=KEY, max_retries=0)
    unknown = anthropic_refusal(client, extra_body={"seed": 7})
    assert unknown == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "seed: Extra inputs are not permitted",
        },
        "request_id": "req_standin",
    }
    wrong = anthropic_refusal(client, extra_body={"max_tokens": "64"})
    assert wrong["error"]["message"] == "max_tokens: Input should be a valid integer"
    system = anthropic_refusal(client, messages=[{"role": "system", "content": "x"}, *HI])
    assert system["error"]["message"] == "messages.0.role: Input should be 'user' or 'assistant'"
    metadata = anthropic_refusal(client, metadata={"case": "c1"})  # type: ignore[typeddict-unknown-key]
    assert metadata["error"]["message"] == "metadata.case: Extra inputs are not permitted"
    hot = anthropic_refusal(client, extra_body={"temperature": 1.5})
    assert hot["error"]["message"] == "temperature: Input should be less than or equal to 1"
    alone = anthropic_refusal(client, tool_choice={"type": "auto"})
    assert alone["error"]["message"].startswith("tool_choice: tool_choice may only be specified")

    no_version = httpx.post(
        messages.base_url + "/v1/messages",
        json={"model": "claude-test", "max_tokens": 64, "messages": HI},
        headers={"x-api-key": KEY},
    )
    assert no_version.status_code == 400
    assert no_version.json()["error"] == {
        "type": "invalid_request_error",
        "message": "anthropic-version: header is required",
    }
    no_max = httpx.post(
        messages.base_url + "/v1/messages",
        json={"model": "claude-test", "messages": HI},
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
    )
    assert no_max.json()["error"]["message"] == "max_tokens: Field required"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=messages.base_url, api_key="x", max_retries=0).messages.create(
            model="claude-test", max_tokens=64, messages=HI
        )
    assert messages.accepted() == []
