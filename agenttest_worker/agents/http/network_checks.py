"""What agenttest.yaml's `tls:` and `proxy:` settings, and the environment's CA bundle and
proxy variables, need before a run: files that can be read, proxies that can be used.

Checked when agenttest.yaml is read from disk (config_loading.load_config), so that a missing
CA file is an input error with its file, line and field, not every call of a run failing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from agenttest_worker.agents.http.proxies import environment_problems
from agenttest_worker.agents.http.tls import check_files, trust_problems
from agenttest_worker.errors import InputProblem, format_field
from agenttest_worker.yamlfile import LineMap

if TYPE_CHECKING:
    from agenttest_worker.agents.config import ProjectConfig


def network_problems(
    config: ProjectConfig, lines: LineMap, env: Mapping[str, str] | None = None
) -> list[InputProblem]:
    """The `tls:` files that cannot be used; the trust variables (SSL_CERT_FILE,
    REQUESTS_CA_BUNDLE) when an agent relies on them, and the proxy variables when an
    agent takes its proxy from the environment, that name nothing usable."""
    problems: list[InputProblem] = []
    default_trust = from_environment = False
    for name, agent in config.agents.items():
        if agent.protocol == "script":
            continue  # called in process, not over HTTP
        tls = agent.tls
        default_trust = default_trust or tls is None or (tls.verify and tls.ca_file is None)
        from_environment = from_environment or agent.proxy is None
        problem = check_files(tls, config.base_dir) if tls is not None else None
        if problem is not None:
            loc = ("agents", name, *problem.field.split("."))
            problems.append(
                InputProblem(
                    problem.message,
                    file=config.path,
                    line=lines.line_of(loc),
                    field=format_field(loc),
                )
            )
    variables = [
        *(trust_problems(env) if default_trust else []),
        *(environment_problems(env) if from_environment else []),
    ]
    problems += [InputProblem(message, field=name) for name, message in variables]
    return problems
