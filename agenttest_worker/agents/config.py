"""agenttest.yaml: the named agents, the default judge and simulator, the scripts folder.

Strings may refer to the environment as `${VAR}` or `${VAR:-default}` (the default
also when VAR is set but empty, as in the shell; `$$` is a literal `$`). API keys are
never written in the file: an agent names the variable that holds its key
(`api_key_env`), read when the call is made.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agenttest_worker.agents.http.network_checks import network_problems
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
from agenttest_worker.durations import parse_duration
from agenttest_worker.errors import ConfigError, InputProblem
from agenttest_worker.settings import get_settings
from agenttest_worker.yamlfile import LineMap, YamlPath, parse_yaml

CONFIG_FILENAMES = ("agenttest.yaml", "agenttest.yml")
DEFAULT_AWAITING_TOOLS = ("request_confirmation", "ask_user", "get_user_input")
# How an agent called as the simulator is sent the conversation (agents/roles.py).
SimulatorMessages = Literal["as_is", "swapped", "transcript"]

# What the runner writes into a request body itself: a `params` entry may not replace it.
OWNED_BODY_FIELDS = frozenset({"model", "messages", "stream", "stream_options", "system"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RateLimit(_Strict):
    """Fleet-wide limits for one agent (enforced through Redis when distributed).

    Any `rate_limit` section, even an empty one, also makes the fleet back off
    together when the agent answers 429.
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
        return self

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
        """What a run keeps of its config: the uninterpolated file and where it was."""
        raw = self._raw if self._raw is not None else self.model_dump(mode="json", exclude={"path"})
        return {"raw": raw, "path": str(Path(self.path).resolve()) if self.path else None}

    @classmethod
    def from_stored(
        cls, stored: dict[str, Any], env: dict[str, str] | None = None
    ) -> ProjectConfig:
        """Rebuild a run's config in this process, interpolating with this environment."""
        config = config_from_data(stored.get("raw") or {}, stored.get("path"), env)
        config._from_store = True
        return config

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

_ENV_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str], on_missing: Any, path: YamlPath = ()) -> Any:
    """Replace ${VAR} / ${VAR:-default} in every string; `on_missing(path, var)` reports."""
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            var, default = match.group(1), match.group(2)
            # As in the shell and docker compose: `:-` also replaces a set but empty value.
            if default is not None and not env.get(var):
                return default
            if var in env:
                return env[var]
            on_missing(path, var)
            return ""

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: interpolate(v, env, on_missing, (*path, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, on_missing, (*path, i)) for i, v in enumerate(value)]
    return value


def find_config(explicit: str | Path | None, cwd: Path | None = None) -> Path | None:
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(InputProblem("config file not found", file=str(path)))
        return path
    base = cwd or Path.cwd()
    for name in CONFIG_FILENAMES:
        if (base / name).is_file():
            return base / name
    return None


def load_config(
    explicit: str | Path | None = None,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> ProjectConfig:
    """Read agenttest.yaml (`--config`, else the working directory); none found is empty."""
    path = find_config(explicit, cwd)
    if path is None:
        return ProjectConfig()
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(InputProblem(f"cannot read: {exc}", file=name)) from None
    try:
        data, lines = parse_yaml(text, name)
    except ConfigError:
        raise
    except Exception as exc:
        problems = getattr(exc, "problems", [InputProblem(str(exc), file=name)])
        raise ConfigError(problems) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(InputProblem("agenttest.yaml must be a mapping", file=name, line=1))
    return config_from_data(data, name, env, lines, check_files=True)


def config_from_data(
    data: dict[str, Any],
    name: str | None,
    env: dict[str, str] | None = None,
    lines: LineMap | None = None,
    *,
    check_files: bool = False,
) -> ProjectConfig:
    """Validate config data (interpolating ${ENV}); every problem raised together.

    With `check_files` (agenttest.yaml as read from disk), the files its `tls:` entries
    name are read too, and the environment's CA and proxy variables checked: a run's
    config rebuilt from the store is not, since its files may have gone since (a call
    that needs one then fails, saying why)."""
    problems: list[InputProblem] = []
    line_map = lines or LineMap()

    def missing(loc: YamlPath, var: str) -> None:
        problems.append(
            InputProblem(
                f"environment variable {var} is not set (write ${{{var}:-default}} for a default)",
                file=name,
                line=line_map.line_of(loc),
                field=_dotted(loc),
            )
        )

    interpolated = interpolate(data, dict(os.environ if env is None else env), missing)
    # Every problem at once, not one stage's per attempt; a field whose variable is unset
    # (and what holds it) is reported for that alone: its empty value is wrong as well.
    unset = [p.field for p in problems if p.field]

    def caused_by_unset(field: str | None) -> bool:
        return field is not None and any(
            u == field or u.startswith(f"{field}.") or field.startswith(f"{u}.") for u in unset
        )

    def more(found: list[InputProblem]) -> list[InputProblem]:
        return [*problems, *(p for p in found if not caused_by_unset(p.field))]

    try:
        config = ProjectConfig.model_validate({**interpolated, "path": name})
    except ValidationError as exc:
        raise ConfigError(more(_config_problems(exc, name, line_map))) from None
    found = check_config_refs(config, line_map)
    if check_files:
        found += network_problems(config, line_map, env)
    problems = more(found)
    if problems:
        raise ConfigError(problems)
    config._raw = data
    return config


def check_config_refs(config: ProjectConfig, lines: LineMap | None = None) -> list[InputProblem]:
    """Defaults must name agents that exist."""
    problems: list[InputProblem] = []
    for role in ("judge", "simulator", "agent"):
        ref = getattr(config.defaults, role)
        if ref is None:
            continue
        kind, _, ident = ref.partition(":") if ":" in ref else ("agents", "", ref)
        if kind == "agents" and ident not in config.agents:
            problems.append(
                InputProblem(
                    config.unknown_agent_message(ident),
                    file=config.path,
                    line=lines.line_of(("defaults", role)) if lines else None,
                    field=f"defaults.{role}",
                )
            )
    return problems


def _dotted(loc: YamlPath) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _config_problems(exc: ValidationError, file: str | None, lines: LineMap) -> list[InputProblem]:
    out = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function")))
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field (a typo?)"
        elif err["type"] == "missing":
            message = "required field is missing"
        out.append(InputProblem(message, file=file, line=lines.line_of(loc), field=_dotted(loc)))
    return out
