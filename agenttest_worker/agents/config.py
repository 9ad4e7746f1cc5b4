"""agenttest.yaml: the named agents, the default judge and simulator, the scripts folder.

Strings may refer to the environment as `${VAR}` or `${VAR:-default}` (the default
also when VAR is set but empty, as in the shell; `$$` is a literal `$`). API keys are
never written in the file: an agent names the variable that holds its key
(`api_key_env`), read when the call is made.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agenttest_worker.agents.http.auth_headers import authorization_clash
from agenttest_worker.agents.http.proxies import setting_problem
from agenttest_worker.agents.http.tls import TlsSettings
from agenttest_worker.agents.http.urls import url_problem
from agenttest_worker.agents.interface import (
    MetadataMode,
    get_protocol,
    protocol_choices,
    protocol_names,
)
from agenttest_worker.agents.refs import is_valid_name, parse_ref
from agenttest_worker.agents.reply_mappings import HistoryConfig, ResponseMapping
from agenttest_worker.agents.state_endpoint import StateEndpoint
from agenttest_worker.agents.stored_credentials import keep_out
from agenttest_worker.durations import parse_duration
from agenttest_worker.settings import get_settings

CONFIG_FILENAMES = ("agenttest.yaml", "agenttest.yml")
DEFAULT_AWAITING_TOOLS = ("request_confirmation", "ask_user", "get_user_input")
# How an agent called as the simulator is sent the conversation (agents/roles.py).
SimulatorMessages = Literal["as_is", "swapped", "transcript"]

# What the runner writes into a request body itself: a `params` entry may not replace it.
OWNED_BODY_FIELDS = frozenset({"model", "messages", "stream", "stream_options", "system"})
# The fields of an agent's entry that go onto the wire to it as they are (its address,
# its headers, its body, its history's address and headers, its proxy, its end state's
# address and headers): every value they
# take from the environment (${VAR}) is a secret of that agent, masked wherever the
# agent's answers or errors are kept (agents/secret_masking.py).
WIRE_FIELDS = frozenset(
    {"base_url", "url", "headers", "params", "request", "history", "proxy", "state"}
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RateLimit(_Strict):
    """Fleet-wide limits for one agent (enforced through Redis when distributed).

    Any `rate_limit` section, even an empty one, also makes the fleet back off
    together when the agent answers 429 (for its Retry-After, or 5 s without one), and
    keeps the agent's calls in flight from being learned from its 429s
    (agents/limits/ratelimit.py): the limits are what it says.
    """

    requests_per_second: int | None = Field(default=None, ge=1)
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)


class Pricing(_Strict):
    """What an agent's tokens cost, in your currency per million tokens (for --max-cost)."""

    prompt_per_million: float = Field(default=0.0, ge=0)
    completion_per_million: float = Field(default=0.0, ge=0)


