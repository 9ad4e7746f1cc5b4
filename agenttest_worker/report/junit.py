"""JUnit XML for CI systems: one testsuite for the run, one testcase per case.

Every case failure is a <failure> (assertions and agent errors alike): CI dashboards
treat both as a red test, and the text says which it was. Failed and skipped cases
carry their console tree in <system-out>, so the conversation is readable in the CI UI.
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
    summary = run.summary()
    counts = {
        "tests": str(summary.total),
        "failures": str(summary.failed),
        "errors": "0",
        "skipped": str(summary.skipped),
        "time": _seconds(run.duration_s),
    }
    root = ET.Element("testsuites", {"name": _xml_text(run.title), **counts})
    suite = ET.SubElement(root, "testsuite", {"name": _xml_text(run.input_label), **counts})
    _properties(suite, run)
    for case in run.results:
        suite.append(_testcase(case, run))
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


def _testcase(case: CaseResult, run: RunReport) -> ET.Element:
    name = f"[{case.id}] {case.name}" if case.name else case.id
    element = ET.Element(
        "testcase",
        name=_xml_text(name),
        classname=_xml_text(case.agent or run.agent or "agenttest"),
        time=_seconds(case.duration_ms / 1000),
    )
    if case.status == "failed":
        failure = ET.SubElement(element, "failure", message=_xml_text(first_problem(case)))
        failure.set("type", "error" if _has_error(case) else "assertion")
        failure.text = _xml_text("\n".join(problems(case)))
    elif case.status == "skipped":
        ET.SubElement(element, "skipped", message=_xml_text(first_problem(case)))
    if case.status != "passed":
        tree = case_lines(case, run, Style(color=False), full=True)
        ET.SubElement(element, "system-out").text = _xml_text("\n".join(tree))
    return element


def _has_error(case: CaseResult) -> bool:
    return bool(case.error) or any(turn.error for turn in case.turns)
