"""The console report, laid out exactly as the spec's "Console Output".

Where the spec's example leaves a rule implicit, these hold:
- A case line shows "(N turns)", or "(simulator: NAME)" for simulator-driven cases, and no
  count for skipped cases (their conversation stopped early, so a count would mislead).
- Without -v, passed cases show only their line and "└─ Result: PASSED"; failed and
  skipped cases always show every turn, since that is what the reader has to act on.
- In simulator-driven cases the agent's replies are shown only for turns with assertions
  or failures: long simulated conversations stay one line per turn, as in the spec's T003.
- Failed and skipped cases end with "└─ Result: FAILED|SKIPPED" and the case's error or
  reason, after their final assertions if they have any.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

from agenttest_worker.engine.state import MISSING_INPUT_HINT
from agenttest_worker.report.causes import causes_line
from agenttest_worker.report.common import (
    asked_question,
    counted,
    counted_cases,
    describe_assertion,
    describe_tool_call,
    executed_turns,
    failure_reason,
    format_ms,
    format_seconds,
    one_line,
    printable,
    quoted,
)
from agenttest_worker.report.golden_view import console_lines, golden_rows
from agenttest_worker.report.judges import judges_line
from agenttest_worker.report.report_model import RunReport, Summary
from agenttest_worker.report.target_columns import (
    TargetRow,
    against_first,
    by_case,
    target_counts,
    target_rows,
    targets_of,
)
from agenttest_worker.report.usage_tally import usage_line
from agenttest_worker.report.verdicts import CaseVerdict, grouped
from agenttest_worker.results import AssertionResult, CaseResult, TurnResult

_HEAVY_RULE = "═" * 63
_LIGHT_RULE = "─" * 63
_TURN_INDENT = 10  # details line up under the text after "├─ Turn N: "
_FINAL_INDENT = 2  # final assertions sit just inside the closing "└─"

_GREEN, _RED, _YELLOW = "32", "31", "33"
_STATUS_COLORS = {"passed": _GREEN, "failed": _RED, "skipped": _YELLOW}
# How a dynamic case's turn got its input (the spec's "[Initial]" is the first one: a
# hybrid case's later scripted turns are "[Static]").
_MARKERS = {"static": "[Static] ", "simulator": "[Simulated] ", "interactive": "[Interactive] "}
_FIRST_STATIC = "[Initial] "


@functools.cache
def _status_word(status: str, color: bool) -> str:
    # Written four times per turn of a large run's report: each status word once.
    return Style(color).paint(status.upper(), _STATUS_COLORS.get(status, _RED))


@dataclass(frozen=True)
class Style:
    """ANSI colors on status words and marks, or plain text (files, pipes, CI logs)."""

    color: bool = False

    def paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def status(self, status: str) -> str:
        return _status_word(status, self.color)

    def mark(self, passed: bool) -> str:
        return self.paint("✓", _GREEN) if passed else self.paint("✗", _RED)


@dataclass
class _Branch:
    """One "├─"/"└─" entry of a case's tree and the lines indented under it."""

    head: str
    indent: int
    details: list[str] = field(default_factory=list)


def render(run: RunReport) -> str:
    return "".join(render_chunks(run))


def render_chunks(run: RunReport) -> Iterator[str]:
    """The report piece by piece (the header, each case, the summary): the results are
    read once, and a caller storing it need not hold it whole."""
    style = Style(run.color)
    yield _text([*_header(run), "", *_section("Running Tests"), ""])
    tally = run.tally()
    hidden = 0
    for groups in by_case(grouped(run.results)):
        verdicts = [tally.add_case(records) for records in groups]
        if run.only_failures and all(found.status == "passed" for found in verdicts):
            hidden += len(verdicts)
            continue
        if len(groups) > 1:
            lines = _targets_case_lines(verdicts, groups, run, style)
        elif verdicts[0].repeated:
            lines = repeated_case_lines(verdicts[0], groups[0], run, style)
        else:
            lines = case_lines(groups[0][0], run, style, full=run.verbose)
        yield _text([*lines, ""])
    if not tally.total:
        yield _text(["  No test cases ran.", ""])
    elif hidden:
        yield _text([f"  {counted(hidden, 'passed case')} not shown (--only-failures)", ""])
    run.counted = tally.summary(run.duration_s, run.budget)
    rows = target_rows(tally.verdicts.cases)
    yield _text([*_section("Summary"), *_summary_lines(run.counted, style), *_target_lines(rows)])


