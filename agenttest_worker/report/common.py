"""Helpers several reporters share: durations, assertion labels, what went wrong in a case."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator
from typing import Any

from pydantic import BaseModel

from agenttest_worker.agents.config import DEFAULT_AWAITING_TOOLS
from agenttest_worker.assertions.text import preview
from agenttest_worker.engine.awaiting import TOOL_REQUIRES_INPUT, looks_like_question, sentences
from agenttest_worker.results import AssertionResult, CaseResult, ToolCall, TurnResult

# Values inside an assertion label are cut here: the label names the check, the
# JSONL record keeps the full value.
_VALUE_LIMIT = 60
_REASON_LIMIT = 300

# What a terminal would act on instead of showing: C0 and C1 controls (ESC starts a
# sequence that can set the title or erase the screen; 0x9b is CSI on its own), DEL,
# and the bidirectional overrides and isolates that make text read other than it is.
_FORMAT_CONTROLS = "\\u061c\\u200e\\u200f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069"
_UNSAFE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_FORMAT_CONTROLS}]")
_UNSAFE_KEEPING_LINES = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_FORMAT_CONTROLS}]")
# The arguments an awaiting tool call (ask_user, ...) asks its question in.
_QUESTION_ARGS = ("question", "prompt", "message", "text", "query")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, keep_lines: bool = False) -> str:
    """`text` safe to print on a terminal: every control character written out as an
    escape ("\\x1b", "\\u202e") that the reader sees instead of the terminal obeying it.
    Agent replies, case ids and names, judge reasons are data, never terminal commands.
    `keep_lines` leaves line breaks and tabs alone (a multi-line text shown as such)."""
    if text.isascii() and text.isprintable():
        # Nothing to escape (printable ASCII has no controls): most texts, at C speed.
        return text
    pattern = _UNSAFE_KEEPING_LINES if keep_lines else _UNSAFE
    return pattern.sub(_escaped, text)


def quoted(text: str | None, limit: int | None = None) -> str:
    """A reply or input as the console quotes it (`preview`), safe to print."""
    return printable(preview(text) if limit is None else preview(text, limit))


def format_seconds(seconds: float) -> str:
    """Durations as the spec's console prints them: "45ms", "2.1s", "3m05s", "1h02m"."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        minutes, secs = divmod(round(seconds), 60)
        return f"{minutes}m{secs:02d}s"
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m"


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and its noun, in the singular for one: "1 case", "2 changes"."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def case_count(cases: int | None, conversations: int) -> str:
    """A run's cases as every listing shows them: "20", or "20×2" for 20 cases played
    twice each, or "3 (7 conversations)" when cases repeat unevenly. `cases` None: no
    case repeats (the conversations are the cases)."""
    if cases is None or cases == conversations:
        return str(conversations)
    if cases and conversations % cases == 0:
        return f"{cases}×{conversations // cases}"
    return f"{cases} ({counted(conversations, 'conversation')})"


def counted_cases(cases: int | None, conversations: int, noun: str = "case") -> str:
    """The same in words: "1 case", "20 cases × 2", "3 cases, 7 conversations"."""
    if cases is None or cases == conversations:
        return counted(conversations, noun)
    if cases and conversations % cases == 0:
        return f"{counted(cases, noun)} × {conversations // cases}"
    return f"{counted(cases, noun)}, {counted(conversations, 'conversation')}"


def format_ms(duration_ms: int) -> str:
    return format_seconds(duration_ms / 1000)


