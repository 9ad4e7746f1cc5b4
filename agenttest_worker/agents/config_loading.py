"""agenttest.yaml read from disk: found, its ${VAR} references interpolated, validated
into a ProjectConfig with every problem's file, line and field, its references and
files checked, all before anything runs."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agenttest_worker.agents.config import (
    CONFIG_FILENAMES,
    WIRE_FIELDS,
    ProjectConfig,
)
from agenttest_worker.agents.http.network_checks import network_problems
from agenttest_worker.agents.stored_credentials import restore
from agenttest_worker.errors import ConfigError, InputProblem
from agenttest_worker.yamlfile import LineMap, YamlPath, parse_yaml

_ENV_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


# Told each value interpolation takes from the environment, with where it went.
Resolved = Callable[[YamlPath, str], None]


def _ignore(path: YamlPath, value: str) -> None:
    return None


def interpolate(
    value: Any,
    env: dict[str, str],
    on_missing: Any,
    path: YamlPath = (),
    resolved: Resolved = _ignore,
) -> Any:
    """Replace ${VAR} / ${VAR:-default} in every string; `on_missing(path, var)` reports,
    `resolved(path, value)` is told every value taken from `env` (not a default)."""
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            var, default = match.group(1), match.group(2)
            # As in the shell and docker compose: `:-` also replaces a set but empty value.
            if default is not None and not env.get(var):
                return default
            if var in env:
                resolved(path, env[var])
                return env[var]
            on_missing(path, var)
            return ""

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: interpolate(v, env, on_missing, (*path, k), resolved) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, on_missing, (*path, i), resolved) for i, v in enumerate(value)]
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

    # Each agent's secrets from the environment, by agent name (see WIRE_FIELDS).
    secrets: dict[str, set[str]] = {}

    def resolved(loc: YamlPath, value: str) -> None:
        if len(loc) > 2 and loc[0] == "agents" and loc[2] in WIRE_FIELDS and value:
            secrets.setdefault(str(loc[1]), set()).add(value)

    environment = dict(os.environ if env is None else env)
    interpolated = interpolate(data, environment, missing, (), resolved)
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
    for agent_name, values in secrets.items():
        agent = config.agents.get(agent_name)
        if agent is not None:
            agent._from_environment = tuple(sorted(values))
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


def config_from_stored(stored: dict[str, Any], env: dict[str, str] | None = None) -> ProjectConfig:
    """Rebuild a run's config in this process, interpolating with this environment,
    its credentials read again from the file it names (stored_credentials.py)."""
    path = stored.get("path")
    config = config_from_data(restore(stored.get("raw") or {}, path), path, env)
    config._from_store = True
    return config