def _targets_case_lines(
    verdicts: list[CaseVerdict], groups: list[list[CaseResult]], run: RunReport, style: Style
) -> list[str]:
    """A case played against several targets, shown once: each target's verdict, and
    under a target it did not pass on, how it went there (every target's with -v)."""
    lines = [_case_title(groups[0][0], run, with_turns=False)]
    for found, records in zip(verdicts, groups, strict=True):
        played = f" ({found.fraction()} repetitions passed)" if found.repeated else ""
        head = f"  {style.mark(found.status == 'passed')} {printable(found.agent or '-')}: "
        lines.append(head + style.status(found.status) + played)
        if found.status == "passed" and not run.verbose:
            continue
        if found.repeated:
            shown = repeated_case_lines(found, records, run, style)[1:]
        else:
            shown = case_lines(records[0], run, style, full=run.verbose)[1:]
        lines.extend(f"    {line}" for line in shown)
    return lines


def _target_lines(rows: list[TargetRow] | None) -> list[str]:
    """The summary's cases passed on each target, for a run of several."""
    if rows is None:
        return []
    lines = ["", "  Targets:"]
    for target, counts in target_counts(rows).items():
        lines.append(
            f"    {printable(target)}: {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped"
        )
    first = targets_of(rows)[0]
    for target, (failing, fixed) in against_first(rows).items():
        # What `diff RUN --targets FIRST TARGET` details.
        said = [
            f"{len(ids)} {word}" + (f" ({_some(ids)})" if ids else "")
            for word, ids in (("newly failing", failing), ("fixed", fixed))
        ]
        lines.append(f"    {printable(target)} against {printable(first)}: {', '.join(said)}")
    return lines


def _some(ids: list[str], shown: int = 5) -> str:
    """A few case ids, escaped, and how many more."""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(printable(i) for i in ids[:shown]) + more


def _text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n" if lines else ""


def _section(title: str) -> list[str]:
    return [_LIGHT_RULE, f"  {title}", _LIGHT_RULE]


def _header(run: RunReport) -> list[str]:
    # The input label quotes -i, which may be a message: printed escaped like all data.
    lines = [_HEAVY_RULE, f"  {printable(run.title)}", _HEAVY_RULE]
    if run.agent:
        lines.append(f"ℹ Agent: {printable(run.agent)}")
    label = printable(run.input_label)
    # Some case repeats: the run's conversations are its cases' repetitions.
    cases = counted_cases(run.distinct_cases, run.total_cases, "test case")
    if run.repeat_auto and run.distinct_cases is not None:
        # As many repetitions as each case needed: "× K" would claim a fixed K.
        played = counted(run.total_cases, "conversation")
        cases = f"{counted(run.distinct_cases, 'test case')}, {played}, --repeat auto"
    lines.append(f"ℹ Input: {label} ({cases})")
    if run.run_id:
        lines.append(f"ℹ Run: {printable(run.run_id)}")
    return lines


def _summary_lines(summary: Summary, style: Style) -> list[str]:
    def count(value: int, status: str) -> str:
        return style.paint(str(value), _STATUS_COLORS[status]) if value else str(value)

    return [
        f"  Total:   {counted(summary.total, 'test')}",
        f"  Passed:  {count(summary.passed, 'passed')}",
        f"  Failed:  {count(summary.failed, 'failed')}",
        f"  Skipped: {count(summary.skipped, 'skipped')}",
        # (The reason names a case: data, escaped like the rest.)
        *(
            [f"  Not run: {summary.not_run} ({printable(summary.not_run_reason or '')})"]
            if summary.not_run
            else []
        ),
        *([f"  Budget: {summary.budget.line()}"] if summary.budget else []),
        *_repeat_lines(summary),
        # (Judge names come from agenttest.yaml; escaped all the same.)
        *([f"  {printable(judged)}"] if (judged := judges_line(summary.judges)) else []),
        "",
        f"  Total turns: {summary.total_turns}",
        f"  Avg turns/test: {summary.avg_turns:.1f}",
        f"  Total time: {format_seconds(summary.duration_s)}",
        # After the spec's summary, which stays as the spec lays it out.
        *([f"  {used}"] if (used := usage_line(summary.usage)) else []),
        # Failed or skipped conversations by cause (report/causes.py).
        *([f"  Causes: {caused}"] if (caused := causes_line(summary.causes)) else []),
    ]


def _repeat_lines(summary: Summary) -> list[str]:
    stats = summary.repeats
    if stats is None:
        return []
    lines = ["", *(f"  {line}" for line in stats.lines())]
    if stats.flaky:
        # Case ids are data: escaped like the rest.
        lines.append(
            f"  Flaky ({len(stats.flaky)}): {', '.join(printable(i) for i in stats.flaky)}"
        )
    return lines