class AgentConfig(_Strict):
    """One named agent. `protocol` decides how it is called: a protocol registered in
    agents/protocols/ (openai, openai-responses, anthropic, http, script), whose module
    says which of these fields it reads and checks that the ones it needs are set
    (base_url, url, use) and that those it does not read are not set (stream, history,
    previous_response_id).
    """

    protocol: str = "openai"
    base_url: str | None = None
    url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: float = 30.0
    max_retries: int = Field(default=3, ge=0, le=20)
    # The first retry waits about this long, doubling with each attempt (with jitter, up
    # to 30 s; a Retry-After from the agent wins). Mostly for tests and local agents.
    base_delay: float = 0.5
    # None: the protocol's default (object for http, none for the hosted APIs).
    metadata: MetadataMode | None = None
    # Model parameters, added to the request body under the provider's own names
    # (temperature, seed, max_completion_tokens, response_format, ...). Unknown keys are
    # passed through: providers add parameters every month.
    params: dict[str, Any] = Field(default_factory=dict)
    description: str | None = None
    tools: list[Any] = Field(default_factory=list)
    method: Literal["POST", "PUT"] = "POST"
    request: Any = None
    response: ResponseMapping = Field(default_factory=ResponseMapping)
    use: str | None = None
    rate_limit: RateLimit | None = None
    pricing: Pricing | None = None
    # Streamed replies: true for openai and anthropic; sse or ndjson for http.
    stream: bool | Literal["sse", "ndjson"] = False
    # anthropic: the API version header, and max_tokens (which the Messages API requires).
    anthropic_version: str = "2023-06-01"
    max_tokens: int = Field(default=4096, ge=1)
    # http: replies read back from the agent's chat history.
    history: HistoryConfig | None = None
    # Where the state the agent leaves in its system is read after a conversation (any
    # protocol; a case's own `state:` wins): agents/state_endpoint.py.
    state: StateEndpoint | None = None
    # openai-responses: continue a target's conversation from its last response's id,
    # sending only what came after it (the API keeps the rest).
    previous_response_id: bool = False
    # TLS of its https calls (agents/http/tls.py); unset, the default trust.
    tls: TlsSettings | None = None
    # Its proxy (agents/http/proxies.py): a URL, or `none` (or empty) to go direct; unset, the
    # environment's (HTTPS_PROXY, NO_PROXY and the like).
    proxy: str | None = None
    # azure (or openai with both deployment and api_version): the deployment's name, the
    # API version, and the variable holding a Microsoft Entra ID token (instead of a key).
    deployment: str | None = Field(default=None, min_length=1, validate_default=True)
    api_version: str | None = Field(default=None, min_length=1, validate_default=True)
    azure_ad_token_env: str | None = None
    # Its replies kept and served again (agents/reply_cache.py): true always, false
    # never; unset, judges, simulators and generators with temperature 0 or a seed.
    cache: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _openai_on_azure(cls, data: Any) -> Any:
        # An openai entry naming a deployment and an API version is `protocol: azure`.
        on_azure = isinstance(data, dict) and data.get("deployment") and data.get("api_version")
        if on_azure and data.get("protocol", "openai") == "openai":
            return {**data, "protocol": "azure"}
        return data

    @field_validator("deployment", "api_version")
    @classmethod
    def _needed_setting(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A setting the agent's protocol `needs` (agents/interface.py), refused where unset."""
        name = info.data.get("protocol")
        needs = get_protocol(name).needs if name in protocol_names() else ()
        if value is None and info.field_name in needs:
            raise ValueError(f"required field is missing: {name} agents need {info.field_name}")
        return value

    # Called as the simulator: the conversation as one transcript (a user message), as
    # it is (the target's words as the assistant's), or with its roles swapped.
    messages: SimulatorMessages = "transcript"
    # The values its WIRE_FIELDS took from the environment when agenttest.yaml was read
    # (config_from_data): never shown, never kept.
    _from_environment: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="before")
    @classmethod
    def _no_inline_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError(
                "api_key must not be written in the config: put the key in an environment "
                "variable and name it with api_key_env"
            )
        return data

    @field_validator("protocol", mode="before")
    @classmethod
    def _registered_protocol(cls, value: Any) -> Any:
        # Worded as pydantic words a Literal's error, which this field was.
        if value not in protocol_names():
            raise ValueError(f"Input should be {protocol_choices()}")
        return value

    @field_validator("timeout", "base_delay", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)

    @field_validator("base_url", "url")
    @classmethod
    def _callable_url(cls, url: str | None) -> str | None:
        problem = url_problem(url) if url is not None else None
        if problem:
            raise ValueError(problem)
        return url

    @field_validator("proxy")
    @classmethod
    def _usable_proxy(cls, proxy: str | None) -> str | None:
        problem = setting_problem(proxy)
        if problem:
            raise ValueError(problem)
        return proxy

    @field_validator("use")
    @classmethod
    def _script_ref(cls, use: str | None) -> str | None:
        if use is None:
            return None
        ref = parse_ref(use, default_kind="scripts")
        if ref.kind != "scripts":
            raise ValueError(f"{use!r}: a script agent uses scripts:NAME")
        return str(ref)

    @field_validator("params")
    @classmethod
    def _params_not_owned(cls, params: dict[str, Any]) -> dict[str, Any]:
        owned = sorted(OWNED_BODY_FIELDS & params.keys())
        if owned:
            raise ValueError(
                f"{', '.join(owned)} cannot be a param: the runner writes "
                + ("it" if len(owned) == 1 else "them")
                + " (the model is `model:`, streaming is `stream:`)"
            )
        return params

    @model_validator(mode="after")
    def _complete(self) -> AgentConfig:
        """What the agent's protocol needs of its settings (base_url, url, use, ...)."""
        check = get_protocol(self.protocol).check
        problem = check(self) if check is not None else None
        if self.previous_response_id and self.protocol != "openai-responses":
            problem = problem or "previous_response_id is for openai-responses agents"
        if problem:
            raise ValueError(problem)
        bearer = self.api_key_env is not None and self.protocol != "anthropic"
        history = (self.history.url, self.history_headers()) if self.history else (None, {})
        sent = [(self.base_url, self.headers), (self.url, self.headers), history]
        clash = authorization_clash(sent, bearer)
        if clash:
            raise ValueError(clash)
        return self

    def history_headers(self) -> dict[str, str]:
        """The headers of a history read: the entry's, and the history's own."""
        return {**self.headers, **(self.history.headers if self.history else {})}

    def metadata_mode(self) -> MetadataMode:
        """How this agent gets the case's metadata: as its entry says, else as its
        protocol does by default."""
        if self.metadata is not None:
            return self.metadata
        return get_protocol(self.protocol).metadata

    def api_key(self) -> str | None:
        """The key from the environment at call time (never stored, never logged)."""
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None

    def environment_secrets(self) -> tuple[str, ...]:
        """What its address, headers, body templates, params, history, proxy and end
        state took from ${VAR}: masked wherever the agent's replies and errors are kept."""
        return self._from_environment


