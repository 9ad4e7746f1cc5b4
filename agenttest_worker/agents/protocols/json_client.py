"""What the openai and http protocols share: one JSON call per request, retried, rate
limited, recorded. A protocol says where it posts, how to build its body and how to
read the reply; both read token counts and declared booleans the same way."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agenttest_worker.agents.config import AgentConfig, ProjectConfig
from agenttest_worker.agents.http.exchange import Route
from agenttest_worker.agents.http.proxies import proxy_route, proxy_secrets
from agenttest_worker.agents.http.streaming import StreamSpec
from agenttest_worker.agents.http.tls import TlsFileProblem, context_for
from agenttest_worker.agents.http.transport import masked, post_json
from agenttest_worker.agents.interface import AgentError, AgentReply, AgentRequest
from agenttest_worker.agents.limits.ratelimit import Limits, limiter
from agenttest_worker.agents.limits.retry import RetryPolicy
from agenttest_worker.agents.secret_masking import mask_error, mask_reply
from agenttest_worker.errors import url_secrets
from agenttest_worker.results import Usage


class JsonAgentClient:
    # `project` is what every registered client is built with (agents/interface.py); the JSON
    # protocols need nothing from it.
    def __init__(
        self, name: str, config: AgentConfig, project: ProjectConfig | None = None
    ) -> None:
        self.name = name
        self.config = config
        self.policy = RetryPolicy(max_retries=config.max_retries, base_delay=config.base_delay)
        self.limits = Limits.for_agent(config.rate_limit)
        self.url = self.endpoint()
        # What no error or reply may show: the URL's password and key-like query values,
        # the proxy's credentials, and every value the entry takes from ${VAR} (its
        # headers' among them, which no redirect to another origin carries: exchange.py).
        written = written_entry(name, project)
        self.secrets = [
            *url_secrets(self.url, written_url(config, written)),
            *config.environment_secrets(),
            *written_proxy_secrets(config, written),
        ]
        self.route, self.route_problem = agent_route(name, config, project)

    def endpoint(self) -> str:
        """Where requests are posted: `url`, else `base_url`."""
        return self.config.url or self.config.base_url or ""

    def headers(self) -> dict[str, str]:
        headers = dict(self.config.headers)
        key = self.config.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def body(self, request: AgentRequest) -> Any:
        raise NotImplementedError

    def params(self, request: AgentRequest) -> dict[str, Any]:
        """The model parameters for this request: the agent entry's `params`, then what
        the case or the role adds (a key given twice takes the later value)."""
        if not request.params:
            return self.config.params
        return {**self.config.params, **request.params}

    def sends_metadata(self) -> bool:
        """Whether the case's metadata and options go into the body (`metadata:`)."""
        return self.config.metadata_mode() != "none"

    def parse(self, data: Any) -> AgentReply:
        raise NotImplementedError

    def stream_spec(self) -> StreamSpec | None:
        """How a streamed reply is read; None for a protocol (or agent) that does not stream."""
        return None

    # Whether the call record keeps the reply's stop reason when the reply was read whole
    # (a streamed reply's is always kept).
    records_stop_reason = False

    def hidden(self) -> list[str]:
        """What no error or reply may show: the secrets above and the API key."""
        key = self.config.api_key()
        return [*self.secrets, key] if key else self.secrets

    async def complete(self, request: AgentRequest) -> AgentReply:
        # The call and the masking of its errors in one frame: a frame per layer is held
        # by every turn waiting on its agent, thousands of them on a worker.
        try:
            if self.route_problem is not None:
                raise AgentError("config", self.route_problem)
            result = await post_json(
                url=self.url,
                body=self.body(request),
                headers=self.headers(),
                timeout=self.config.timeout,
                policy=self.policy,
                limits=self.limits,
                role=request.role,
                agent=self.name,
                method=self.config.method,
                hidden=self.hidden(),
                stream=self.stream_spec(),
                route=self.route,
            )
            try:
                if result.stream is not None:
                    reply = result.stream.reply()
                    result.record.stop_reason = reply.finish_reason
                else:
                    reply = self.parse(result.json(self.name))
                    if self.records_stop_reason:
                        result.record.stop_reason = reply.finish_reason
            except Exception as exc:
                error = (
                    exc
                    if isinstance(exc, AgentError)
                    else AgentError("parse", f"agent error: cannot read {self.name}'s reply: {exc}")
                )
                # The call happened (latency, attempts, status): keep its record and the body.
                result.record.error = error.message
                error.call = result.record
                error.raw = result.text[:4096]
                raise error from exc
            result.record.usage = reply.usage
            reply.call = result.record
            if self.limits.tokens and reply.usage is not None:
                await limiter().add_tokens(self.name, self.limits, reply.usage.total_tokens)
            # An agent may echo what it was sent (its headers, its URL): never kept.
            return mask_reply(reply, self.hidden())
        except AgentError as error:
            # A reply that cannot be read is kept in the error: it may echo the URL, the
            # headers; a broken stream's partial reply too.
            hidden = self.hidden()
            raise mask_error(masked(error, hidden), hidden) from None