def repeated_case_lines(
    found: CaseVerdict, records: list[CaseResult], run: RunReport, style: Style
) -> list[str]:
    """A case played several times, shown once: its verdict, then each repetition that
    did not pass, with its turns (every repetition with -v)."""
    title = _case_title(records[0], run, with_turns=False)
    flaky = f" · {style.paint('FLAKY', _YELLOW)}" if found.flaky else ""
    lines = [f"{title} ({found.fraction()} repetitions passed){flaky}"]
    # In order: --repeat auto stores a case's later repetitions beside its first ones.
    for record in sorted(records, key=lambda r: r.repeat or 0):
        if record.status == "passed" and not run.verbose:
            continue
        number = f"{record.repeat}/{found.played}" if record.repeat else "?"
        cause = f" (cause: {record.cause})" if record.cause else ""
        lines.append(f"  Repetition {number}: {style.status(record.status)}{cause}")
        branches = _CaseTree(record, run, style, verbose=run.verbose).branches()
        lines += [f"  {line}" for line in _tree(branches)]
    rule = f"pass rule: {run.pass_rule}"
    if found.max_repeat is not None:
        rule += f"; {found.stopped()}"
    lines.append(f"  └─ Result: {style.status(found.status)} ({found.fraction()} passed, {rule})")
    return lines


def case_lines(case: CaseResult, run: RunReport, style: Style, *, full: bool) -> list[str]:
    """One case's "►" line and tree, as the spec's Console Output shows it.

    Every turn is listed; the agent's reply is shown where the spec shows it (turns
    with assertions, failures, static conversations). `full` (-v) shows every reply.
    """
    branches = _CaseTree(case, run, style, verbose=full).branches()
    return [_case_title(case, run), *_tree(branches)]


def case_text(case: CaseResult) -> str:
    """One case's line and tree without colour, as the console report shows it (a
    pytest item's failure message)."""
    run = RunReport(results=[case], agent=None, input_label="", total_cases=1, duration_s=0.0)
    return _text(case_lines(case, run, Style(False), full=False))


def _case_title(case: CaseResult, run: RunReport, *, with_turns: bool = True) -> str:
    parts = [f"► [{printable(case.id)}]"]
    if case.name and case.name != case.id:  # a YAML test's name is its id: said once
        parts.append(printable(case.name))
    # "agents:workers.test.user-sim" is shown as the spec does: by name.
    simulator = run.simulators.get(case.id) or (case.simulator or "").removeprefix("agents:")
    if simulator:
        parts.append(f"(simulator: {printable(simulator)})")
    elif with_turns and case.status != "skipped":
        parts.append(f"({counted(case.total_turns, 'turn')})")
    return " ".join(parts)


def _tree(branches: list[_Branch]) -> list[str]:
    lines: list[str] = []
    for index, branch in enumerate(branches):
        last = index == len(branches) - 1
        lines.append(f"  {'└─' if last else '├─'} {branch.head}")
        bar = " " if last else "│"
        lines += [f"  {bar}{' ' * branch.indent}{detail}" for detail in branch.details]
        if branch.details and not last:
            lines.append("  │")
    return [line.rstrip() for line in lines]


def assertion_lines(assertion: AssertionResult, style: Style) -> list[str]:
    lines = [f"{style.mark(assertion.passed)} {describe_assertion(assertion)}"]
    if not assertion.passed:
        lines.append(f"  {failure_reason(assertion)}")
        # A panel's or repeated judge's every vote: which judge said what, and why.
        for vote in assertion.votes or ():
            said = "error" if vote.error else ("pass" if vote.passed else "fail")
            score = f" {vote.score:g}" if vote.score is not None else ""
            why = one_line(vote.error or vote.reason or "")
            lines.append(f"    {printable(vote.judge)}: {said}{score}{': ' + why if why else ''}")
    return lines


def _reply(turn: TurnResult) -> str:
    parts = [quoted(turn.output)] if turn.output and turn.output.strip() else []
    parts += [f"[tool: {describe_tool_call(call)}]" for call in turn.tool_calls]
    return " ".join(parts) or "(empty reply)"


