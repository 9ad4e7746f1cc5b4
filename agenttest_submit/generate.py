"""Cases from a generator: `-i agents:ID?count=20&focus=edge-cases` or `-i scripts:ID?...`.

The generator agent is called per the spec's generator interface (test_mode
"generator", target_agent, target_description and target_tools from the registry, the
query parameters); a script gets the same dictionary. Each generated case is validated
like a case from a file: a bad one is reported (with its index) and left out, and the
rest run.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

from agenttest_submit.inputs import GeneratorInput
from agenttest_worker.agents.base import AgentError
from agenttest_worker.agents.pool import AgentPool
from agenttest_worker.agents.registry import ProjectConfig
from agenttest_worker.case_files import Located, validate_case
from agenttest_worker.cases import Case
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.results import AgentCallRecord


def _typed(value: str) -> Any:
    """Query values are text; numbers and booleans are passed as such (count=10 is 10)."""
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


def generator_metadata(
    source: GeneratorInput, config: ProjectConfig, target: str | None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"target_agent": target}
    if target and target in config.agents:
        agent = config.agents[target]
        if agent.description:
            metadata["target_description"] = agent.description
        if agent.tools:
            metadata["target_tools"] = agent.tools
    metadata.update({k: _typed(v) for k, v in source.ref.params.items()})
    return metadata


async def _generate(source: GeneratorInput, config: ProjectConfig, target: str | None) -> list[Any]:
    from agenttest_worker.agents.transport import close_session

    log: list[AgentCallRecord] = []
    try:
        return (
            await AgentPool(config)
            .session(log)
            .generate(
                f"{source.ref.kind}:{source.ref.id}", generator_metadata(source, config, target)
            )
        )
    finally:
        await close_session()


def generate_cases(
    source: GeneratorInput, config: ProjectConfig, target: str | None = None
) -> Iterator[Case | InputProblem]:
    """Validated generated cases; invalid ones are reported on stderr and left out."""
    label = source.describe()
    try:
        raw_cases = asyncio.run(_generate(source, config, target))
    except AgentError as exc:
        raise InputError(InputProblem(f"generator failed: {exc.message}", file=label)) from None
    if not raw_cases:
        raise InputError(InputProblem("generator returned no cases", file=label))
    kept = 0
    for index, raw in enumerate(raw_cases):
        if isinstance(raw, dict) and "id" not in raw:
            raw = {"id": f"{source.ref.id}-{index + 1:03d}", **raw}
        problems: list[InputProblem] = []
        for item in validate_case(Located(raw, label, index + 1)):
            if isinstance(item, InputProblem):
                problems.append(item)
            else:
                kept += 1
                yield item
        for problem in problems:
            print(
                f"warning: generated case {index + 1} left out: "
                f"{problem.field + ': ' if problem.field else ''}{problem.message}",
                file=sys.stderr,
            )
    if kept == 0:
        raise InputError(InputProblem("no generated case was valid", file=label))
