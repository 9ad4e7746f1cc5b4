"""Checks a case needs beyond its own schema: the agents and scripts it names must exist.

Run before anything is enqueued, so an unknown agent name is an input error (exit 2)
naming the file, line and field, not a failure discovered by a worker an hour later.
"""

from __future__ import annotations

from collections.abc import Iterator

from agenttest_worker.agents.config import ProjectConfig
from agenttest_worker.agents.refs import parse_ref
from agenttest_worker.agents.script_loader import ScriptError, ScriptRole, resolve_script
from agenttest_worker.assertions import (
    AgentAssertion,
    Assertion,
    AssertionSpec,
    GoldenAssertion,
    ScriptAssertion,
)
from agenttest_worker.assertions.checking import walk
from agenttest_worker.cases.case_model import Case
from agenttest_worker.errors import FieldPath, InputProblem


def check_ref(config: ProjectConfig, ref_text: str, role: ScriptRole) -> str | None:
    """None when `agents:X` / `scripts:X` resolves, else the message saying why not."""
    try:
        ref = parse_ref(ref_text, default_kind="agents")
    except ValueError as exc:
        return str(exc)
    if ref.kind == "agents":
        return None if ref.id in config.agents else config.unknown_agent_message(ref.id)
    try:
        resolve_script(config.scripts_path, ref.id, role)
    except ScriptError as exc:
        return str(exc)
    return None


def check_case_refs(
    case: Case, config: ProjectConfig, target: str | None
) -> Iterator[InputProblem]:
    agent = case.agent or target
    if agent is None:
        yield case.problem("no target agent: pass -n NAME or set `agent` on the case", ("agent",))
    elif agent not in config.agents:
        yield case.problem(config.unknown_agent_message(agent), ("agent",))
    if case.simulator is not None:
        use = case.simulator.use or config.defaults.simulator
        if use is None:
            yield case.problem(
                "no simulator named: set simulator.use, or defaults.simulator in agenttest.yaml",
                ("simulator", "use"),
            )
        elif msg := check_ref(config, use, "simulator"):
            yield case.problem(msg, ("simulator", "use"))
    groups: list[tuple[FieldPath, list[Assertion]]] = [
        (("turns", i, "assertions"), t.assertions) for i, t in enumerate(case.turns)
    ]
    groups.append((("final_assertions",), case.final_assertions))
    for prefix, assertions in groups:
        for j, outer in enumerate(assertions):
            for path, assertion in walk(outer, (*prefix, j)):
                yield from _assertion_refs(case, config, assertion, (*path, "use"))
                if assertion.type == "turn_count" and prefix != ("final_assertions",):
                    yield case.problem(
                        "turn_count counts the conversation's turns: put it in final_assertions",
                        (*path, "type"),
                    )
                if assertion.type == "golden" and path != ("final_assertions", j):
                    yield case.problem(
                        "golden compares the whole conversation: put it in final_assertions "
                        "(not in a turn's assertions or a group)",
                        (*path, "type"),
                    )


def _assertion_refs(
    case: Case, config: ProjectConfig, assertion: AssertionSpec, path: FieldPath
) -> Iterator[InputProblem]:
    if isinstance(assertion, AgentAssertion):
        if assertion.use is None:
            if config.defaults.judge is None:
                yield case.problem(
                    "criteria need a judge: set defaults.judge in agenttest.yaml", path
                )
        elif isinstance(assertion.use, str):
            if msg := check_ref(config, assertion.use, "assertion"):
                yield case.problem(msg, path)
        else:  # a panel: each judge of it, at its place in the list
            for k, judge in enumerate(assertion.use):
                if msg := check_ref(config, judge, "assertion"):
                    yield case.problem(msg, (*path, k))
    elif isinstance(assertion, GoldenAssertion) and assertion.match == "judge":
        if assertion.use is None and config.defaults.judge is None:
            yield case.problem(
                "golden's match: judge needs a judge: set `use`, or defaults.judge in "
                "agenttest.yaml",
                path,
            )
        elif assertion.use is not None and (msg := check_ref(config, assertion.use, "assertion")):
            yield case.problem(msg, path)
    elif isinstance(assertion, ScriptAssertion) and (
        msg := check_ref(config, assertion.use, "assertion")
    ):
        yield case.problem(msg, path)