def one_line(text: str, limit: int = _REASON_LIMIT) -> str:
    """Collapse whitespace so multi-line reasons (judges write paragraphs) fit one line,
    with control characters escaped (see `printable`): reasons and errors quote agents."""
    flat = " ".join(text.split())
    return printable(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def quote(value: Any, limit: int = _VALUE_LIMIT) -> str:
    """A value as it would be written in the case file: strings quoted, the rest as JSON."""
    if isinstance(value, str):
        return quoted(value, limit)
    return one_line(json.dumps(value, ensure_ascii=False, default=str), limit)


def js_value(value: Any) -> str:
    """JSON with bare object keys, the spec's way of showing tool arguments:
    create_expense({amount: 3500, type: "travel"})."""
    if isinstance(value, dict):
        items = ", ".join(f"{_js_key(k)}: {js_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list):
        return "[" + ", ".join(js_value(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False, default=str)


def _js_key(key: Any) -> str:
    text = str(key)
    return text if text.isidentifier() else json.dumps(text, ensure_ascii=False)


def describe_tool_call(call: ToolCall, limit: int = 120) -> str:
    # Arguments that were not JSON are kept as raw text by the result model.
    args = call.args if isinstance(call.args, str) else js_value(call.args)
    return one_line(f"{call.name}({args})", limit)


def _extras(assertion: AssertionResult) -> dict[str, Any]:
    return dict(assertion.model_extra or {})


def _criteria(options: Any) -> str | None:
    # Options arrive as a dict from stored JSON, or as the Options model when the
    # engine passes the spec through unchanged.
    if isinstance(options, BaseModel):
        options = options.model_dump()
    if not isinstance(options, dict):
        return None
    metadata = options.get("metadata")
    criteria = metadata.get("criteria") if isinstance(metadata, dict) else None
    return one_line(str(criteria), 100) if criteria is not None else None


def _ignore_case(extras: dict[str, Any]) -> str:
    return " (ignore case)" if extras.get("ignore_case") else ""


def describe_assertion(assertion: AssertionResult) -> str:
    """The check as the spec's console writes it: `contains "x"`, `$.path = "v"`, ..."""
    extras = _extras(assertion)
    label = printable(_label(assertion.type, extras))
    description = extras.get("description")
    return f"{label} — {one_line(str(description), 80)}" if description else label


def _label(kind: str, extras: dict[str, Any]) -> str:
    if kind in ("contains", "equals", "not_contains"):
        return f"{kind} {quote(extras.get('value'))}{_ignore_case(extras)}"
    if kind in ("regex", "not_regex"):
        flags = "i" if extras.get("ignore_case") else ""
        return f"{kind} /{extras.get('pattern', extras.get('value', ''))}/{flags}"
    if kind in ("tool_called", "tool_not_called"):
        label = f"{kind} {quote(extras.get('name', ''))}"
        args = extras.get("args")
        return f"{label} with {one_line(js_value(args), 80)}" if args else label
    if kind == "json_path":
        path = extras.get("path", "$")
        # Without a value the assertion only asks that the path match something.
        return f"{path} = {quote(extras['value'])}" if "value" in extras else f"{path} exists"
    if kind == "type":
        return f"type {extras.get('path', '$')} is {extras.get('value')}"
    if kind == "agent":
        criteria = _criteria(extras.get("options"))
        return f"agent: {criteria}" if criteria else f"agent {extras.get('use') or 'judge'}"
    if kind == "script":
        return f"script {extras.get('use', '')}".rstrip()
    return (
        _trajectory_label(kind, extras)
        or _group_label(kind, extras)
        or _generic_label(kind, extras)
    )


def _bounds(extras: dict[str, Any]) -> str:
    low, high = extras.get("min"), extras.get("max")
    if low is not None and high is not None:
        return f"between {low} and {high}"
    return f"at least {low}" if high is None else f"at most {high}"


def _trajectory_label(kind: str, extras: dict[str, Any]) -> str | None:
    if kind == "tool_sequence":
        listed = extras.get("calls")
        calls = listed if isinstance(listed, list) else []
        names = ", ".join(str(c.get("name")) for c in calls if isinstance(c, dict))
        return f"tool_sequence {extras.get('order', 'exact')}: {one_line(names, 80)}"
    if kind == "tool_count":
        name = extras.get("name")
        return f"tool_count{f' {quote(name)}' if name else ''} {_bounds(extras)}"
    if kind == "turn_count":
        return f"turn_count {_bounds(extras)}"
    if kind == "golden":
        # Not the recorded conversation it carries: that is what the diff shows.
        return f"golden {extras.get('match', 'tools')}"
    return None


def _part_label(part: Any) -> str:
    if not isinstance(part, dict):
        return str(part)
    inner = {k: v for k, v in part.items() if k != "type"}
    return _label(str(part.get("type")), inner)


def _group_label(kind: str, extras: dict[str, Any]) -> str | None:
    if kind == "not":
        return f"not ({one_line(_part_label(extras.get('assertion')), 100)})"
    if kind in ("any", "all") and isinstance(extras.get("assertions"), list):
        parts = "; ".join(_part_label(p) for p in extras["assertions"])
        return f"{kind} of ({one_line(parts, 100)})"
    return None


def _generic_label(kind: str, extras: dict[str, Any]) -> str:
    # Assertion types added later still get a readable label without a change here.
    shown = {k: v for k, v in extras.items() if k != "description"}
    fields = " ".join(f"{k}={quote(v, 40)}" for k, v in shown.items())
    return f"{kind} {fields}".rstrip()


def failure_reason(assertion: AssertionResult) -> str:
    return one_line(assertion.reason or assertion.error or "failed")


def assertion_counts(case: CaseResult) -> tuple[int, int]:
    """(passed, failed) over every turn's assertions and the final assertions."""
    checked = [*(a for t in case.turns for a in t.assertions), *case.final_assertions]
    passed = sum(1 for a in checked if a.passed)
    return passed, len(checked) - passed


def executed_turns(case: CaseResult) -> list[TurnResult]:
    """Turns whose input was sent: skipped placeholders carry no input."""
    return [t for t in case.turns if not (t.status == "skipped" and t.input is None)]


def problems(
    case: CaseResult, label: Callable[[AssertionResult], str] | None = None
) -> Iterator[str]:
    """What went wrong in a case, in conversation order, one line each (each assertion
    named by `label`: the console's `describe_assertion` unless a page gives its own)."""
    label = label or describe_assertion
    for turn in case.turns:
        if turn.error:
            yield f"turn {turn.turn}: {one_line(turn.error)}"
        for problem in turn.problems or ():
            yield f"turn {turn.turn}: {one_line(problem)}"
        for assertion in turn.assertions:
            if not assertion.passed:
                yield f"turn {turn.turn}: {label(assertion)}: {failure_reason(assertion)}"
    for assertion in case.final_assertions:
        if not assertion.passed:
            yield f"final: {label(assertion)}: {failure_reason(assertion)}"
    # The case's error is often the failing turn's, as is or as "turn N: ...": say it once.
    copies = {t.error for t in case.turns} | {f"turn {t.turn}: {t.error}" for t in case.turns}
    if case.error and case.error not in copies:
        yield one_line(case.error)
    if case.skip_reason:
        yield one_line(case.skip_reason)
    elif case.status == "skipped":
        yield from (one_line(t.skip_reason) for t in case.turns if t.skip_reason)


def first_problem(case: CaseResult, label: Callable[[AssertionResult], str] | None = None) -> str:
    return next(problems(case, label), "")


def asked_question(
    turn: TurnResult, awaiting_tools: Collection[str] = DEFAULT_AWAITING_TOOLS
) -> str | None:
    """The question the agent asked in `turn`, in its own words, or None when it asked
    none: the question argument of an awaiting tool call (ask_user(question=...)), else
    the reply's last sentence that asks (the awaiting heuristics' notion of asking).

    A reply declared awaiting that asks nothing ("Noted") gives None: showing its last
    sentence as what the agent asked would put words in its mouth. The run's own
    awaiting tools are not in a stored result: a turn detected through a tool call
    (`awaiting_reason`) has its calls' questions read whatever the tools are named.
    """
    by_tool = turn.awaiting_reason == TOOL_REQUIRES_INPUT
    for call in reversed(turn.tool_calls):
        if call.name in awaiting_tools or by_tool:
            question = _tool_question(call)
            if question:
                return question
    asking = [s for s in sentences(turn.output or "") if looks_like_question(s)]
    return asking[-1].removesuffix(".") if asking else None


def _tool_question(call: ToolCall) -> str | None:
    args = call.args
    if not isinstance(args, dict):
        return None
    for name in _QUESTION_ARGS:
        value = args.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()
    texts = [v for v in args.values() if isinstance(v, str) and v.strip()]
    return texts[0].strip() if len(texts) == 1 else None
