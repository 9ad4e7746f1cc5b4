"""Every hosted-API protocol in every role, streamed and not, in real agenttest runs
against the strict stand-ins (tests/standins/), with the entries' default settings.

Each run's target (with a tool), judge, simulator, generator and reporter are agents
of one protocol: openai (Chat Completions), azure (Azure OpenAI) or anthropic
(Messages). The generator writes the cases: one where the target calls two tools at
once, is given the mocked results and answers, judged over the conversation by an
`agent` assertion with its own params; one continued by the simulator, with its own
params. The reporter is sent the results after the run. A stand-in refuses what its
provider refuses, so a run that passes sent only what the real API takes; and every
body carries the entries' `params` (temperature 0 and seed 7; the Messages API has no
seed) and the params the assertion and the simulator add.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pki_kit import Pki
from standins.anthropic_messages import AnthropicMessagesStandIn
from standins.azure_openai import AzureOpenAIStandIn
from standins.openai_chat import OpenAIChatStandIn
from standins.scripting import Answer, Call, ScriptedStandIn

from agenttest_submit.cli import main
from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.agents.pool import AgentPool

KEY_ENV = "AGENTTEST_TEST_PROVIDER_KEY"
KEY = "sk-matrix-0b7d41"
ROLES = {
    "target": "m-target",
    "judge": "m-judge",
    "simulator": "m-sim",
    "generator": "m-gen",
    "reporter": "m-report",
}
PARAMS = {
    "openai": {"temperature": 0, "seed": 7},
    "azure": {"temperature": 0, "seed": 7},
    "anthropic": {"temperature": 0},
}
JSON_MODE = {"type": "json_object"}
LOOKUP = {
    "name": "lookup",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CASES = [
    {
        "id": "weather",
        "input": "What is the weather in Oslo?",
        "tool_mocks": {"lookup": {"sky": "sunny"}},
        "assertions": [
            {"type": "tool_called", "name": "lookup", "args": {"city": "Oslo"}},
            {"type": "contains", "value": "sunny"},
            {
                "type": "agent",
                "conversation": True,
                "options": {
                    "metadata": {"criteria": "Says the weather"},
                    "params": {"top_p": 0.25},
                },
            },
        ],
    },
    {
        "id": "trip",
        "input": "Hello there",
        "simulator": {
            "metadata": {"goal": "Plan a trip", "max_turns": 2},
            "options": {"params": {"top_p": 0.5}},
        },
        "max_turns": 2,
        "final_assertions": [{"type": "contains", "value": "help"}],
    },
]


def given_tool_result(body: dict[str, Any]) -> bool:
    """Whether the request ends with a tool's result (Chat Completions or Messages)."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return True
    content = last["content"]
    return isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)


def target(body: dict[str, Any]) -> Answer:
    if given_tool_result(body):
        return Answer("It is sunny in Oslo today.")
    if "weather" in json.dumps(body["messages"]):
        # Two calls at once: both results must come back before the next request.
        return Answer(
            tool_calls=[Call("lookup", {"city": "Oslo"}), Call("lookup", {"city": "Bergen"})]
        )
    if "plan" in json.dumps(body["messages"]):
        return Answer("Happy to help with that.")
    # A question: the agent awaits input, which the simulator writes.
    return Answer("Hello! Where would you like to go?")


@contextmanager
def stand_in(protocol: str) -> Iterator[tuple[ScriptedStandIn, dict[str, dict[str, Any]]]]:
    """The protocol's stand-in, and agenttest.yaml's entry for each role's agent."""
    running: ScriptedStandIn
    if protocol == "openai":
        running = OpenAIChatStandIn(api_key=KEY)
    elif protocol == "azure":
        running = AzureOpenAIStandIn(list(ROLES.values()), api_key=KEY)
    else:
        running = AnthropicMessagesStandIn(api_key=KEY)
    with running:
        entries = {}
        for role, model in ROLES.items():
            entry: dict[str, Any] = {
                "protocol": protocol,
                "base_url": running.base_url,
                "api_key_env": KEY_ENV,
                "max_retries": 0,
                "timeout": 10,
            }
            if protocol == "azure":
                entry |= {"deployment": model, "api_version": "2024-10-21"}
            else:
                entry["model"] = model
            entries[role] = entry
        yield running, entries


