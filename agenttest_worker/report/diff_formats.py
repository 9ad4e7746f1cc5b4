"""A run diff (report/diff.py) as text: console, json, markdown (a PR or chat comment),
junit (a CI gate). Case ids, names, replies and reasons are data: escaped for the
terminal, for Markdown (no HTML, no links, no formatting gets through) and for XML."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable

from agenttest_worker.report.causes import causes_line
from agenttest_worker.report.common import one_line, printable, quoted
from agenttest_worker.report.diff import (
    CATEGORIES,
    CHANGED_BECAUSE,
    TITLES,
    CaseChange,
    RunDiff,
    RunInfo,
)
from agenttest_worker.report.junit import xml_text

DIFF_FORMATS = ("console", "json", "markdown", "junit")
# Cases listed per category in console and Markdown (all of them in json and junit);
# still-passing cases are counted, not listed.
LISTED = 50
LIKELY_BECAUSE = "its verdict fell, but not significantly: repeat it (--repeat) to know"
_MARKS = {
    "regression": "✗",
    "likely_regression": "?",
    "fixed": "✓",
    "flaky": "~",
    "changed": "*",
    "new": "+",
    "removed": "-",
}


def render_diff(diff: RunDiff, fmt: str) -> str:
    renderers: dict[str, Callable[[RunDiff], str]] = {
        "console": console,
        "json": as_json,
        "markdown": markdown,
        "junit": junit,
    }
    return renderers[fmt](diff)


def _when(run: RunInfo) -> str:
    return run.created_at.strftime("%Y-%m-%d %H:%M") if run.created_at else "?"


def _counts_line(diff: RunDiff) -> str:
    counts = diff.counts()
    return "   ".join(f"{TITLES[c]}: {counts[c]}" for c in CATEGORIES)


def _gate_lines(diff: RunDiff) -> list[str]:
    """How the diff weighed pass rates, and why the new run's cases failed."""
    lines = []
    if diff.confidence is not None:
        pooled = (
            f", the baseline pooled over the suite's last {diff.history_window} runs"
            if diff.history_window
            else ""
        )
        lines.append(
            f"Regressions: significant drops only (one-sided Fisher exact test at "
            f"{diff.confidence:.0%} confidence{pooled})"
        )
    if caused := causes_line(diff.causes):
        lines.append(f"Failing now, by cause: {caused}")
    return lines


def _against(diff: RunDiff, shown: Callable[[str], str], lead: str = "Diff of run") -> str:
    """What the diff compares: two runs, or two targets of one run."""
    if diff.targets is not None:
        then, now = diff.targets
        return (
            f"Diff of target {shown(now)} against target {shown(then)} in run "
            f"{shown(diff.new.id)} ({_when(diff.new)})"
        )
    return (
        f"{lead} {shown(diff.new.id)} ({_when(diff.new)}) against "
        f"{shown(diff.base.id)} ({_when(diff.base)})"
    )


def console(diff: RunDiff) -> str:
    lines = [
        _against(diff, printable),
        f"Suite: {printable(diff.new.suite or '(none)')}",
        f"  {_counts_line(diff)}",
        *(f"  {line}" for line in _gate_lines(diff)),
    ]
    for kind in CATEGORIES:
        if kind == "still_passing":
            continue
        changes = diff.of(kind)
        if not changes:
            continue
        lines += ["", f"{TITLES[kind]} ({len(changes)})"]
        for change in changes[:LISTED]:
            lines += _console_case(change)
        if len(changes) > LISTED:
            lines.append(f"  ... and {len(changes) - LISTED} more (--format json lists all)")
    return "\n".join(lines) + "\n"


def _details(
    change: CaseChange, text: Callable[[str], str], said: Callable[[str], str]
) -> list[str]:
    """What a case's entry says under its line: why it is flaky, where a regression's
    conversations first differ; `text` and `said` escape the data for the format."""
    lines = [text(change.flaky_because)] if change.flaky_because else []
    if change.category == "changed":
        lines.append(text(CHANGED_BECAUSE))
    if change.rates is not None:
        lines.append(text(change.rates.text()))
        if change.category == "likely_regression":
            lines.append(text(LIKELY_BECAUSE))
    if change.cause is not None:
        lines.append(f"cause: {text(change.cause)}")
    found = change.difference
    if found is None:
        return lines
    where = f"turn {found.turn}" if found.turn is not None else "final assertions"
    if not found.assertion:
        lines.append(where)
    elif found.new_assertion:
        lines.append(f"{where}: {text(found.assertion)} is new or changed, and fails")
    else:
        lines.append(f"{where}: {text(found.assertion)} passed then, fails now")
    if found.reason:
        lines.append(f"now: {text(found.reason)}")
    if found.said_then is not None:
        lines.append(f"agent then: {said(found.said_then)}")
    if found.said_now is not None:
        lines.append(f"agent now: {said(found.said_now)}")
    return lines


def _console_case(change: CaseChange) -> list[str]:
    mark = _MARKS.get(change.category, " ")
    name = f" {printable(change.name)}" if change.name and change.name != change.id else ""
    was = f" ({change.base or 'absent'} → {change.new or 'absent'})"
    details = _details(change, one_line, quoted)
    return [f"  {mark} {printable(change.id)}{name}{was}", *(f"      {d}" for d in details)]


