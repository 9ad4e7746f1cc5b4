"""The `script` protocol: an agent implemented by a Python function in the scripts folder.

`respond(messages, metadata)` returns the reply text, or a dict with `content` and
optionally `tool_calls`, `awaiting_input`, `input_hint` and `state` (read as an http
agent's reply with the default mapping). Finding and loading the function is
agents/script_loader.py's part, shared with script simulators, judges and generators.
"""

from __future__ import annotations

import time

from agenttest_worker.agents.config import AgentConfig, ProjectConfig
from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest, protocol
from agenttest_worker.agents.protocols.http import parse_http_reply
from agenttest_worker.agents.reply_mappings import ResponseMapping
from agenttest_worker.agents.script_loader import ScriptError, call_script, load_script
from agenttest_worker.json_values import nested_deeper_than, too_deep_message
from agenttest_worker.results import AgentCallRecord


def needs_use(config: AgentConfig) -> str | None:
    if config.tls is not None or config.proxy is not None:
        return "tls and proxy are for agents called over HTTP, not script agents"
    return None if config.use else "a script agent needs use: scripts:NAME"


@protocol("script", check=needs_use)
class ScriptAgentClient:
    def __init__(self, name: str, config: AgentConfig, project: ProjectConfig) -> None:
        self.name = name
        self.config = config
        self.scripts_dir = project.scripts_path
        assert config.use is not None
        self.script_id = config.use.split(":", 1)[1]

    async def complete(self, request: AgentRequest) -> AgentReply:
        started = time.monotonic()

        def record(error: str | None = None) -> AgentCallRecord:
            return AgentCallRecord(
                role=request.role,
                agent=self.name,
                latency_ms=int((time.monotonic() - started) * 1000),
                error=error,
            )

        try:
            fn = load_script(self.scripts_dir, self.script_id, "agent")
            result = await call_script(fn, request.messages, dict(request.metadata))
        except ScriptError as exc:
            raise AgentError("script", str(exc), call=record(str(exc))) from exc
        except Exception as exc:  # the script's own bug is the agent's error, not ours
            message = f"agent error: script {self.script_id} raised {type(exc).__name__}: {exc}"
            raise AgentError("script", message, call=record(message)) from exc
        if not isinstance(result, str | dict):
            message = (
                f"agent error: script {self.script_id} returned {type(result).__name__}, "
                'expected text or {"content", "tool_calls", "awaiting_input", ...}'
            )
            raise AgentError("script", message, call=record(message))
        if nested_deeper_than(result):
            # What it holds goes into the state and the records (json_values.py).
            message = f"agent error: script {self.script_id}'s reply is {too_deep_message('JSON')}"
            raise AgentError("script", message, call=record(message))
        try:
            reply = parse_http_reply(result, ResponseMapping())
        except Exception as exc:
            message = f"agent error: cannot read script {self.script_id}'s reply: {exc}"
            raise AgentError("script", message, call=record(message)) from exc
        reply.call = record()
        return reply
