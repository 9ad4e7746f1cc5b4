"""What the conversation pages render, built from a run's records.

A record travels as its JSONL object (the page renders any field it carries, fields
added later included) next to `record_notes`: what the console computes with
report/common.py and a page could not, such as each assertion's label, the source
marker of each turn ("[Initial]", "[Simulated]", ...), and for a turn skipped for want
of input what the agent asked. A case (a repeated one's records together) is one row of
the case table (`case_row`); `RunData` gathers the rows, the summary and the usage by
role while the records stream past once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from agenttest_worker.engine.state import MISSING_INPUT_HINT
from agenttest_worker.report.common import (
    asked_question,
    describe_assertion,
    first_problem,
    js_value,
)
from agenttest_worker.report.diff import CATEGORIES, TITLES
from agenttest_worker.report.golden_view import golden_rows, page_rows
from agenttest_worker.report.report_model import RunReport, Tally
from agenttest_worker.report.target_columns import target_rows, targets_of
from agenttest_worker.report.usage_tally import usage_dict
from agenttest_worker.report.verdicts import CaseVerdict
from agenttest_worker.report.wording import worded_label
from agenttest_worker.results import AssertionResult, CaseResult, TurnResult

# The table's order: what needs reading first.
STATUS_ORDER = {"failed": 0, "skipped": 1, "passed": 2}
# As the console says them (report/console.py): how a dynamic case's turn got its input.
MARKERS = {"static": "[Static]", "simulator": "[Simulated]", "interactive": "[Interactive]"}
FIRST_STATIC = "[Initial]"


def script_json(value: Any) -> str:
    """`value` as JSON text that is safe inside a `<script type="application/json">`:
    every "<" is written \\u003c, so no "</script>" or "<!--" in the data can end or
    change the element (JSON.parse reads the same text back)."""
    return script_text(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def script_text(json_text: str) -> str:
    # "<" appears in JSON only inside strings, where \u003c means the same character.
    return json_text.replace("<", "\\u003c")


def record_notes(case: CaseResult, simulated: bool = False) -> dict[str, Any]:
    """What a page shows of `case` beyond its fields (empty parts left out)."""
    sources = {turn.input_source for turn in case.turns}
    simulated = simulated or case.simulator is not None or "simulator" in sources
    dynamic = simulated or "interactive" in sources
    notes: dict[str, Any] = {}
    markers = [_marker(turn) if dynamic else "" for turn in case.turns]
    if any(markers):
        notes["markers"] = markers
    labels = [[page_label(a) for a in turn.assertions] for turn in case.turns]
    if any(labels):
        notes["labels"] = labels
    if case.final_assertions:
        notes["final_labels"] = [page_label(a) for a in case.final_assertions]
        golden = [
            {"label": describe_assertion(a), "rows": page_rows(rows)}
            for a in case.final_assertions
            if (rows := golden_rows(a, case))
        ]
        if golden:
            notes["golden"] = golden
    skips, end_skip = _skips(case, simulated)
    if skips:
        notes["skips"] = skips
    if end_skip:
        notes["end_skip"] = end_skip
    calls = [_tool_calls(turn) for turn in case.turns]
    if any(calls):
        notes["calls"] = calls
    return notes


def page_label(assertion: AssertionResult) -> str:
    """The console's label of an assertion (`not_contains "x"`) with its type in words
    (`does not contain "x"`): a page says what was checked, not the case file's code."""
    return worded_label(describe_assertion(assertion))


def _marker(turn: TurnResult) -> str:
    if turn.input is None:
        return ""
    if turn.turn == 1 and turn.input_source == "static":
        return FIRST_STATIC
    return MARKERS.get(turn.input_source or "", "")


def _tool_calls(turn: TurnResult) -> list[str]:
    # The spec's way of writing a call, `create_expense({amount: 3500})`, in full: the
    # page shows it whole, where the console cuts it to a line.
    return [
        f"{call.name}({call.args if isinstance(call.args, str) else js_value(call.args)})"
        for call in turn.tool_calls
    ]


