"""What is checked of each case once it is read, whatever else is in the input.

A case read without problems is selected (--tag, --id, a rerun's ids), given its simulator, checked
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


@dataclass(frozen=True)
class RerunIds:
    """The cases a rerun takes from the inputs (--rerun-failed, --rerun-skipped): the ids
    of those that failed or were skipped in the run `run_id`, in that run's order."""

    run_id: str
    ids: tuple[str, ...]
    # What was asked for, as said to the user: "failed", "skipped", "failed or skipped".
    what: str
    flag: str  # the flag given, for warnings
    wanted: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "wanted", frozenset(self.ids))

    def nothing_to_run(self) -> str:
        """Why a rerun selected no case (it then runs nothing and exits 0)."""
        if not self.ids:
            return f"nothing to rerun: run {self.run_id} has no {self.what} case"
        return (
            f"nothing to rerun: none of the {self.what} cases of run {self.run_id} is among "
            "the cases selected from the inputs"
        )


@dataclass
class Selection:
    """What the user asked to run of the cases found (--tag, --id, a rerun's ids)."""

    tags: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    rerun: RerunIds | None = None

    def wants(self, case: Case) -> bool:
        if self.ids and case.id not in self.ids:
            return False
        if self.rerun is not None and case.id not in self.rerun.wanted:
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