class _CaseTree:
    """Builds the branches of one case: its turns, then final assertions and result."""

    def __init__(self, case: CaseResult, run: RunReport, style: Style, verbose: bool) -> None:
        self.case = case
        self.style = style
        self.verbose = verbose
        sources = {turn.input_source for turn in case.turns}
        self.simulated = (
            case.id in run.simulators or case.simulator is not None or "simulator" in sources
        )
        # Source markers only help when inputs came from more than the case file.
        self.dynamic = self.simulated or "interactive" in sources
        executed = executed_turns(case)
        self.last_executed = executed[-1] if executed else None
        self.shown_errors: set[str] = set()
        self.skip_shown = False

    def branches(self) -> list[_Branch]:
        return [*self._turn_branches(), *self._ending_branches()]

    def _turn_branches(self) -> list[_Branch]:
        branches: list[_Branch] = []
        previous: TurnResult | None = None
        for turn in self.case.turns:
            if turn.status == "skipped" and turn.input is None:
                reason = turn.skip_reason or self.case.skip_reason
                branches.append(self._skipped(turn.turn, reason, previous))
            else:
                branches.append(self._turn(turn))
                previous = turn
        if self.case.status == "skipped" and not self.skip_shown and self.case.skip_reason:
            # The engine may record the skip only on the case: show it where it happened.
            number = self.case.turns[-1].turn + 1 if self.case.turns else 1
            branches.append(self._skipped(number, self.case.skip_reason, previous))
        return branches

    def _turn(self, turn: TurnResult) -> _Branch:
        status = "failed" if turn.error else turn.status
        word = self.style.status(status)
        if turn.input is None:
            head = f"Turn {turn.turn}: {word}"
        else:
            marker = ""
            if self.dynamic:
                first = turn.turn == 1 and turn.input_source == "static"
                marker = _FIRST_STATIC if first else _MARKERS.get(turn.input_source or "", "")
            took = format_ms(turn.duration_ms)
            if turn.first_token_ms is not None:
                # A streamed reply: how long until its first token came.
                took += f", first token {format_ms(turn.first_token_ms)}"
            head = f"Turn {turn.turn}: {marker}{quoted(turn.input)} → {word} ({took})"
        branch = _Branch(head, _TURN_INDENT)
        if self._shows_reply(turn, status):
            branch.details.append(f"Agent: {_reply(turn)}")
        for assertion in turn.assertions:
            branch.details += assertion_lines(assertion, self.style)
        # Malformed tool calls, quoting what the agent sent (escaped by one_line).
        branch.details += [f"Problem: {one_line(problem)}" for problem in turn.problems or ()]
        if turn.error:
            self.shown_errors.add(turn.error)
            branch.details.append(f"Error: {one_line(turn.error)}")
        if turn is self.last_executed and self.case.goal_achieved:
            reasoning = turn.simulator_reasoning
            branch.details.append(
                f"Goal achieved: {one_line(reasoning)}" if reasoning else "Goal achieved"
            )
        return branch

    def _shows_reply(self, turn: TurnResult, status: str) -> bool:
        if turn.output is None and not turn.tool_calls:
            return False
        if self.verbose:
            return True
        return not self.simulated or bool(turn.assertions) or status == "failed"

    def _skipped(self, number: int, reason: str | None, previous: TurnResult | None) -> _Branch:
        self.skip_shown = True
        branch = _Branch(f"Turn {number}: {self.style.status('skipped')}", _TURN_INDENT)
        branch.details.append(f"Reason: {one_line(reason or 'no input available')}")
        if previous is not None and previous.awaiting_input:
            # What it asked ("…approval. Please provide PO number." gives "Please provide
            # PO number", as the spec's T002 shows it), or nothing when it asked nothing.
            asked = asked_question(previous)
            if asked:
                branch.details.append(f"Agent asked: {quoted(asked)}")
            if previous.input_hint:
                branch.details.append(f"Input hint: {one_line(previous.input_hint)}")
            # A simulator case that skips had a simulator failure: more turns are not the fix.
            if not self.simulated:
                branch.details.append(f"Hint: {MISSING_INPUT_HINT}")
        return branch

    def _ending_branches(self) -> list[_Branch]:
        case = self.case
        branches: list[_Branch] = []
        # The spec closes a passed case with "Final Assertions: PASSED" even when it has
        # none (T003); other cases list them only when there are some.
        if case.final_assertions or case.status == "passed":
            failed = any(not a.passed for a in case.final_assertions)
            head = f"Final Assertions: {self.style.status('failed' if failed else 'passed')}"
            branch = _Branch(head, _FINAL_INDENT)
            for assertion in case.final_assertions:
                branch.details += assertion_lines(assertion, self.style)
                rows = golden_rows(assertion, case)
                if rows:
                    branch.details += [f"  {line}" for line in console_lines(rows)]
            branches.append(branch)
        if case.status != "passed":
            branches.append(self._result())
        return branches

    def _result(self) -> _Branch:
        case = self.case
        branch = _Branch(f"Result: {self.style.status(case.status)}", _FINAL_INDENT)
        if case.error and case.error not in self.shown_errors:
            branch.details.append(f"Error: {one_line(case.error)}")
        if case.skip_reason and not self.skip_shown:
            branch.details.append(f"Reason: {one_line(case.skip_reason)}")
        return branch
