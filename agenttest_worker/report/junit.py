"""JUnit XML for CI systems: one testsuite for the run, one testcase per case.

The output validates against Jenkins' junit-10.xsd (the xunit plugin's; CI services read
the same shape). A case that could not be tested as written is an <error>: an agent
error or timeout (an unreachable agent among them), a judge or script assertion that
could not give a verdict, a run-level stop; a case whose checks said no is a <failure>
(failed assertions, malformed tool calls, the agent still asking past max_turns or with
on_missing_input: fail). Each testcase carries `file` and `line`, where the case is
written, so CI annotations point at it. Failed and skipped cases carry their console
tree in <system-out>, so the conversation is readable in the CI UI.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from agenttest_worker.report.common import first_problem, problems
from agenttest_worker.report.console import Style, case_lines
from agenttest_worker.report.model import RunReport
from agenttest_worker.results import CaseResult

# Characters XML 1.0 forbids even escaped. Agent replies can contain them (ANSI escapes,
# NULs from broken encodings) and ElementTree would otherwise write ill-formed XML.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _seconds(value: float) -> str:
    return f"{value:.3f}"


def render(run: RunReport) -> str:
    cases = [_testcase(case, run) for case in run.results]
    outcomes = [outcome for _, outcome in cases]
    counts = {
        "tests": str(len(cases)),
        "failures": str(outcomes.count("failure")),
        "errors": str(outcomes.count("error")),
        "time": _seconds(run.duration_s),
    }
    # junit-10.xsd has no `skipped` on <testsuites>: the count is the testsuite's.
    root = ET.Element("testsuites", {"name": _xml_text(run.title), **counts})
    suite_counts = {**counts, "skipped": str(outcomes.count("skipped"))}
    suite = ET.SubElement(root, "testsuite", {"name": _xml_text(run.input_label), **suite_counts})
    _properties(suite, run)
    for element, _ in cases:
        suite.append(element)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _properties(suite: ET.Element, run: RunReport) -> None:
    values = {"run_id": run.run_id, "agent": run.agent}
    present = {k: v for k, v in values.items() if v}
    if not present:
        return
    properties = ET.SubElement(suite, "properties")
    for name, value in present.items():
        ET.SubElement(properties, "property", name=name, value=_xml_text(value))


def _testcase(case: CaseResult, run: RunReport) -> tuple[ET.Element, str | None]:
    """The case's testcase and its outcome: "failure", "error", "skipped" or None."""
    name = f"[{case.id}] {case.name}" if case.name else case.id
    element = ET.Element(
        "testcase",
        name=_xml_text(name),
        classname=_xml_text(case.agent or run.agent or "agenttest"),
        time=_seconds(case.duration_ms / 1000),
    )
    if case.file is not None:
        element.set("file", _xml_text(case.file))
    if case.line is not None:
        element.set("line", str(case.line))
    outcome: str | None = None
    if case.status == "failed":
        outcome = "error" if _broken(case) else "failure"
        problem = ET.SubElement(element, outcome, message=_xml_text(first_problem(case)))
        problem.set("type", "error" if outcome == "error" else "assertion")
        problem.text = _xml_text("\n".join(problems(case)))
    elif case.status == "skipped":
        outcome = "skipped"
        ET.SubElement(element, "skipped", message=_xml_text(first_problem(case)))
    if case.status != "passed":
        tree = case_lines(case, run, Style(color=False), full=True)
        ET.SubElement(element, "system-out").text = _xml_text("\n".join(tree))
    return element, outcome


# Case errors that are the test's verdict on the agent (it kept asking for input), not a
# run that broke: agenttest_worker/engine/next_input.py writes them.
_VERDICTS = re.compile(r"^max turns \(\d+\) exceeded$|\(on_missing_input: fail\)$")


def _broken(case: CaseResult) -> bool:
    """Whether something kept the case from being tested as written (a JUnit error)."""
    if any(turn.error for turn in case.turns):
        return True
    checked = [*(a for turn in case.turns for a in turn.assertions), *case.final_assertions]
    if any(assertion.error for assertion in checked):
        return True  # a judge or script that gave no verdict
    return case.error is not None and not _VERDICTS.search(case.error)
