"""Words for the codes records carry: what the HTML report and the viewer show instead.

A record keeps its codes (`content_is_question`, `tool_called`, `validator`, ...) so
that programs reading the JSONL can match them; a person reading a page gets these
words. One table, embedded in every page (html_page/shell.py) and read by its script's
`word(kind, code)`; a code missing here is shown as it is, with its underscores as spaces.
"""

from __future__ import annotations

from typing import Any

# Why a turn waits for input, or why the conversation ended (engine/awaiting.py).
AWAITING = {
    "agent_declared": "the agent said it waits for input",
    "agent_declared_complete": "the agent said it is done",
    "tool_requires_confirmation": "a tool call waits for the user's confirmation",
    "content_is_question": "the reply asks a question",
    "completed": "the conversation is complete",
    "response_truncated": "the reply was cut off at its length limit",
}

# Assertion types as a case file writes them.
ASSERTIONS = {
    "contains": "contains",
    "not_contains": "does not contain",
    "equals": "equals",
    "regex": "matches a pattern",
    "not_regex": "does not match a pattern",
    "json_path": "JSON value",
    "type": "value type",
    "tool_called": "tool called",
    "tool_not_called": "tool not called",
    "tool_sequence": "tool call order",
    "tool_count": "number of tool calls",
    "turn_count": "number of turns",
    "word_count": "number of words",
    "latency": "response time",
    "agent": "judge",
    "script": "script check",
    "not": "none of",
    "any": "any of",
    "all": "all of",
}

# The roles an agent plays in a run, and how a turn got its input.
ROLES = {
    "target": "agent under test",
    "validator": "judge",
    "simulator": "simulated user",
    "generator": "case generator",
    "reporter": "reporter",
    "static": "written in the case",
    "interactive": "typed by a person",
}

# Why an agent stopped (its stop or finish reason, as providers say it).
STOP_REASONS = {
    "end_turn": "finished its reply",
    "stop": "finished its reply",
    "tool_use": "called a tool",
    "tool_calls": "called a tool",
    "max_tokens": "hit its token limit",
    "length": "hit its token limit",
    "content_filter": "stopped by a content filter",
    "stop_sequence": "reached a stop sequence",
}

# What changed between two runs (report/diff.py's categories).
CHANGES = {
    "regression": "newly failing",
    "fixed": "fixed",
    "still_failing": "still failing",
    "still_passing": "still passing",
    "new": "new",
    "removed": "removed",
    "flaky": "flaky",
    "changed": "definition changed",
}

# Where a conversation is while it runs (engine/state.py's phases).
PHASES = {
    "ready": "ready for its next turn",
    "awaiting_human": "waiting for a person's input",
    "done": "finished",
}

# Why a case failed or was skipped (a record's `cause`, when it has one).
CAUSES = {
    "agent": "the agent",
    "judge": "the judge",
    "simulator": "the simulated user",
    "infrastructure": "infrastructure",
    "flake": "a flaky result",
    "input": "the case's input",
}

# One table per kind of code: the same code means different things in two kinds (an
# `agent` assertion is a judge's; an `agent` cause is the agent under test).
WORDS: dict[str, dict[str, str]] = {
    "awaiting": AWAITING,
    "assertion": ASSERTIONS,
    "role": ROLES,
    "stop": STOP_REASONS,
    "change": CHANGES,
    "cause": CAUSES,
    "phase": PHASES,
}


def words(kind: str, code: str | None) -> str:
    """`code`, of `kind` (a key of WORDS), as a person reads it."""
    if not code:
        return ""
    return WORDS.get(kind, {}).get(code, code.replace("_", " "))


def worded_label(label: str) -> str:
    """An assertion's label as the console writes it (`not_contains "x"`, `agent:
    polite`) with its type in words (`does not contain "x"`, `judge: polite`)."""
    for code in sorted(ASSERTIONS, key=len, reverse=True):
        if label.startswith(code) and label[len(code) : len(code) + 1] in ("", " ", ":"):
            return ASSERTIONS[code] + label[len(code) :]
    return label


def worded_diff(found: dict[str, Any]) -> dict[str, Any]:
    """A diff's JSON (RunDiff.as_dict) with each difference's assertion in words."""
    for case in found.get("cases") or []:
        difference = case.get("difference")
        if difference and difference.get("assertion"):
            difference["assertion"] = worded_label(difference["assertion"])
    return found
