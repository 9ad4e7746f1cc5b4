"""Cases from a generator: `-i agents:ID?count=20&focus=edge-cases` or `-i scripts:ID?...`.

The generator agent is called per the spec's generator interface (test_mode
"generator", target_agent, target_description and target_tools from the registry, the
query parameters); a script gets the same dictionary. Each generated case is validated
like a case from a file: a bad one (its schema, an agent or script it names that does
not exist, an id the generator already used) is reported on stderr by position and id
and left out, and the rest run. A generator that fails, returns nothing, or returns
nothing valid is an input error: nothing runs.

What the generator calls cost is kept for the run these cases are stored in
(`take_generation_usage`, called by whoever creates the run: storing.write_run takes it): they
were made before the run existed and belong to no conversation.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from agenttest_submit.cli.stopping import run_async
from agenttest_submit.inputs.sources import GeneratorInput
from agenttest_worker.agents import AgentError, AgentPool, ProjectConfig, close_session
from agenttest_worker.cases import Case, Located, check_case_refs, validate_case
from agenttest_worker.engine import usage_by_role
from agenttest_worker.errors import InputError, InputProblem
from agenttest_worker.report import printable
from agenttest_worker.results import AgentCallRecord, RoleUsage, UsageRole, add_usage

# Only plain decimal numerals become numbers: "007" (an id), "1e3", "nan" or "inf" (not
# JSON) stay text, so no query value is altered or turned into something a JSON
# endpoint rejects.
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)\.[0-9]+")

# The generator calls of this process's submission, until its run takes them.
_generated: dict[UsageRole, RoleUsage] = {}


def take_generation_usage() -> dict[UsageRole, RoleUsage]:
    """What the generators called since the last take cost, by role; forgotten here."""
    taken = dict(_generated)
    _generated.clear()
    return taken


def forget_generation_usage() -> None:
    """A new submission starts: what an earlier one generated without storing a run
    (a dry run, an input error) is not the new run's."""
    _generated.clear()


def _typed(value: str) -> Any:
    """Query values are text; numbers and booleans are passed as such (count=10 is 10)."""
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
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


# The pool generators are called through (with the run's reply cache); None: a plain one.
PoolMaker = Callable[[], AgentPool]


async def _generate(
    source: GeneratorInput, config: ProjectConfig, target: str | None, pool: PoolMaker | None
) -> list[Any]:
    log: list[AgentCallRecord] = []
    try:
        return (
            await (pool() if pool is not None else AgentPool(config))
            .session(log)
            .generate(
                f"{source.ref.kind}:{source.ref.id}", generator_metadata(source, config, target)
            )
        )
    finally:
        # A failed call counts too (the run is then refused, nothing is stored).
        add_usage(_generated, usage_by_role(log, config))
        await close_session()


def _warn(index: int, case_id: str | None, problems: list[InputProblem]) -> None:
    which = f"generated case {index}" + (f" ({case_id})" if case_id else "")
    for problem in problems:
        where = f"{problem.field}: " if problem.field else ""
        # The id and the message quote what the generator (an agent) wrote: escaped.
        print(
            f"warning: {printable(f'{which} left out: {where}{problem.message}')}", file=sys.stderr
        )


def generate_cases(
    source: GeneratorInput,
    config: ProjectConfig,
    target: str | None = None,
    pool: PoolMaker | None = None,
) -> Iterator[Case | InputProblem]:
    """Validated generated cases; invalid ones are reported on stderr and left out."""
    label = source.describe()
    try:
        raw_cases = run_async(_generate(source, config, target, pool))
    except AgentError as exc:
        raise InputError(InputProblem(f"generator failed: {exc.message}", file=label)) from None
    if not raw_cases:
        raise InputError(InputProblem("generator returned no cases", file=label))
    kept = 0
    seen: set[str] = set()
    for index, raw in enumerate(raw_cases, start=1):
        if isinstance(raw, dict) and "id" not in raw:
            raw = {"id": f"{source.ref.id}-{index:03d}", **raw}
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        case_id = str(raw_id) if isinstance(raw_id, str | int) else None
        items = list(validate_case(Located(raw, label, index)))
        problems = [item for item in items if isinstance(item, InputProblem)]
        cases = [item for item in items if isinstance(item, Case)]
        if problems or not cases:
            _warn(index, case_id, problems)
            continue
        case = cases[0]
        if case.id in seen:
            _warn(index, case.id, [InputProblem(f"duplicate id {case.id!r}", field="id")])
            continue
        # An agent or script the case names itself must exist; the target the user gave
        # (-n) is checked for the whole run, so its problem is not this case's.
        own = [
            p
            for p in check_case_refs(case, config, target)
            if not (p.field == "agent" and case.agent is None)
        ]
        if own:
            _warn(index, case.id, own)
            continue
        seen.add(case.id)
        kept += 1
        yield case
    if kept == 0:
        raise InputError(
            InputProblem(
                f"no generated case was valid ({len(raw_cases)} generated; see the warnings)",
                file=label,
            )
        )
