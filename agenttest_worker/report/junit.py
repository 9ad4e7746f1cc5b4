"""JUnit XML for CI systems: one testsuite for the run, one testcase per case.

The output validates against Jenkins' junit-10.xsd (the xunit plugin's; CI services read
the same shape). A case that could not be tested as written is an <error>: an agent
error or timeout (an unreachable agent among them), a judge or script assertion that
could not give a verdict, a run-level stop (every failure whose cause is
`infrastructure`, report/causes.py); a case whose checks said no is a <failure>
(failed assertions, malformed tool calls, the agent still asking past max_turns or with
on_missing_input: fail). Each testcase carries `file` and `line`, where the case is
written, so CI annotations point at it. Failed and skipped cases carry their console
tree in <system-out>, so the conversation is readable in the CI UI.

A case played K times is one testcase with its verdict (report/verdicts.py): the
message says how many repetitions passed, the body lists each failed repetition's
problems, and <system-out> the repetitions that did not pass (a flaky case that passed
under `--pass-rule any` too). It is an <error> only when every failed repetition was.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from agenttest_worker.report.causes import causes_line, in_order
from agenttest_worker.report.common import first_problem, problems
from agenttest_worker.report.console import Style, case_lines, repeated_case_lines
from agenttest_worker.report.report_model import RunReport, was_not_run
from agenttest_worker.report.target_columns import target_rows
from agenttest_worker.report.verdicts import CaseVerdict, RepeatStats, grouped
from agenttest_worker.results import CaseResult

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET

# Characters XML 1.0 forbids even escaped. Agent replies can contain them (ANSI escapes,
# NULs from broken encodings) and ElementTree would otherwise write ill-formed XML.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """`text` as XML 1.0 can hold it: characters it forbids become U+FFFD."""
    return _NOT_XML.sub("\ufffd", text)


def _seconds(value: float) -> str:
    return f"{value:.3f}"


def render(run: RunReport) -> str:
    # ElementTree is imported where a JUnit report is built: every run imports this
    # module (the format registry), few write JUnit.
    import xml.etree.ElementTree as ET

    # One pass over the records: the tally gives each case's verdict and, at the end,
    # the run's repeat statistics for the suite's properties.
    tally = run.tally()
    cases = []
    for records in grouped(run.results):
        found = tally.add_case(records)
        cases.append(
            _testcase(records[0], run) if found.repeats is None else _repeated(records, found, run)
        )
    if target_rows(tally.verdicts.cases) is not None:
        # Several targets: one testcase per case and target, the target in its name.
        for (element, _), found in zip(cases, tally.verdicts.cases, strict=True):
            named = f"{element.get('name')} @ {found.agent or '-'}"
            element.set("name", xml_text(named))
    outcomes = [outcome for _, outcome in cases]
    counts = {
        "tests": str(len(cases)),
        "failures": str(outcomes.count("failure")),
        "errors": str(outcomes.count("error")),
        "time": _seconds(run.duration_s),
    }
    # junit-10.xsd has no `skipped` on <testsuites>: the count is the testsuite's.
    root = ET.Element("testsuites", {"name": xml_text(run.title), **counts})
    suite_counts = {**counts, "skipped": str(outcomes.count("skipped"))}
    suite = ET.SubElement(root, "testsuite", {"name": xml_text(run.input_label), **suite_counts})
    _properties(suite, run, tally.verdicts.stats(), causes_line(in_order(tally.causes)))
    for element, _ in cases:
        suite.append(element)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _properties(suite: ET.Element, run: RunReport, stats: RepeatStats | None, causes: str) -> None:
    import xml.etree.ElementTree as ET

    # `causes`: failed or skipped conversations by cause (report/causes.py).
    values = {"run_id": run.run_id, "agent": run.agent, "causes": causes}
    if stats is not None:
        # The run's repeat statistics, where CI systems show a suite's properties.
        low, high = stats.interval
        values.update(
            pass_rule=stats.rule,
            repetitions=str(stats.repetitions),
            pass_rate=f"{stats.pass_rate:.4f}",
            pass_rate_ci95=f"{low:.4f}-{high:.4f}",
            pass_at_k="" if stats.pass_at_k is None else f"{stats.pass_at_k:.4f}",
            pass_hat_k="" if stats.pass_hat_k is None else f"{stats.pass_hat_k:.4f}",
            flaky=", ".join(stats.flaky),
        )
    present = {k: v for k, v in values.items() if v}
    if not present:
        return
    properties = ET.SubElement(suite, "properties")
    for name, value in present.items():
        ET.SubElement(properties, "property", name=name, value=xml_text(value))


def _element(case: CaseResult, run: RunReport, duration_ms: int) -> ET.Element:
    import xml.etree.ElementTree as ET

    name = f"[{case.id}] {case.name}" if case.name else case.id
    element = ET.Element(
        "testcase",
        name=xml_text(name),
        classname=xml_text(case.agent or run.agent or "agenttest"),
        time=_seconds(duration_ms / 1000),
    )
    if case.file is not None:
        element.set("file", xml_text(case.file))
    if case.line is not None:
        element.set("line", str(case.line))
    return element


def _repeated(
    records: list[CaseResult], found: CaseVerdict, run: RunReport
) -> tuple[ET.Element, str | None]:
    """A repeated case's one testcase (its verdict) and its outcome."""
    import xml.etree.ElementTree as ET

    element = _element(records[0], run, sum(r.duration_ms for r in records))
    said = f"{found.fraction()} repetitions passed (pass rule: {run.pass_rule})"
    failed = [r for r in records if r.status == "failed"]
    outcome: str | None = None
    if found.status == "failed":
        outcome = "error" if failed and all(_broken(r) for r in failed) else "failure"
        first = f": {first_problem(failed[0])}" if failed else ""
        problem = ET.SubElement(element, outcome, message=xml_text(said + first))
        problem.set("type", "error" if outcome == "error" else "assertion")
        problem.text = xml_text(
            "\n".join(
                f"repetition {r.repeat}/{found.played}: {'; '.join(problems(r)) or r.status}"
                for r in records
                if r.status != "passed"
            )
        )
    elif found.status == "skipped" and all(was_not_run(r) for r in records):
        outcome = "error"
        message = f"{said}: {first_problem(records[0])}"
        ET.SubElement(element, "error", message=xml_text(message), type="not_run")
    elif found.status == "skipped":
        outcome = "skipped"
        ET.SubElement(element, "skipped", message=xml_text(said))
    if found.status != "passed" or found.flaky:
        tree = repeated_case_lines(found, records, run, Style(color=False))
        ET.SubElement(element, "system-out").text = xml_text("\n".join(tree))
    return element, outcome


