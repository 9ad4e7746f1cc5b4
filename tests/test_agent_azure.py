"""The azure protocol against the strict Azure OpenAI stand-in (tests/standins/): the
deployment URL with its api-version, the `api-key` header or an Entra ID bearer token,
an `openai` entry with a deployment and an api_version being the same, no metadata by
default, streamed replies and tool calls; and agenttest.yaml's errors for what an azure
entry lacks, each with its file, line and field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_servers import run
from standins.azure_openai import AzureOpenAIStandIn
from standins.scripting import Answer, Call

from agenttest_submit.cli import main
from agenttest_worker.agents.config import AgentConfig
from agenttest_worker.agents.config_loading import load_config
from agenttest_worker.agents.interface import AgentError, AgentRequest
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.agents.protocols.azure import AzureOpenAIClient
from agenttest_worker.errors import ConfigError

KEY_ENV = "AGENTTEST_TEST_AZURE_KEY"
TOKEN_ENV = "AGENTTEST_TEST_AZURE_TOKEN"
KEY = "azure-key-6d0c2f"
TOKEN = "entra-token-a81e"
VERSION = "2024-10-21"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def azure(monkeypatch: pytest.MonkeyPatch) -> Iterator[AzureOpenAIStandIn]:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with AzureOpenAIStandIn(["gpt-4o-prod"], api_key=KEY, ad_token=TOKEN) as running:
        yield running


def entry(azure: AzureOpenAIStandIn, **fields: Any) -> dict[str, Any]:
    return {
        "protocol": "azure",
        "base_url": azure.base_url,
        "deployment": "gpt-4o-prod",
        "api_version": VERSION,
        "api_key_env": KEY_ENV,
        "max_retries": 0,
        **fields,
    }


def call(config: dict[str, Any], request: AgentRequest | None = None) -> Any:
    client = AzureOpenAIClient("gpt", AgentConfig.model_validate(config))
    return run(client.complete(request or AgentRequest("target", HI)))


def test_a_call_goes_to_the_deployment_with_the_api_version_and_the_api_key(
    azure: AzureOpenAIStandIn,
) -> None:
    azure.script("gpt-4o-prod", "Hello from Azure")
    request = AgentRequest("target", HI, metadata={"case": "c1"}, options={"mode": "x"})
    reply = call(entry(azure, params={"temperature": 0, "seed": 7}), request)
    assert reply.content == "Hello from Azure" and reply.usage.completion_tokens == 3
    [seen] = azure.accepted()
    assert seen.path == "/openai/deployments/gpt-4o-prod/chat/completions"
    assert seen.query == {"api-version": VERSION}
    assert seen.headers["api-key"] == KEY and "Authorization" not in seen.headers
    # No metadata, no options by default: Azure refuses both without store: true.
    assert seen.json == {
        "model": "gpt-4o-prod",
        "messages": HI,
        "temperature": 0,
        "seed": 7,
    }


def test_an_entra_id_token_goes_as_a_bearer_token(azure: AzureOpenAIStandIn) -> None:
    azure.script("gpt-4o-prod", "Hi with a token")
    fields = entry(azure, azure_ad_token_env=TOKEN_ENV)
    del fields["api_key_env"]
    assert call(fields).content == "Hi with a token"
    [seen] = azure.accepted()
    assert seen.headers["Authorization"] == f"Bearer {TOKEN}" and "api-key" not in seen.headers


def test_an_openai_entry_with_a_deployment_and_an_api_version_is_an_azure_one(
    azure: AzureOpenAIStandIn, tmp_path: Path
) -> None:
    path = tmp_path / "agenttest.yaml"
    path.write_text(
        f"agents:\n  gpt:\n    protocol: openai\n    base_url: {azure.base_url}\n"
        f"    deployment: gpt-4o-prod\n    api_version: '{VERSION}'\n"
        f"    api_key_env: {KEY_ENV}\n    stream: true\n    tools: [lookup]\n",
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.agents["gpt"].protocol == "azure"
    assert config.agents["gpt"].metadata_mode() == "none"
    azure.script("gpt-4o-prod", Answer("Checking.", [Call("lookup", {"city": "Oslo"})]))
    client = AgentPool(config).client("agents:gpt")
    assert isinstance(client, AzureOpenAIClient)
    reply = run(client.complete(AgentRequest("target", HI)))
    assert reply.content == "Checking." and reply.finish_reason == "tool_calls"
    assert [(c.name, c.args) for c in reply.tool_calls] == [("lookup", {"city": "Oslo"})]
    [body] = azure.bodies()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert reply.usage is not None and reply.usage.total_tokens > 0


def test_azure_refusals_are_errors_that_never_show_the_key(azure: AzureOpenAIStandIn) -> None:
    with pytest.raises(AgentError) as caught:
        call(entry(azure, params={"logprobs": "yes"}))
    assert "HTTP 400" in caught.value.message and "Invalid type for 'logprobs'" in (
        caught.value.raw or ""
    )
    with pytest.raises(AgentError) as missing:
        call(entry(azure, deployment="gpt-gone"))
    assert "HTTP 404" in missing.value.message
    assert KEY not in missing.value.message and KEY not in (missing.value.raw or "")


def config_problems(
    text: str, tmp_path: Path
) -> list[tuple[str | None, int | None, str | None, str]]:
    path = tmp_path / "agenttest.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    return [(p.file, p.line, p.field, p.message) for p in caught.value.problems]


def test_what_an_azure_entry_lacks_is_named_with_file_line_and_field(tmp_path: Path) -> None:
    file = str(tmp_path / "agenttest.yaml")
    assert config_problems(
        "agents:\n  gpt:\n    protocol: azure\n    base_url: https://r.openai.azure.com\n",
        tmp_path,
    ) == [
        (
            file,
            2,
            "agents.gpt.deployment",
            "required field is missing: azure agents need deployment",
        ),
        (
            file,
            2,
            "agents.gpt.api_version",
            "required field is missing: azure agents need api_version",
        ),
    ]
    assert config_problems(
        "agents:\n  gpt:\n    protocol: azure\n    deployment: d\n    api_version: '2024-10-21'\n",
        tmp_path,
    ) == [
        (
            file,
            2,
            "agents.gpt",
            "an azure agent needs base_url, the resource's endpoint (https://NAME.openai.azure.com)",
        )
    ]
    assert config_problems(
        "agents:\n  gpt:\n    base_url: https://r.openai.azure.com\n    deployment: d\n",
        tmp_path,
    ) == [
        (
            file,
            2,
            "agents.gpt",
            "an openai agent on Azure OpenAI sets both deployment and api_version "
            "(or write protocol: azure)",
        )
    ]


def test_a_bad_azure_entry_stops_the_run_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "agenttest.yaml").write_text(
        "agents:\n  gpt:\n    protocol: azure\n    base_url: https://r.openai.azure.com\n"
        "    deployment: gpt-4o-prod\n",
        encoding="utf-8",
    )
    (tmp_path / "c.jsonl").write_text('{"id": "c", "input": "x"}\n', encoding="utf-8")
    assert main(["-i", "c.jsonl", "-n", "gpt"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "agenttest-submit: 1 input problem; nothing was run:\n"
        f"  {tmp_path / 'agenttest.yaml'}:2: agents.gpt.api_version: required field is "
        "missing: azure agents need api_version\n"
    )


def test_an_api_version_before_stream_options_streams_without_them(
    azure: AzureOpenAIStandIn,
) -> None:
    azure.script("gpt-4o-prod", "Streamed on an older version")
    reply = call(entry(azure, api_version="2024-06-01", stream=True))
    assert reply.content == "Streamed on an older version"
    assert reply.usage is None  # what such a version's stream gives
    [body] = azure.bodies()
    assert body["stream"] is True and "stream_options" not in body
    assert azure.refusals() == []


def test_neither_the_key_nor_the_token_is_kept_anywhere_a_run_writes(
    azure: AzureOpenAIStandIn,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    fields = entry(azure, azure_ad_token_env=TOKEN_ENV)
    del fields["api_key_env"]
    judge = entry(azure)  # with the key
    (tmp_path / "agenttest.yaml").write_text(
        json.dumps({"agents": {"gpt": fields, "judge": judge}, "defaults": {"judge": "judge"}}),
        encoding="utf-8",
    )
    azure.script("gpt-4o-prod", "Hello!", '{"passed": false, "reason": "too short"}')
    case = {"id": "c", "input": "Hi", "assertions": [{"type": "agent"}]}
    (tmp_path / "c.jsonl").write_text(json.dumps(case) + "\n", encoding="utf-8")
    assert main(["-i", "c.jsonl", "-n", "gpt", "-o", "out.jsonl", "-v"]) == 1
    printed = "".join(capsys.readouterr())
    written = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    for secret in (KEY, TOKEN):
        assert secret not in printed
        assert all(secret.encode() not in data for data in written)
    assert [r.headers.get("Authorization") for r in azure.accepted()] == [f"Bearer {TOKEN}", None]