def as_json(diff: RunDiff) -> str:
    return json.dumps(diff.as_dict(), indent=2, ensure_ascii=False) + "\n"


# Characters Markdown (or the HTML it may carry) gives a meaning: escaped with a
# backslash, or as entities for the HTML ones, so that data shows as written.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def md(text: str) -> str:
    """`text` as literal Markdown text on one line."""
    flat = " ".join(printable(text).split())
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", flat)


def markdown(diff: RunDiff) -> str:
    counts = diff.counts()
    lines = [
        f"### agenttest: {md(diff.new.suite or 'run')} — "
        f"{counts['regression']} newly failing, {counts['fixed']} fixed",
        "",
        _against(diff, lambda text: f"`{_code(text)}`", "Run") + ".",
        "",
        *(f"{md(line)}\n" for line in _gate_lines(diff)),
        "| " + " | ".join(TITLES[c] for c in CATEGORIES) + " |",
        "|" + "---:|" * len(CATEGORIES),
        "| " + " | ".join(str(counts[c]) for c in CATEGORIES) + " |",
    ]
    for kind in CATEGORIES:
        if kind == "still_passing":
            continue
        changes = diff.of(kind)
        if not changes:
            continue
        lines += ["", f"#### {TITLES[kind]} ({len(changes)})", ""]
        for change in changes[:LISTED]:
            lines += _md_case(change)
        if len(changes) > LISTED:
            lines.append(f"- … and {len(changes) - LISTED} more")
    return "\n".join(lines) + "\n"


def _code(text: str) -> str:
    # Inside a code span only a backquote matters: none can close it.
    return printable(text).replace("`", "'")


def _md_case(change: CaseChange) -> list[str]:
    name = f" — {md(change.name)}" if change.name and change.name != change.id else ""
    head = f"- **{md(change.id)}**{name} ({change.base or 'absent'} → {change.new or 'absent'})"
    return [head, *(f"  - {d}" for d in _details(change, md, md))]


def junit_outcome(change: CaseChange) -> tuple[str, str] | None:
    """A case's one outcome in a diff's JUnit: ("failure", why) for a regression,
    ("skipped", why) for a known failure, a flaky case, a new or changed case that fails;
    None when it passes."""
    if change.category == "regression" and change.cause == "infrastructure":
        return "error", "passed in the baseline, fails now: the infrastructure failed it"
    if change.category == "regression":
        return "failure", "passed in the baseline, fails now"
    if change.category == "likely_regression":
        return "skipped", LIKELY_BECAUSE
    if change.category == "flaky":
        return "skipped", change.flaky_because or "flaky"
    if change.category == "still_failing":
        return "skipped", "known failure: failed in the baseline too"
    if change.new == "failed":
        what = "changed case" if change.category == "changed" else "new case"
        return "skipped", f"{what}, failing"
    return None


def junit(diff: RunDiff) -> str:
    """One testcase per case of the new run, counted once: a regression is a failure;
    known failures, flaky cases and new or changed cases that fail are skipped with the
    reason; the rest pass. Each testcase has the case's `time`, `file` and `line` when
    the diff carries them, as the run's JUnit does."""
    cases = [c for c in diff.changes if c.category != "removed"]
    outcomes = [junit_outcome(c) for c in cases]
    kinds = [o[0] if o else None for o in outcomes]
    total = sum(c.duration_ms or 0 for c in cases)
    counts = {
        "tests": str(len(cases)),
        "failures": str(kinds.count("failure")),
        "errors": str(kinds.count("error")),
        "time": _seconds(total),
    }
    root = ET.Element("testsuites", {"name": "agenttest diff", **counts})
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": xml_text(diff.new.suite or diff.new.id),
            **counts,
            "skipped": str(kinds.count("skipped")),
        },
    )
    properties = ET.SubElement(suite, "properties")
    compared: tuple[tuple[str, str], ...] = (
        ("run_id", diff.new.id),
        ("baseline_run_id", diff.base.id),
    )
    if diff.targets is not None:
        compared = (*compared, ("baseline_target", diff.targets[0]), ("target", diff.targets[1]))
    for key, value in compared:
        ET.SubElement(properties, "property", name=key, value=xml_text(value))
    for change, outcome in zip(cases, outcomes, strict=True):
        element = ET.SubElement(suite, "testcase", name=xml_text(change.id), classname="agenttest")
        element.set("time", _seconds(change.duration_ms or 0))
        if change.file is not None:
            element.set("file", xml_text(change.file))
        if change.line is not None:
            element.set("line", str(change.line))
        if outcome is None:
            continue
        kind, why = outcome
        if kind in ("failure", "error"):
            failure = ET.SubElement(element, kind, message=why, type="regression")
            failure.text = xml_text("\n".join(_details(change, str, str))) or None
        else:
            ET.SubElement(element, "skipped", message=xml_text(why))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _seconds(duration_ms: int) -> str:
    return f"{duration_ms / 1000:.3f}"
