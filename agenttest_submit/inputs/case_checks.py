"""What is checked of each case once it is read, whatever else is in the input.

A case read without problems is selected (--tag, --id), given its simulator, checked
against agenttest.yaml and warned about, and its attachments and golden conversation
are read in. None of it
depends on the other cases; what does (duplicate ids) stays in `expand.CaseStream`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from agenttest_submit.inputs.golden_inputs import GoldenUse, with_golden
from agenttest_worker.agents import ProjectConfig
from agenttest_worker.assertions import AgentAssertion
from agenttest_worker.cases import Case, check_case_refs, inline_attachments
from agenttest_worker.errors import InputError, InputProblem


@dataclass
class Selection:
    """What the user asked to run of the cases found (--tag, --id)."""

    tags: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)

    def wants(self, case: Case) -> bool:
        if self.ids and case.id not in self.ids:
            return False
        return not self.tags or bool(set(self.tags) & set(case.tags))


@dataclass
class CaseChecker:
    """The checks of one case that has an id of its own (see the module's note)."""

    config: ProjectConfig
    target: str | None
    simulator: str | None
    selection: Selection
    golden: GoldenUse = field(default_factory=GoldenUse)

    def check(self, case: Case, problems: list[InputProblem], warnings: list[str]) -> Case | None:
        """The case as it runs, or None when it is not selected or has problems (added to
        `problems`; what is allowed but probably not meant, to `warnings`)."""
        if not self.selection.wants(case):
            return None
        if self.simulator is not None:
            case = case.with_default_simulator(self.simulator)
        case = case.with_simulator_named(self.config.defaults.simulator)
        try:
            # Before the checks: the golden assertion --golden adds is checked too.
            case = with_golden(case, self.golden)
        except InputError as exc:
            problems.extend(exc.problems)
            return None
        found = list(check_case_refs(case, self.config, self.target))
        problems.extend(found)
        warnings.extend(case_warnings(case, self.config))
        try:
            case = inline_attachments(case)
        except InputError as exc:
            problems.extend(exc.problems)
            return None
        return None if found else case


def case_warnings(case: Case, config: ProjectConfig) -> Iterator[str]:
    """What is allowed but probably not meant: it runs, differently than it reads."""
    layers = [case.options, *(t.options for t in case.turns)]
    for options in layers:
        if options is not None and options.connector and options.connector not in config.agents:
            yield (
                f"case {case.id}: connector {options.connector!r} is not an agent in "
                "agenttest.yaml; the case's own target is used"
            )
    for assertion in case.iter_assertions():
        options = assertion.options if isinstance(assertion, AgentAssertion) else None
        if options is not None and options.connector and options.connector not in config.agents:
            yield (
                f"case {case.id}: judge connector {options.connector!r} is not an agent in "
                "agenttest.yaml; the judge's own agent is called"
            )
