"""The openai-responses protocol in real runs: `agenttest-submit` (embedded) against the
Responses API stand-in (tests/standins/openai_responses.py), which the official client
drives first in test_standin_responses.py and which refuses what the API refuses.

Targets whole and streamed, a tool call answered from the case's tool mocks, a
conversation continued with `previous_response_id`, a judge and a simulator on the
protocol, params and metadata in the body, and a 400 as the case's error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_servers import run
from standins.openai_responses import Answer, ResponsesStandIn, call_function, say

from agenttest_submit.cli import main
from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.config_loading import config_from_data
from agenttest_worker.agents.interface import AgentReply, AgentRequest
from agenttest_worker.agents.protocols.openai_responses import OpenAIResponsesClient
from agenttest_worker.errors import ConfigError

KEY_ENV = "AGENTTEST_TEST_RESPONSES_KEY"
KEY = "sk-responses-run-3f9a"
VERDICT = {"passed": True, "score": 0.9, "reason": "it asks which city"}


class Project:
    """agenttest.yaml with agents on the stand-in, and embedded runs of cases."""

    def __init__(
        self, tmp_path: Path, api: ResponsesStandIn, capsys: pytest.CaptureFixture[str]
    ) -> None:
        self.tmp_path, self.api, self.capsys = tmp_path, api, capsys
        self.output = ""

    def entry(self, model: str, **settings: Any) -> dict[str, Any]:
        return {
            "protocol": "openai-responses",
            "base_url": self.api.base_url,
            "model": model,
            "api_key_env": KEY_ENV,
            "timeout": 5,
            "max_retries": 0,
            **settings,
        }

    def run(
        self,
        cases: list[dict[str, Any]] | str,
        defaults: dict[str, Any] | None = None,
        **agents: dict[str, Any],
    ) -> dict[str, dict[str, Any]]:
        """Run `cases` (or the input `-i` names) against `bot` (its entry as given, else
        plain): the records by id."""
        entries = {"bot": self.entry("bot"), **agents}
        config = {"agents": entries, "defaults": defaults or {}}
        (self.tmp_path / "agenttest.yaml").write_text(json.dumps(config), encoding="utf-8")
        source = str(self.tmp_path / "cases.jsonl") if not isinstance(cases, str) else cases
        if not isinstance(cases, str):
            text = "".join(json.dumps(c) + "\n" for c in cases)
            (self.tmp_path / "cases.jsonl").write_text(text, encoding="utf-8")
        out = self.tmp_path / "out.jsonl"
        argv = ["--config", str(self.tmp_path / "agenttest.yaml"), "-i", source]
        self.capsys.readouterr()
        code = main([*argv, "-n", "bot", "-o", str(out)])
        stdout, stderr = self.capsys.readouterr()
        self.output = stdout + stderr
        assert code in (0, 1), f"exit {code}:\n{self.output}"
        return {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[ResponsesStandIn]:
    monkeypatch.setenv(KEY_ENV, KEY)
    with ResponsesStandIn(api_key=KEY) as running:
        yield running


@pytest.fixture
def project(
    api: ResponsesStandIn,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Project:
    monkeypatch.chdir(tmp_path)
    return Project(tmp_path, api, capsys)


def usage_of(response: dict[str, Any]) -> dict[str, int]:
    """A response's usage as the run records it."""
    usage = response["usage"]
    return {
        "prompt_tokens": usage["input_tokens"],
        "completion_tokens": usage["output_tokens"],
        "total_tokens": usage["total_tokens"],
    }


