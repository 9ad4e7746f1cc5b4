"""Credentials written into agenttest.yaml itself are never stored with a run.

A run stores its agenttest.yaml as written (`ProjectConfig.stored`), so that any worker
rebuilds the same agents. `${VAR}` references are stored as references, and resolved
from the environment of the process that calls. A credential written literally (a
password in a URL's userinfo, a key-like query value, the value of a credential header
such as `Authorization` or `X-Api-Key`) is masked in what is stored (`keep_out`); the
process that rebuilds the config reads it again from the agenttest.yaml at the path the
run stored (`restore`): the submitter of an embedded run, a worker that has the same
file at the same path. A process that cannot read it (no such file, or a file whose
agent entry differs) fails that agent's conversations with a reason that says to write
the credential as `${VAR}` in the workers' environment.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from agenttest_worker.errors import MASK, ConfigError, InputProblem, is_secret_param, url_secrets
from agenttest_worker.yamlfile import parse_yaml

# Header names whose literal value is a credential (lower case; or any name holding a
# key-like word, errors.is_secret_param), and values that announce one whatever the name.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
CREDENTIAL_SCHEMES = ("bearer ", "basic ", "token ", "digest ")


def _is_credential_header(name: str, value: str) -> bool:
    lowered = name.lower()
    return (
        lowered in CREDENTIAL_HEADERS
        or is_secret_param(lowered)
        or value.lower().startswith(CREDENTIAL_SCHEMES)
    )


def _masked_url(url: str) -> str:
    """`url` with its literal secrets masked; `${VAR}` references kept."""
    for secret in url_secrets(url):
        if "$" not in secret:
            url = url.replace(secret, MASK)
    return url


def _keep_out_entry(entry: Any) -> Any:
    """An agent entry (or a part of one) with its literal credentials masked."""
    if not isinstance(entry, dict):
        return entry
    found: dict[str, Any] = {}
    for key, value in entry.items():
        if isinstance(value, str) and isinstance(key, str) and key.endswith("url"):
            found[key] = _masked_url(value)
        elif key == "headers" and isinstance(value, dict):
            found[key] = {
                name: MASK
                if isinstance(text, str)
                and "$" not in text
                and _is_credential_header(str(name), text)
                else text
                for name, text in value.items()
            }
        else:
            found[key] = _keep_out_entry(value)
    return found


def _agents(raw: Any) -> dict[str, Any]:
    agents = raw.get("agents") if isinstance(raw, dict) else None
    return agents if isinstance(agents, dict) else {}


def keep_out(raw: dict[str, Any]) -> dict[str, Any]:
    """agenttest.yaml as a run stores it: every agent's literal credentials masked."""
    agents = _agents(raw)
    if not agents:
        return raw
    kept = dict(raw)
    kept["agents"] = {name: _keep_out_entry(entry) for name, entry in agents.items()}
    return kept


def _holds_mask(value: Any) -> bool:
    if isinstance(value, str):
        return MASK in value
    if isinstance(value, dict):
        return any(_holds_mask(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_mask(v) for v in value)
    return False


def restore(raw: dict[str, Any], path: str | None) -> dict[str, Any]:
    """The stored agenttest.yaml with the credentials `keep_out` masked read again from
    the file at `path`; ConfigError names each agent whose credentials this process
    cannot read there."""
    agents = _agents(raw)
    masked = [name for name, entry in agents.items() if _holds_mask(entry)]
    if not masked:
        return raw
    written, why = _read(path)
    restored = dict(raw)
    restored["agents"] = dict(agents)
    problems: list[InputProblem] = []
    for name in masked:
        entry = _agents(written).get(name)
        if entry is not None and _keep_out_entry(entry) == agents[name]:
            restored["agents"][name] = copy.deepcopy(entry)
            continue
        reason = why or f"its entry for agent {name!r} is not the one the run stored"
        problems.append(
            InputProblem(
                f"agent {name!r}: a credential written in agenttest.yaml is never stored with "
                f"a run, and this process cannot read it from {path or 'agenttest.yaml'} "
                f"({reason}); write it as ${{VAR}} and set VAR where the run is played",
                file=path,
                field=f"agents.{name}",
            )
        )
    if problems:
        raise ConfigError(problems)
    return restored


def _read(path: str | None) -> tuple[dict[str, Any], str | None]:
    """agenttest.yaml's data at `path`, or why it cannot be read."""
    if path is None:
        return {}, "the run names no agenttest.yaml"
    try:
        data, _ = parse_yaml(Path(path).read_text(encoding="utf-8-sig"), path)
    except (OSError, UnicodeDecodeError) as exc:
        return {}, f"cannot read it: {exc.strerror if isinstance(exc, OSError) else exc}"
    except Exception as exc:  # any YAML problem: the file is not the one the run read
        return {}, f"it does not parse: {exc}"
    return (data if isinstance(data, dict) else {}), None