def _skips(case: CaseResult, simulated: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Turns skipped for want of input (by index in `turns`), and the skip recorded only
    on the case, shown after its last turn: as the console's case tree places them."""
    skips: dict[str, Any] = {}
    previous: TurnResult | None = None
    for index, turn in enumerate(case.turns):
        if turn.status == "skipped" and turn.input is None:
            reason = turn.skip_reason or case.skip_reason
            skips[str(index)] = _skip(turn.turn, reason, previous, simulated)
        else:
            previous = turn
    end = None
    if case.status == "skipped" and not skips and case.skip_reason:
        number = case.turns[-1].turn + 1 if case.turns else 1
        end = _skip(number, case.skip_reason, previous, simulated)
    return skips, end


def _skip(
    number: int, reason: str | None, previous: TurnResult | None, simulated: bool
) -> dict[str, Any]:
    found: dict[str, Any] = {"turn": number, "reason": reason or "no input available"}
    if previous is not None and previous.awaiting_input:
        asked = asked_question(previous)
        if asked:
            found["asked"] = asked
        if previous.input_hint:
            found["hint"] = previous.input_hint
        # A simulator case that skips had a simulator failure: more turns are not the fix.
        if not simulated:
            found["advice"] = f"Hint: {MISSING_INPUT_HINT}"
    return found


def case_row(records: Sequence[CaseResult], found: CaseVerdict) -> dict[str, Any]:
    """One case's row of the table: what it is, how it ended, the first thing wrong."""
    first = records[0]
    failing = next((r for r in records if r.status != "passed"), None)
    row: dict[str, Any] = {
        "id": first.id,
        "name": first.name,
        "status": found.status,
        "tags": first.tags or [],
        "turns": sum(r.total_turns for r in records),
        "ms": sum(r.duration_ms for r in records),
        "problem": first_problem(failing, page_label) if failing is not None else "",
    }
    if found.repeated:
        row.update(repeated=True, passed=found.passed, played=found.played, flaky=found.flaky)
    # What the table filters by: the agent, why it failed (why its first failed or
    # skipped conversation did), and the kinds of checks it ran.
    row["agent"] = first.agent or ""
    if failing is not None and failing.cause is not None:
        row["cause"] = failing.cause
    row["checks"] = sorted(
        {a.type for r in records for t in r.turns for a in t.assertions}
        | {a.type for r in records for a in r.final_assertions}
    )
    return row


def search_text(records: Sequence[CaseResult]) -> str:
    """The text a search looks in, lower-cased: the case's id, name and tags, every
    input, reply, tool call, assertion reason and error (app.js searches the same in a report)."""
    parts: list[str] = []
    for record in records:
        parts += [record.id, record.name or "", *(record.tags or [])]
        parts += [record.error or "", record.skip_reason or ""]
        for turn in record.turns:
            parts += [turn.input or "", turn.output or "", turn.error or "", turn.skip_reason or ""]
            for call in turn.tool_calls:
                parts += [call.name, json.dumps(call.args, ensure_ascii=False, default=str)]
            parts += [a.reason for a in turn.assertions]
        parts += [a.reason for a in record.final_assertions]
    return "\n".join(parts).lower()


def diff_words() -> dict[str, Any]:
    """What a page needs beside a diff's JSON: each category's title, in their order."""
    return {"titles": dict(TITLES), "order": list(CATEGORIES)}


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """By status (failed, skipped, passed), then id."""
    return sorted(rows, key=lambda r: (STATUS_ORDER.get(r["status"], 3), r["id"]))


class RunData:
    """The case rows, the summary and the usage of a run, gathered as its records are
    read once (a large run's records are never held)."""

    def __init__(self, run: RunReport) -> None:
        self.run = run
        self.tally: Tally = run.tally()
        self.rows: list[dict[str, Any]] = []
        self.tokens = 0
        self.records = 0

    def add(self, records: list[CaseResult], first: int) -> None:
        """A case's records, `first` being the first one's index among all records."""
        row = case_row(records, self.tally.add_case(records))
        row["first"], row["count"] = first, len(records)
        self.rows.append(row)
        self.records += len(records)
        self.tokens += sum(r.usage.total_tokens for r in records if r.usage)

    def header(self, **more: Any) -> dict[str, Any]:
        """The run's header and summary, once every record was added."""
        run = self.run
        summary = self.tally.summary(run.duration_s, run.budget)
        counted = summary.as_dict()
        counted["pass_rate"] = round(summary.passed / summary.total, 4) if summary.total else None
        found: dict[str, Any] = {
            "title": run.title,
            "run_id": run.run_id,
            "agent": run.agent,
            "input_label": run.input_label,
            "total_cases": run.total_cases,
            "distinct_cases": run.distinct_cases,
            "pass_rule": run.pass_rule,
            "summary": counted,
            "tokens": self.tokens,
            # By role, in the summary's order (report/usage_tally.py), the run's own included.
            "usage": usage_dict(summary.usage),
            "budget": summary.budget.line() if summary.budget else None,
            "repeat_lines": summary.repeats.lines() if summary.repeats else [],
            "flaky": summary.repeats.flaky if summary.repeats else [],
            "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "statuses": {s: sum(1 for r in self.rows if r["status"] == s) for s in STATUS_ORDER},
            "tags": sorted({tag for row in self.rows for tag in row["tags"]}),
            # The choices of the table's other filters.
            "agents": sorted({row["agent"] for row in self.rows if row["agent"]}),
            "causes": sorted({row["cause"] for row in self.rows if row.get("cause")}),
            # A run of several targets (-n A -n B): their names, in the order played.
            "targets": targets_of(rows) if (rows := target_rows(self.tally.verdicts.cases)) else [],
            "checks": sorted({kind for row in self.rows for kind in row["checks"]}),
        }
        found.update(more)
        return found