# -- the target ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_target_answers(project: Project, api: ResponsesStandIn, stream: bool) -> None:
    api.script("bot", [say("Hello, traveller. Tell me the city you fly to.")])
    case = {
        "id": "HELLO",
        "input": "Hello",
        "options": {"metadata": {"locale": "fr"}},
        "assertions": [{"type": "contains", "value": "the city"}],
    }
    record = project.run([case], bot=project.entry("bot", stream=stream))["HELLO"]
    assert record["status"] == "passed", record
    [turn] = record["turns"]
    assert turn["output"] == "Hello, traveller. Tell me the city you fly to."
    [received] = api.requests("bot")
    assert received.headers["Authorization"] == f"Bearer {KEY}"
    # The whole conversation as input items; no metadata (nor store) unless asked.
    expected: dict[str, Any] = {
        "model": "bot",
        "input": [{"role": "user", "content": "Hello"}],
    }
    if stream:
        expected["stream"] = True
    assert received.body == expected
    [call] = turn["calls"]
    [sent] = api.sent("bot")
    assert call["usage"] == usage_of(sent) == turn["usage"]
    assert call["stop_reason"] == "stop"
    if stream:
        assert received.headers["Accept"] == "text/event-stream"
        assert turn["first_token_ms"] is not None and call["first_token_ms"] is not None
    else:
        assert "first_token_ms" not in call


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_call_is_answered_from_the_tool_mocks(
    project: Project, api: ResponsesStandIn, stream: bool
) -> None:
    api.script("bot", [call_function("get_rate", currency="EUR"), say("The rate is 1.1.")])
    tools = [
        "get_rate",
        {"type": "function", "function": {"name": "convert", "description": "Convert"}},
    ]
    case = {
        "id": "TOOLS",
        "input": "EUR rate?",
        "tool_mocks": {"get_rate": {"rate": 1.1}},
        "assertions": [
            {"type": "tool_called", "name": "get_rate"},
            {"type": "contains", "value": "1.1"},
        ],
    }
    record = project.run([case], bot=project.entry("bot", tools=tools, stream=stream))["TOOLS"]
    assert record["status"] == "passed", record
    [turn] = record["turns"]
    [sent_call, _] = api.sent("bot")
    call_id = sent_call["output"][0]["call_id"]
    assert turn["tool_calls"] == [{"name": "get_rate", "args": {"currency": "EUR"}, "id": call_id}]
    assert turn["tool_results"] == {"get_rate": {"rate": 1.1}}
    first, second = api.bodies("bot")
    # Function tools with their fields at the top level, loose as in Chat Completions.
    assert first["tools"] == [
        {
            "type": "function",
            "name": "get_rate",
            "parameters": {"type": "object", "properties": {}},
            "strict": False,
        },
        {
            "type": "function",
            "name": "convert",
            "parameters": {"type": "object", "properties": {}},
            "strict": False,
            "description": "Convert",
        },
    ]
    # Stateless by default: the whole conversation again, the call and its output in it.
    assert "previous_response_id" not in second
    assert second["input"] == [
        {"role": "user", "content": "EUR rate?"},
        {
            "type": "function_call",
            "call_id": call_id,
            "name": "get_rate",
            "arguments": '{"currency": "EUR"}',
        },
        {"type": "function_call_output", "call_id": call_id, "output": '{"rate": 1.1}'},
    ]
    assert [c["usage"] for c in turn["calls"]] == [usage_of(r) for r in api.sent("bot")]


def test_previous_response_id_sends_only_what_is_new(
    project: Project, api: ResponsesStandIn
) -> None:
    api.script(
        "bot",
        [call_function("get_rate", currency="EUR"), say("The rate is 1.1."), say("USD: 0.9.")],
    )
    case = {
        "id": "CHAIN",
        "turns": [{"input": "EUR rate?"}, {"input": "And USD?"}],
        "tool_mocks": {"get_rate": {"rate": 1.1}},
    }
    bot = project.entry("bot", tools=["get_rate"], previous_response_id=True)
    record = project.run([case], bot=bot)["CHAIN"]
    assert record["status"] == "passed", record
    assert [t["output"] for t in record["turns"]] == ["The rate is 1.1.", "USD: 0.9."]
    first, second, third = api.bodies("bot")
    responses = api.sent("bot")
    assert "previous_response_id" not in first
    call_id = responses[0]["output"][0]["call_id"]
    assert second["previous_response_id"] == responses[0]["id"]
    assert second["input"] == [
        {"type": "function_call_output", "call_id": call_id, "output": '{"rate": 1.1}'}
    ]
    assert third["previous_response_id"] == responses[1]["id"]
    assert third["input"] == [{"role": "user", "content": "And USD?"}]
    # The stand-in put the conversation together from the stored responses.
    assert [i.get("type") for i in api.requests("bot")[2].context] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]


def test_attachments_travel_as_input_images_and_files(
    project: Project, api: ResponsesStandIn
) -> None:
    api.script("bot", [say("A receipt.")])
    png = "data:image/png;base64,iVBORw0KGgo="
    pdf = "data:application/pdf;base64,JVBERi0xLjQ="
    case = {
        "id": "FILES",
        "input": "What is this?",
        "attachments": [
            {"type": "image", "source": png},
            {"type": "image", "source": "https://example.test/r.jpg"},
            {"source": pdf, "name": "receipt.pdf"},
            {"source": "https://example.test/terms.pdf", "name": "terms.pdf"},
        ],
    }
    record = project.run([case])["FILES"]
    assert record["status"] == "passed", record
    [body] = api.bodies("bot")
    assert body["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": png, "detail": "auto"},
                {
                    "type": "input_image",
                    "image_url": "https://example.test/r.jpg",
                    "detail": "auto",
                },
                {"type": "input_file", "filename": "receipt.pdf", "file_data": pdf},
                {
                    "type": "input_file",
                    "filename": "terms.pdf",
                    "file_url": "https://example.test/terms.pdf",
                },
            ],
        }
    ]


