"""Turn `-i` inputs into validated cases, collecting every problem before anything runs."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agenttest_submit.inputs import FileInput, GeneratorInput, InputSource, MessageInput
from agenttest_worker.agents.registry import ProjectConfig
from agenttest_worker.attachments import inline_attachments
from agenttest_worker.case_checks import check_case_refs
from agenttest_worker.case_files import case_files_in, iter_cases
from agenttest_worker.cases import Case
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
class Expansion:
    cases: list[Case]
    warnings: list[str]


def message_case(text: str) -> Case:
    """A direct `-i "message"`: one single-turn case with no assertions."""
    name = text if len(text) <= 60 else text[:59] + "…"
    return Case(id="message", name=name, input=text)


def iter_source(
    source: InputSource, config: ProjectConfig, target: str | None = None
) -> Iterator[Case | InputProblem]:
    if isinstance(source, FileInput):
        for file in case_files_in(source.path):
            yield from iter_cases(file)
    elif isinstance(source, MessageInput):
        yield message_case(source.text)
    elif isinstance(source, GeneratorInput):
        from agenttest_submit.generate import generate_cases

        yield from generate_cases(source, config, target)


def expand(
    sources: Iterable[InputSource],
    config: ProjectConfig,
    *,
    target: str | None,
    simulator: str | None = None,
    selection: Selection | None = None,
) -> Expansion:
    """Load, check and select cases; raises InputError listing every problem found."""
    problems: list[InputProblem] = []
    cases: list[Case] = []
    warnings: list[str] = []
    seen: dict[str, Case] = {}
    selection = selection or Selection()
    for source in sources:
        try:
            items = list(iter_source(source, config, target))
        except InputError as exc:
            problems.extend(exc.problems)
            continue
        for item in items:
            if isinstance(item, InputProblem):
                problems.append(item)
                continue
            case = item
            if case.id in seen:
                first = seen[case.id]
                where = f"{first.source_file}:{first.source_line}" if first.source_file else "input"
                problems.append(
                    InputProblem(
                        f"duplicate id {case.id!r} (first defined at {where})",
                        file=case.source_file,
                        line=case.source_line,
                        field="id",
                    )
                )
                continue
            seen[case.id] = case
            if not selection.wants(case):
                continue
            if simulator is not None:
                case = case.with_default_simulator(simulator)
            problems.extend(check_case_refs(case, config, target))
            warnings.extend(_connector_warnings(case, config))
            try:
                case = inline_attachments(case)
            except InputError as exc:
                problems.extend(exc.problems)
                continue
            cases.append(case)
    if problems:
        raise InputError(problems)
    if not cases and (selection.tags or selection.ids):
        raise InputError(InputProblem("no case matches the --tag/--id selection"))
    if not cases:
        # An empty (or truncated) case file would otherwise "pass" in CI with 0 tests.
        raise InputError(InputProblem("no test cases in the input", field="-i"))
    return Expansion(cases, warnings)


def _connector_warnings(case: Case, config: ProjectConfig) -> Iterator[str]:
    layers = [case.options, *(t.options for t in case.turns)]
    for options in layers:
        if options is not None and options.connector and options.connector not in config.agents:
            yield (
                f"case {case.id}: connector {options.connector!r} is not an agent in "
                "agenttest.yaml; the case's own target is used"
            )


def print_warnings(warnings: list[str]) -> None:
    for warning in dict.fromkeys(warnings):
        print(f"warning: {warning}", file=sys.stderr)


def resolve_path(text: str) -> Path:
    return Path(text).expanduser()
