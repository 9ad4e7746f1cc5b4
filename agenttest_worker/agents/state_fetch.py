"""Reading an agent's end state (`state:`, agents/state_endpoint.py) over the agents'
HTTP transport: its TLS, proxy, timeout and retries are those of the target agent's
entry, and its secrets are masked in what comes back.

Only the endpoint's own `headers` are sent (not the agent's, nor its API key): the
state is often kept by another service than the agent's. Headers of a case's `state:`
may refer to the environment as `${VAR}`, read here, in the process that makes the
call, and never stored (the case keeps the reference); an agent entry's were read with
agenttest.yaml.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from agenttest_worker.agents.config import AgentConfig, ProjectConfig
from agenttest_worker.agents.config_loading import interpolate
from agenttest_worker.agents.http.transport import post_json
from agenttest_worker.agents.interface import AgentError
from agenttest_worker.agents.limits.retry import RetryPolicy
from agenttest_worker.agents.protocols.http import render
from agenttest_worker.agents.protocols.json_client import (
    agent_route,
    written_entry,
    written_proxy_secrets,
)
from agenttest_worker.agents.secret_masking import masked_json
from agenttest_worker.agents.state_endpoint import StateEndpoint
from agenttest_worker.errors import hidden_forms, redact, url_secrets
from agenttest_worker.json_values import find

# Said at the start of every reason a fetch fails with: the case fails for its test
# infrastructure, not for what the agent did.
INFRASTRUCTURE = "infrastructure error"


@dataclass(frozen=True)
class StateCall:
    """Whose state is read, for which conversation and turn, and how its calls travel."""

    agent: str
    config: AgentConfig
    project: ProjectConfig | None
    session_id: str
    case_id: str
    turn: int
    # True for a case's `state:`: its ${VAR} references are read from this environment.
    from_case: bool = False
    environment: dict[str, str] = field(default_factory=lambda: dict(os.environ))


def state_url(template: str, values: dict[str, Any]) -> str:
    """The URL with its placeholders filled in, each value percent-encoded."""
    return str(render(template, {k: quote(str(v), safe="") for k, v in values.items()}))


async def fetch_state(endpoint: StateEndpoint, call: StateCall) -> Any:
    """The state the endpoint answers for the call's conversation (secrets masked).

    AgentError("state", ...) when it cannot be read: the agent unreachable, a non-2xx
    status, a body that is not JSON, nothing at `response`; its message names the method
    and the URL (secrets masked) and what went wrong."""
    values = {"session_id": call.session_id, "case_id": call.case_id, "turn": call.turn}
    url = state_url(endpoint.url, values)
    headers, secrets = _headers(endpoint, call)
    hidden = [*_agent_secrets(call), *secrets, *url_secrets(url)]
    shown = f"{endpoint.method} {redact(url, hidden)}"
    route, route_problem = agent_route(call.agent, call.config, call.project)
    if route_problem is not None:
        raise _failed(shown, route_problem.removeprefix("agent error: "), hidden)
    if endpoint.method == "POST":
        body = render(endpoint.request, values) if endpoint.request is not None else values
    else:
        body = None
    try:
        result = await post_json(
            url=url,
            body=body,
            headers=headers,
            timeout=call.config.timeout,
            policy=RetryPolicy(
                max_retries=call.config.max_retries, base_delay=call.config.base_delay
            ),
            role="target",
            agent=call.agent,
            method=endpoint.method,
            hidden=hidden,
            route=route,
        )
        data = result.json(call.agent)
    except AgentError as error:
        raise _failed(shown, error.message.removeprefix("agent error: "), hidden) from None
    found = find(endpoint.response, data)
    if not found:
        raise _failed(shown, f"its reply has nothing at {endpoint.response}", hidden)
    forms = hidden_forms(hidden)
    return masked_json(found[0], forms) if forms else found[0]


def _agent_secrets(call: StateCall) -> list[str]:
    """The target agent's secrets (what its entry took from ${VAR}, its proxy's
    credentials, its API key): a state service may echo them too."""
    config = call.config
    written = written_entry(call.agent, call.project)
    key = config.api_key()
    return [
        *config.environment_secrets(),
        *written_proxy_secrets(config, written),
        *([key] if key else []),
    ]


def _headers(endpoint: StateEndpoint, call: StateCall) -> tuple[dict[str, str], list[str]]:
    """The headers to send, and the values a case's took from the environment."""
    if not call.from_case:
        return dict(endpoint.headers), []
    taken: list[str] = []
    missing: list[str] = []
    headers = interpolate(
        endpoint.headers,
        call.environment,
        lambda _path, var: missing.append(var),
        (),
        lambda _path, value: taken.append(value),
    )
    if missing:
        raise AgentError(
            "state",
            f"{INFRASTRUCTURE}: the state's headers need the environment variable "
            f"{missing[0]}, which is not set where the case is played",
        )
    return headers, [value for value in taken if value]


def _failed(shown: str, why: str, hidden: Collection[str]) -> AgentError:
    return AgentError(
        "state", redact(f"{INFRASTRUCTURE}: cannot read the end state ({shown}): {why}", hidden)
    )