def _testcase(case: CaseResult, run: RunReport) -> tuple[ET.Element, str | None]:
    """The case's testcase and its outcome: "failure", "error", "skipped" or None."""
    import xml.etree.ElementTree as ET

    element = _element(case, run, case.duration_ms)
    outcome: str | None = None
    if case.status == "failed":
        outcome = "error" if _broken(case) else "failure"
        problem = ET.SubElement(element, outcome, message=xml_text(first_problem(case)))
        problem.set("type", "error" if outcome == "error" else "assertion")
        problem.text = xml_text("\n".join(problems(case)))
    elif was_not_run(case):
        # Its run stopped first (a budget, a cancellation, --fail-fast): not tested.
        outcome = "error"
        problem = ET.SubElement(element, "error", message=xml_text(first_problem(case)))
        problem.set("type", "not_run")
    elif case.status == "skipped":
        outcome = "skipped"
        ET.SubElement(element, "skipped", message=xml_text(first_problem(case)))
    if case.status != "passed":
        tree = case_lines(case, run, Style(color=False), full=True)
        ET.SubElement(element, "system-out").text = xml_text("\n".join(tree))
    return element, outcome


# Case errors that are the test's verdict on the agent (it kept asking for input), not a
# run that broke: agenttest_worker/engine/next_input.py writes them.
_VERDICTS = re.compile(r"^max turns \(\d+\) exceeded$|\(on_missing_input: fail\)$")


def _broken(case: CaseResult) -> bool:
    """Whether something kept the case from being tested as written (a JUnit error):
    an infrastructure failure always did."""
    if case.cause == "infrastructure":
        return True
    if any(turn.error for turn in case.turns):
        return True
    checked = [*(a for turn in case.turns for a in turn.assertions), *case.final_assertions]
    if any(assertion.error for assertion in checked):
        return True  # a judge or script that gave no verdict
    return case.error is not None and not _VERDICTS.search(case.error)