def written_entry(name: str, project: ProjectConfig | None) -> dict[str, Any] | None:
    """The agent's entry as agenttest.yaml writes it, before ${VAR} interpolation."""
    if project is None:
        return None
    raw = project.stored()["raw"]
    agents = raw.get("agents") if isinstance(raw, dict) else None
    entry = agents.get(name) if isinstance(agents, dict) else None
    return entry if isinstance(entry, dict) else None


def agent_route(
    name: str, config: AgentConfig, project: ProjectConfig | None
) -> tuple[Route, str | None]:
    """How the agent's calls travel (its TLS context and proxy), or why they cannot: a
    `tls:` file checked when agenttest.yaml was loaded may be missing where a stored run
    is played (another machine, a file since removed), and every call then fails so."""
    proxy = proxy_route(config.proxy)  # (checked when the file was loaded)
    if config.tls is None:
        return Route(proxy=proxy), None
    base_dir = project.base_dir if project is not None else Path.cwd()
    try:
        return Route(context_for(name, config.tls, base_dir), proxy), None
    except TlsFileProblem as problem:
        return Route(proxy=proxy), f"agent error: {name}: {problem}"


def written_proxy_secrets(config: AgentConfig, entry: dict[str, Any] | None) -> list[str]:
    """What no error may show of the agent's `proxy:`: its password, and a user name
    alone or written as ${VAR}."""
    if not config.proxy:
        return []
    written = (entry or {}).get("proxy")
    return proxy_secrets(config.proxy, written if isinstance(written, str) else None)


def written_url(config: AgentConfig, entry: dict[str, Any] | None) -> str | None:
    written = (entry or {}).get("url" if config.url else "base_url")
    return written if isinstance(written, str) else None


def as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def usage_from(usage: Any) -> Usage | None:
    """Token counts from a `usage` object; extra keys are ignored, odd values count as 0."""
    if not isinstance(usage, dict):
        return None

    def count(key: str) -> int:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(value) if isinstance(value, float) and math.isfinite(value) else 0

    prompt, completion = count("prompt_tokens"), count("completion_tokens")
    # An agent that gives the two counts and no total used their sum: counted so, or its
    # tokens would escape --max-tokens and the usage figures.
    total = count("total_tokens") if "total_tokens" in usage else prompt + completion
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)


def body_json(text: str | None) -> Any:
    """An error body as JSON, or None when it is not JSON."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def say_api_error(error: AgentError, agent: str, said: str | None) -> None:
    """An HTTP error whose body is the API's own error object: its message says the
    error's type and message (`said`), not the JSON it came in."""
    if said is None or error.call is None:
        return
    error.message = f"agent error: HTTP {error.call.status_code} from {agent}: {said}"
    if error.call.attempts > 1:
        error.message += f" (after {error.call.attempts} attempts)"
    error.args = (error.message,)
    error.call.error = error.message