def run_all_roles(
    protocol: str, stream: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[ScriptedStandIn, int, str, list[dict[str, Any]], dict[str, Any]]:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.chdir(tmp_path)
    with stand_in(protocol) as (running, entries):
        running.script(ROLES["target"], target)
        running.script(ROLES["judge"], lambda body: '{"passed": true, "score": 1, "reason": "ok"}')
        running.script(
            ROLES["simulator"],
            lambda body: '{"input": "Can you help me plan?", "goal_achieved": false}',
        )
        running.script(ROLES["generator"], lambda body: json.dumps({"cases": CASES}))
        running.script(ROLES["reporter"], lambda body: "Both cases passed.")
        agents = {
            role: {**entry, "stream": stream, "params": PARAMS[protocol]}
            for role, entry in entries.items()
        }
        agents["target"]["tools"] = [LOOKUP]
        if protocol != "anthropic":
            # JSON mode, which the API allows only where the messages ask for JSON: the
            # role prompts do.
            for role in ("judge", "simulator", "generator"):
                agents[role]["params"] = {**PARAMS[protocol], "response_format": JSON_MODE}
        config = {"agents": agents, "defaults": {"judge": "judge", "simulator": "simulator"}}
        (tmp_path / "agenttest.yaml").write_text(json.dumps(config), encoding="utf-8")
        code = main(
            [
                *("-i", "agents:generator?count=2", "-n", "target", "-o", "out.jsonl"),
                *("--reporter", "agents:reporter"),
            ]
        )
        out = (tmp_path / "out.jsonl").read_text(encoding="utf-8")
        records = [json.loads(line) for line in out.splitlines()]
        return running, code, out, records, config


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("protocol", ["openai", "azure", "anthropic"])
def test_every_role_runs_against_the_strict_stand_in(
    protocol: str,
    stream: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    running, code, out, records, _ = run_all_roles(protocol, stream, tmp_path, monkeypatch)
    printed = capsys.readouterr()
    assert running.refusals() == [], [r.body for r in running.refusals()]
    assert code == 0, printed.out + printed.err
    assert {r["id"]: r["status"] for r in records} == {"weather": "passed", "trip": "passed"}
    weather = next(r for r in records if r["id"] == "weather")
    assert [c["role"] for c in weather["turns"][0]["calls"]].count("target") == 2
    trip = next(r for r in records if r["id"] == "trip")
    assert [t["input"] for t in trip["turns"]] == ["Hello there", "Can you help me plan?"]

    bodies = {role: running.bodies(model) for role, model in ROLES.items()}
    # target: a tool call, its result, the answer; then two turns of the trip.
    assert [len(bodies[r]) for r in ROLES] == [4, 1, 1, 1, 1]
    for role, sent in bodies.items():
        for body in sent:
            assert {k: body.get(k) for k in PARAMS[protocol]} == PARAMS[protocol] or (
                role == "judge"
            ), (role, body)
            assert body.get("stream", False) is stream, (role, body)
            assert "metadata" not in body and "options" not in body, (role, body)
    if protocol != "anthropic":
        for role in ("judge", "simulator", "generator"):
            assert bodies[role][0]["response_format"] == JSON_MODE
    [judged] = bodies["judge"]
    assert judged["top_p"] == 0.25 and judged["temperature"] == 0
    # The judge read the conversation, the tool call and its result written out in it.
    assert "[tool calls: lookup(" in json.dumps(judged["messages"])
    [simulated] = bodies["simulator"]
    assert simulated["top_p"] == 0.5
    assert all("top_p" not in body for body in bodies["target"] + bodies["generator"])
    assert "Both cases passed." in printed.out
    assert KEY not in out and KEY not in printed.out + printed.err


def test_a_field_the_messages_api_refuses_fails_the_turn_with_the_apis_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`seed` is a Chat Completions parameter: the Messages API refuses it, and so does
    its stand-in; the turn says what the API said."""
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.chdir(tmp_path)
    with stand_in("anthropic") as (running, entries):
        entry = {**entries["target"], "params": {"temperature": 0, "seed": 7}}
        (tmp_path / "agenttest.yaml").write_text(
            json.dumps({"agents": {"claude": entry}}), encoding="utf-8"
        )
        (tmp_path / "c.jsonl").write_text('{"id": "c", "input": "Hi"}\n', encoding="utf-8")
        code = main(["-i", "c.jsonl", "-n", "claude", "-o", "out.jsonl"])
        [refusal] = running.refusals()
    assert code == 1
    [record] = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    [turn] = record["turns"]
    assert "HTTP 400" in turn["error"]
    assert "invalid_request_error: seed: Extra inputs are not permitted" in turn["error"]
    assert refusal.body["error"]["message"] == "seed: Extra inputs are not permitted"


def test_metadata_strings_is_what_the_chat_completions_api_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`metadata: strings` sends the case's metadata, and its options, the way OpenAI
    takes them: string values, with `store: true`, and no field of its own."""
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.chdir(tmp_path)
    with stand_in("openai") as (running, entries):
        running.script(ROLES["target"], "Noted.")
        entry = {**entries["target"], "metadata": "strings"}
        (tmp_path / "agenttest.yaml").write_text(
            json.dumps({"agents": {"gpt": entry}}), encoding="utf-8"
        )
        case = {"id": "c", "input": "Hi", "options": {"mode": "fast", "metadata": {"tier": 2}}}
        (tmp_path / "c.jsonl").write_text(json.dumps(case) + "\n", encoding="utf-8")
        code = main(["-i", "c.jsonl", "-n", "gpt", "-o", "out.jsonl"])
        assert running.refusals() == [], [r.body for r in running.refusals()]
        [body] = running.bodies(ROLES["target"])
    assert code == 0
    assert body["store"] is True and "options" not in body
    assert body["metadata"] == {"options": '{"mode": "fast"}', "tier": "2"}


def test_every_entry_in_connecting_to_providers_loads_as_written(tmp_path: Path) -> None:
    """docs/providers.md's entries are meant to be copied: each is a valid agenttest.yaml,
    and each calls its provider at the URL the page says."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "providers.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", guide, re.DOTALL)
    # The company agent's files, where its entry names them (relative to the file).
    pki = Pki.make(tmp_path / "pki")
    (tmp_path / "certs").mkdir()
    for made, named in (
        (pki.ca, "corp-ca.pem"),
        (pki.client_cert, "agenttest.pem"),
        (pki.client_key, "agenttest-key.pem"),
    ):
        shutil.copy(made, tmp_path / "certs" / named)
    urls = {}
    for n, block in enumerate(blocks):
        path = tmp_path / f"agenttest-{n}.yaml"
        path.write_text(block, encoding="utf-8")
        config = load_config(path, env={"SUPPORT_BOT_TOKEN": "t0ken"})
        [(name, entry)] = config.agents.items()
        hosted = entry.protocol != "http"
        assert entry.metadata_mode() == ("none" if hosted else "object")
        urls[name] = AgentPool(config).client(f"agents:{name}").url  # type: ignore[attr-defined]
    assert urls == {
        "support.bot": "https://support-bot.corp.example/api/chat",
        "gpt": "https://api.openai.com/v1/chat/completions",
        "gpt-azure": "https://my-resource.openai.azure.com/openai/deployments/gpt-4o-prod/"
        "chat/completions?api-version=2024-10-21",
        "claude": "https://api.anthropic.com/v1/messages",
        "local": "http://127.0.0.1:8000/v1/chat/completions",
    }


def test_yaml_criteria_call_their_judge_with_judge_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`judge_params` next to `criteria` go over the judge entry's params, a round's over
    its test's; a `judge_params` with no criteria to judge is an input error."""
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.chdir(tmp_path)
    with stand_in("openai") as (running, entries):
        running.script(ROLES["target"], lambda body: "Hello Alice, nice to meet you.")
        running.script(ROLES["judge"], lambda body: '{"passed": true, "reason": "ok"}')
        agents = {
            "bot": entries["target"],
            "judge": {**entries["judge"], "params": {"temperature": 0.5, "seed": 7}},
        }
        config = {"agents": agents, "defaults": {"judge": "judge"}}
        (tmp_path / "agenttest.yaml").write_text(json.dumps(config), encoding="utf-8")
        (tmp_path / "memory.yaml").write_text(
            "tests:\n"
            "  - name: memory\n"
            "    judge_params: {temperature: 0, top_p: 0.5}\n"
            "    rounds:\n"
            "      - user_input: My name is Alice\n"
            "        criteria: Greets Alice\n"
            "      - user_input: What is my name?\n"
            "        criteria: Says Alice\n"
            "        judge_params: {top_p: 0.9}\n",
            encoding="utf-8",
        )
        code = main(["-i", "memory.yaml", "-n", "bot", "-o", "out.jsonl"])
        assert running.refusals() == []
        first, second = running.bodies(ROLES["judge"])
    assert code == 0, capsys.readouterr().err
    assert (first["temperature"], first["seed"], first["top_p"]) == (0, 7, 0.5)
    assert (second["temperature"], second["seed"], second["top_p"]) == (0, 7, 0.9)

    (tmp_path / "loose.yaml").write_text(
        "tests:\n  - name: loose\n    user_input: Hi\n    judge_params: {temperature: 0}\n",
        encoding="utf-8",
    )
    capsys.readouterr()
    assert main(["-i", "loose.yaml", "-n", "bot", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "loose.yaml:4 (test 'loose'): judge_params: `judge_params` says how `criteria`" in err


@pytest.mark.parametrize(
    ("protocol", "settings"),
    [
        ("openai", {"tool_choice": "auto", "parallel_tool_calls": False}),
        ("anthropic", {"tool_choice": {"type": "auto"}}),
    ],
)
def test_an_entry_with_tool_settings_can_judge_too(
    protocol: str,
    settings: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Tools go to the target alone; the settings that only go with tools stay out of the
    same entry's judge calls, which the APIs would refuse."""
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.chdir(tmp_path)
    with stand_in(protocol) as (running, entries):
        running.script(ROLES["target"], "Hello there.", '{"passed": true, "reason": "it greets"}')
        entry = {**entries["target"], "tools": [LOOKUP], "params": settings}
        config = {"agents": {"bot": entry}, "defaults": {"judge": "bot"}}
        (tmp_path / "agenttest.yaml").write_text(json.dumps(config), encoding="utf-8")
        case = {"id": "c", "input": "Hi", "assertions": [{"type": "agent"}]}
        (tmp_path / "c.jsonl").write_text(json.dumps(case) + "\n", encoding="utf-8")
        code = main(["-i", "c.jsonl", "-n", "bot", "-o", "out.jsonl"])
        assert running.refusals() == [], [r.body for r in running.refusals()]
        as_target, as_judge = running.bodies(ROLES["target"])
    assert code == 0, capsys.readouterr().err
    assert {k: as_target[k] for k in settings} == settings and "tools" in as_target
    assert not set(settings) & set(as_judge) and "tools" not in as_judge


def test_a_blank_reply_is_left_out_of_the_next_messages_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Messages API refuses a text block of whitespace alone: a reply that was only
    whitespace is not sent back in the conversation."""
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.chdir(tmp_path)
    with stand_in("anthropic") as (running, entries):
        running.script(ROLES["target"], " \n ", "Hello again.")
        (tmp_path / "agenttest.yaml").write_text(
            json.dumps({"agents": {"claude": entries["target"]}}), encoding="utf-8"
        )
        case = {"id": "c", "turns": [{"input": "Hi"}, {"input": "Are you there?"}]}
        (tmp_path / "c.jsonl").write_text(json.dumps(case) + "\n", encoding="utf-8")
        code = main(["-i", "c.jsonl", "-n", "claude", "-o", "out.jsonl"])
        assert running.refusals() == [], [r.body for r in running.refusals()]
        _, second = running.bodies(ROLES["target"])
    assert code == 0, capsys.readouterr().err
    assert second["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "Are you there?"}],
        }
    ]


@pytest.mark.parametrize("protocol", ["openai", "azure"])
def test_a_reply_without_content_goes_back_as_empty_text(
    protocol: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Chat Completions refuses an assistant message whose content is null unless it
    calls tools: a reply that came without content is sent back as ""."""
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.chdir(tmp_path)
    with stand_in(protocol) as (running, entries):
        running.script(ROLES["target"], Answer(None), "Here now.")
        (tmp_path / "agenttest.yaml").write_text(
            json.dumps({"agents": {"gpt": entries["target"]}}), encoding="utf-8"
        )
        case = {"id": "c", "turns": [{"input": "Hi"}, {"input": "Are you there?"}]}
        (tmp_path / "c.jsonl").write_text(json.dumps(case) + "\n", encoding="utf-8")
        code = main(["-i", "c.jsonl", "-n", "gpt", "-o", "out.jsonl"])
        assert running.refusals() == [], [r.body for r in running.refusals()]
        _, second = running.bodies(ROLES["target"])
    assert code == 0, capsys.readouterr().err
    assert second["messages"][1] == {"role": "assistant", "content": ""}
