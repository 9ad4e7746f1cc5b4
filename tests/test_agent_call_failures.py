"""An agent call that cannot be made fails its turn with the reason, at once.

Credentials in an agent's URL and an Authorization header of its own make every call
refused by aiohttp before it is sent: such an entry is refused when agenttest.yaml is
loaded (exit 2, the agent's file, line and field). Any other unexpected exception a
client raises (here from a protocol registered for the test, whose client raises what
a library refusing a request raises) fails the turn with its reason, and the run ends:
nothing waits for the stall sweep.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agenttest_submit.cli.main import main
from agenttest_worker.agents import AgentConfig, AgentReply, AgentRequest, ProjectConfig, protocol
from agenttest_worker.agents.interface import unregister_protocol

REFUSAL = "Cannot combine AUTHORIZATION header with AUTH argument or credentials encoded in URL"


def _write(folder: Path, agents: dict[str, dict[str, object]]) -> Path:
    """agenttest.yaml with one line per field, so that each agent has a line of its own."""
    path = folder / "agenttest.yaml"
    lines = ["agents:"]
    for name, entry in agents.items():
        lines.append(f"  {name}:")
        lines += [f"    {key}: {json.dumps(value)}" for key, value in entry.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "entry",
    [
        {
            "protocol": "openai",
            "base_url": "http://bob:pw@127.0.0.1:9/v1",
            "headers": {"authorization": "Bearer x"},
        },
        {"protocol": "http", "url": "http://bob:pw@127.0.0.1:9/chat", "api_key_env": "K"},
    ],
)
def test_credentials_in_the_url_and_an_authorization_header_are_refused_at_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: dict[str, object]
) -> None:
    config = _write(
        tmp_path, {"ok": {"protocol": "openai", "base_url": "http://h/v1"}, "both": entry}
    )
    code = main(["-i", "hello", "-n", "both", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{config}:5: agents.both: " in err  # where `both:` is written
    assert "its URL carries credentials (user:password@)" in err and "keep one of them" in err
    assert "Traceback" not in err


class RefusingClient:
    """A client that raises what aiohttp raises for such a request: not an AgentError."""

    def __init__(self, name: str, config: AgentConfig, project: ProjectConfig) -> None:
        self.calls = 0

    async def complete(self, request: AgentRequest) -> AgentReply:
        raise ValueError(REFUSAL)


@pytest.fixture
def refusing() -> Iterator[None]:
    protocol("refusing")(RefusingClient)
    try:
        yield
    finally:
        unregister_protocol("refusing")


def test_an_unexpected_exception_fails_the_turn_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], refusing: None
) -> None:
    config = _write(tmp_path, {"r": {"protocol": "refusing"}})
    cases = tmp_path / "cases.jsonl"
    two_turns = {"id": "C", "turns": [{"input": "one"}, {"input": "two"}]}
    cases.write_text(json.dumps(two_turns) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    started = time.monotonic()
    code = main(["-i", str(cases), "-n", "r", "--config", str(config), "-o", str(out)])
    assert time.monotonic() - started < 30  # ended, not left for the stall sweep
    capsys.readouterr()
    assert code == 1
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["status"] == "failed"
    first = record["turns"][0]
    assert first["error"] == f"calling r failed: ValueError: {REFUSAL}"