class Defaults(_Strict):
    judge: str | None = None
    simulator: str | None = None
    agent: str | None = None
    # How often an agent assertion without `votes` asks its judge(s).
    judge_votes: int = Field(default=1, ge=1)
    # What a case that sets no `on_missing_input` does when its agent awaits input and
    # nothing answers; None: by the case's form (engine/next_input.py).
    on_missing_input: Literal["skip", "fail", "end"] | None = None


class ProjectConfig(_Strict):
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    defaults: Defaults = Field(default_factory=Defaults)
    scripts_dir: str = "scripts"
    awaiting_tools: list[str] = Field(default_factory=lambda: list(DEFAULT_AWAITING_TOOLS))
    # Where the file was read from; relative paths (scripts_dir) are relative to it.
    path: str | None = None
    # The file as written, before ${ENV} interpolation: what a run stores, so that
    # secrets passed through the environment never reach the database.
    _raw: dict[str, Any] | None = PrivateAttr(default=None)
    # Rebuilt from a stored run (from_stored): its scripts_dir and path are whoever
    # submitted the run's choice, not this process's.
    _from_store: bool = PrivateAttr(default=False)

    @field_validator("agents")
    @classmethod
    def _names(cls, agents: dict[str, AgentConfig]) -> dict[str, AgentConfig]:
        for name in agents:
            if not is_valid_name(name):
                raise ValueError(f"{name!r} is not a valid agent name")
        return agents

    @property
    def base_dir(self) -> Path:
        return Path(self.path).resolve().parent if self.path else Path.cwd()

    @property
    def scripts_path(self) -> Path | None:
        """Where `scripts:` names resolve: AGENTTEST_SCRIPTS_DIR, else `scripts_dir`
        (relative to the file). A stored run's scripts_dir is not used on a fleet: it may
        name any folder, and the workers would import Python from it; there, without
        AGENTTEST_SCRIPTS_DIR, there is no scripts folder (None: every script is refused)."""
        settings = get_settings()
        if settings.scripts_dir is not None:
            return settings.scripts_dir.resolve()
        if self._from_store and settings.distributed:
            return None
        return (self.base_dir / self.scripts_dir).resolve()

    def stored(self) -> dict[str, Any]:
        """What a run keeps of its config: the uninterpolated file and where it was,
        without the credentials written into it (stored_credentials.py)."""
        raw = self._raw if self._raw is not None else self.model_dump(mode="json", exclude={"path"})
        path = str(Path(self.path).resolve()) if self.path else None
        return {"raw": keep_out(raw), "path": path}

    def agent(self, name: str) -> AgentConfig:
        """The agent called `name` (with or without `agents:`); LookupError names the options."""
        ident = name.split(":", 1)[1] if name.startswith("agents:") else name
        try:
            return self.agents[ident]
        except KeyError:
            raise LookupError(self.unknown_agent_message(ident)) from None

    def unknown_agent_message(self, name: str) -> str:
        where = f" in {self.path}" if self.path else " (no agenttest.yaml found; use --config)"
        close = difflib.get_close_matches(name, list(self.agents), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = f" (known: {', '.join(sorted(self.agents))})" if self.agents and not close else ""
        return f"unknown agent {name!r}{where}{hint}{known}"


# -- loading -----------------------------------------------------------------------------