def test_a_stream_that_breaks_off_fails_its_turn_keeping_what_came(
    project: Project, api: ResponsesStandIn
) -> None:
    # created, in_progress, output_item.added, content_part.added, then one delta.
    api.script("bot", [Answer(text="Partial answer, then nothing.", cut_after=5)])
    record = project.run([{"id": "CUT", "input": "Hi"}], bot=project.entry("bot", stream=True))
    [turn] = record["CUT"]["turns"]
    assert record["CUT"]["status"] == "failed"
    assert turn["output"] == "Part"
    assert turn["error"].startswith("agent error: bot's stream broke off")
    # Content had come: not tried again.
    assert len(api.requests("bot")) == 1


def test_a_conversation_the_client_did_not_continue_is_sent_whole(
    api: ResponsesStandIn,
) -> None:
    """The response ids are kept by the process that made the call: another client (a
    worker that did not play the turn before), or a history that is not the one the
    last response answered, sends the whole conversation, without an id."""
    api.script("bot", lambda received: say(f"Re: {received.last_user_text}"))
    config = AgentConfig.model_validate(
        {
            "protocol": "openai-responses",
            "base_url": api.base_url,
            "model": "bot",
            "api_key_env": KEY_ENV,
            "previous_response_id": True,
        }
    )
    first = OpenAIResponsesClient("bot", config)
    hello: list[dict[str, Any]] = [{"role": "user", "content": "Hello"}]

    def ask(client: OpenAIResponsesClient, messages: list[dict[str, Any]]) -> AgentReply:
        request = AgentRequest(role="target", messages=messages, session_id="s1")
        return run(client.complete(request))

    reply = ask(first, hello)
    more = [*hello, reply.assistant_message(), {"role": "user", "content": "More"}]
    ask(first, more)
    ask(OpenAIResponsesClient("bot", config), more)
    edited = [*hello, {"role": "assistant", "content": "Edited"}, more[-1]]
    ask(first, edited)
    chained, elsewhere, changed = api.bodies("bot")[1:]
    assert chained["input"] == [{"role": "user", "content": "More"}]
    assert chained["previous_response_id"] == api.sent("bot")[0]["id"]
    for whole in (elsewhere, changed):
        assert "previous_response_id" not in whole
        assert len(whole["input"]) == 3


def test_a_failed_response_is_the_turn_s_error(project: Project, api: ResponsesStandIn) -> None:
    api.script("bot", [Answer(failure="The model had an error.")])
    record = project.run([{"id": "FAIL", "input": "Hi"}], bot=project.entry("bot", stream=True))
    [turn] = record["FAIL"]["turns"]
    assert record["FAIL"]["status"] == "failed"
    assert turn["error"] == "agent error: bot: server_error: The model had an error."


# -- judges and simulators --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_judge_and_a_simulator_on_openai_responses(
    project: Project, api: ResponsesStandIn, stream: bool
) -> None:
    api.script("bot", [say("Which city?"), say("Booked for Oslo.")])
    api.script("judge", [say("```json\n" + json.dumps(VERDICT) + "\n```")])
    next_input = {"input": "Oslo", "goal_achieved": False, "reasoning": "it asked"}
    api.script("sim", [say(json.dumps(next_input))])
    case = {
        "id": "ROLES",
        "input": "Book a trip",
        "assertions": [
            {"type": "agent", "options": {"metadata": {"criteria": "asks for the city"}}}
        ],
        "simulator": {"metadata": {"goal": "book a trip", "max_turns": 2}},
    }
    record = project.run(
        [case],
        defaults={"judge": "judge", "simulator": "sim"},
        judge=project.entry("judge", stream=stream),
        sim=project.entry("sim", stream=stream),
    )["ROLES"]
    assert record["status"] == "passed", record
    assert [t["input"] for t in record["turns"]] == ["Book a trip", "Oslo"]
    verdict = record["turns"][0]["assertions"][0]
    assert verdict["passed"] is True and verdict["reason"] == "it asks which city"
    [judged] = api.bodies("judge")
    assert judged["instructions"].startswith("You are a strict evaluator")
    assert [i["role"] for i in judged["input"]] == ["user", "assistant"]
    [simulated] = api.bodies("sim")
    assert simulated["instructions"].startswith("You are simulating a user")
    # The simulator's default `messages: transcript`: the conversation as one user item.
    [transcript] = simulated["input"]
    assert transcript["role"] == "user"
    assert (
        "User: Book a trip" in transcript["content"]
        and "Agent: Which city?" in transcript["content"]
    )
    roles = [c["role"] for t in record["turns"] for c in t["calls"]]
    assert roles == ["target", "validator", "simulator", "target"]
    by_role = record["usage_by_role"]
    assert by_role["judge"]["total_tokens"] == api.sent("judge")[0]["usage"]["total_tokens"]


def test_a_generator_on_openai_responses_writes_the_cases(
    project: Project, api: ResponsesStandIn
) -> None:
    generated = {"cases": [{"id": "G1", "input": "Hello", "assertions": []}]}
    api.script("gen", [say(json.dumps(generated))])
    api.script("bot", [say("Hello to you.")])
    records = project.run("agents:gen?count=1", gen=project.entry("gen"))
    assert records["G1"]["status"] == "passed", records["G1"]
    assert records["G1"]["turns"][0]["output"] == "Hello to you."
    [body] = api.bodies("gen")
    assert body["instructions"].startswith("You are a test case generator")
    assert body["input"] == [{"role": "user", "content": "Generate the test cases now."}]


# -- what goes into the body ---------------------------------------------------------------------


def test_params_reach_the_body_and_a_refusal_fails_its_case(
    project: Project, api: ResponsesStandIn
) -> None:
    api.script("bot", lambda received: say(f"Reply to {received.last_user_text}."))
    cases = [
        {"id": "OK", "input": "first", "options": {"params": {"max_output_tokens": 64}}},
        # `seed` is a Chat Completions parameter: the Responses API refuses it.
        {"id": "SEED", "input": "second", "options": {"params": {"seed": 7}}},
    ]
    bot = project.entry("bot", params={"temperature": 0, "top_p": 1})
    records = project.run(cases, bot=bot)
    assert records["OK"]["status"] == "passed", records["OK"]
    assert records["OK"]["turns"][0]["output"] == "Reply to first."
    by_input = {body["input"][0]["content"]: body for body in api.bodies("bot")}
    assert by_input["first"]["temperature"] == 0 and by_input["first"]["top_p"] == 1
    assert by_input["first"]["max_output_tokens"] == 64
    assert by_input["second"]["seed"] == 7 and by_input["second"]["temperature"] == 0
    seed = records["SEED"]
    assert seed["status"] == "failed"
    message = "agent error: HTTP 400 from bot: invalid_request_error: Unknown parameter: 'seed'."
    assert seed["error"] == f"turn 1: {message}"
    assert seed["turns"][0]["error"] == message
    assert seed["turns"][0]["calls"][0]["status_code"] == 400
    assert message in project.output
    assert KEY not in project.output


def test_metadata_is_sent_only_when_the_entry_asks(project: Project, api: ResponsesStandIn) -> None:
    api.script("bot", lambda received: say("ok"))
    case = {"id": "META", "input": "Hi", "options": {"metadata": {"locale": "fr", "n": 3}}}
    project.run([case])
    project.run([case], bot=project.entry("bot", metadata="strings"))
    project.run([case], bot=project.entry("bot", metadata="strings", params={"store": False}))
    plain, strings, unstored = api.bodies("bot")
    assert not {"metadata", "store"} & plain.keys()
    assert strings["metadata"] == {"locale": "fr", "n": "3"} and strings["store"] is True
    assert unstored["metadata"] == {"locale": "fr", "n": "3"} and unstored["store"] is False


def test_an_answer_cut_at_max_output_tokens_finishes_with_length(
    project: Project, api: ResponsesStandIn
) -> None:
    words = " ".join(f"w{i}" for i in range(40))
    api.script("bot", [Answer(text=words, incomplete="max_output_tokens")])
    case = {"id": "CUT", "input": "Talk", "options": {"params": {"max_output_tokens": 16}}}
    record = project.run([case])["CUT"]
    [turn] = record["turns"]
    assert turn["output"] == " ".join(f"w{i}" for i in range(16))
    assert turn["calls"][0]["stop_reason"] == "length"


# -- the entry --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({}, "an openai-responses agent needs base_url"),
        ({"base_url": "http://127.0.0.1:9/v1", "params": {"input": "x"}}, "input cannot be"),
        (
            {
                "base_url": "http://127.0.0.1:9/v1",
                "previous_response_id": True,
                "params": {"store": False},
            },
            "previous_response_id: true needs stored responses",
        ),
    ],
)
def test_an_entry_lacking_what_the_protocol_needs_is_refused(
    settings: dict[str, Any], problem: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_data({"agents": {"r": {"protocol": "openai-responses", **settings}}}, "x")
    assert problem in str(caught.value)


def test_previous_response_id_is_for_openai_responses_agents() -> None:
    with pytest.raises(ValueError, match="previous_response_id is for openai-responses"):
        AgentConfig.model_validate(
            {"protocol": "openai", "base_url": "http://x:1/v1", "previous_response_id": True}
        )
