"""Assertions on the reply text: contains, equals, regex, and their negatives
not_contains and not_regex.

Regexes are compiled with RE2, the engine behind the spec's Go `regexp`: patterns
written for the spec behave the same here, and matching runs in linear time, so a
pattern cannot hang a worker with catastrophic backtracking. Python-only constructs
(lookaround, backreferences) are rejected when the case file is loaded.
"""

from __future__ import annotations

import json
from functools import lru_cache
from json.encoder import encode_basestring
from typing import Any, Literal

from pydantic import field_validator, model_validator

from agenttest_worker.assertions.checking import (
    AssertionContext,
    AssertionOutcome,
    AssertionSpec,
    register,
)
from agenttest_worker.json_values import json_equal

_PREVIEW = 80


def preview(text: str | None, limit: int = _PREVIEW) -> str:
    """A short, single-line quote of a reply for reasons and the console."""
    if text is None:
        return "(no reply)"
    flat = " ".join(text.split())
    # json.dumps(s, ensure_ascii=False) is this function behind a new encoder per call:
    # a report quotes three texts per turn, and the encoder was a tenth of its time.
    return encode_basestring(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def _to_text(value: Any) -> Any:
    # Numbers in `value` are matched as their text: {"value": 3500} finds "3500".
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return str(value)
    return value


class ContainsAssertion(AssertionSpec):
    type: Literal["contains"]
    value: str
    ignore_case: bool = False

    _coerce = field_validator("value", mode="before")(_to_text)


class EqualsAssertion(AssertionSpec):
    """Exact match of the reply. A non-string `value` is compared with the reply parsed as JSON."""

    type: Literal["equals"]
    value: Any


@lru_cache(maxsize=1)
def _re2() -> tuple[Any, Any]:
    # Imported on first use: runs without regexes do not load RE2.
    import re2

    options = re2.Options()
    options.log_errors = False  # RE2 would print parse errors to stderr; we report them
    options.max_mem = 8 << 20
    return re2, options


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str, ignore_case: bool = False) -> Any:
    re2, options = _re2()
    source = f"(?i){pattern}" if ignore_case else pattern
    try:
        return re2.compile(source, options)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(f"invalid regex {pattern!r}: {detail}") from None


class RegexAssertion(AssertionSpec):
    type: Literal["regex"]
    pattern: str
    ignore_case: bool = False

    @model_validator(mode="before")
    @classmethod
    def _value_means_pattern(cls, data: Any) -> Any:
        # Accept {"type": "regex", "value": "..."} as well: every other text assertion
        # uses `value`, and the mistake is too easy to make to reject it.
        if isinstance(data, dict) and "pattern" not in data and "value" in data:
            data = {**data, "pattern": data["value"]}
            del data["value"]
        return data

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        compile_pattern(pattern)
        return pattern


class NotContainsAssertion(ContainsAssertion):
    """Passes when the reply does not contain `value`; a failure quotes where it does."""

    type: Literal["not_contains"]  # type: ignore[assignment]


class NotRegexAssertion(RegexAssertion):
    """Passes when `pattern` matches nowhere in the reply; a failure quotes the match."""

    type: Literal["not_regex"]  # type: ignore[assignment]


_EXCERPT_MARGIN = 20


def excerpt(text: str, start: int, end: int) -> str:
    """The found span with a little of its surroundings, escaped onto one line: what a
    failing negative assertion quotes, so the report shows the offending words."""
    before = max(0, start - _EXCERPT_MARGIN)
    after = min(len(text), end + _EXCERPT_MARGIN)
    quoted = encode_basestring(text[before:after])[1:-1]
    return f"{'…' if before else ''}{quoted}{'…' if after < len(text) else ''}"


@register(ContainsAssertion)
def check_contains(spec: ContainsAssertion, ctx: AssertionContext) -> AssertionOutcome:
    text = ctx.output or ""
    found = spec.value.lower() in text.lower() if spec.ignore_case else spec.value in text
    if found:
        return AssertionOutcome(True, f"reply contains {json.dumps(spec.value)}")
    return AssertionOutcome(
        False, f"reply does not contain {json.dumps(spec.value)}; reply was {preview(ctx.output)}"
    )


@register(EqualsAssertion)
def check_equals(spec: EqualsAssertion, ctx: AssertionContext) -> AssertionOutcome:
    text = ctx.output if ctx.output is not None else ""
    if isinstance(spec.value, str):
        # Surrounding whitespace is not part of what an agent "said".
        passed = text.strip() == spec.value.strip()
        actual = preview(text)
    else:
        try:
            parsed: Any = json.loads(text)
        except (ValueError, RecursionError):  # (nested past the parser's own limit)
            return AssertionOutcome(
                False, f"expected JSON equal to {json.dumps(spec.value)}; reply is not JSON"
            )
        passed = json_equal(parsed, spec.value)
        actual = json.dumps(parsed)[:_PREVIEW]
    if passed:
        return AssertionOutcome(True, f"reply equals {json.dumps(spec.value)}")
    return AssertionOutcome(False, f"expected {json.dumps(spec.value)}, got {actual}")


@register(RegexAssertion)
def check_regex(spec: RegexAssertion, ctx: AssertionContext) -> AssertionOutcome:
    match = compile_pattern(spec.pattern, spec.ignore_case).search(ctx.output or "")
    if match is not None:
        return AssertionOutcome(True, f"/{spec.pattern}/ matched {json.dumps(match.group(0))}")
    return AssertionOutcome(
        False, f"/{spec.pattern}/ did not match; reply was {preview(ctx.output)}"
    )


@register(NotContainsAssertion)
def check_not_contains(spec: NotContainsAssertion, ctx: AssertionContext) -> AssertionOutcome:
    text = ctx.output or ""
    at = text.lower().find(spec.value.lower()) if spec.ignore_case else text.find(spec.value)
    if at < 0:
        return AssertionOutcome(True, f"reply does not contain {json.dumps(spec.value)}")
    return AssertionOutcome(
        False,
        f"the reply contains {json.dumps(spec.value)} at position {at}: "
        f"{excerpt(text, at, at + len(spec.value))}",
    )


@register(NotRegexAssertion)
def check_not_regex(spec: NotRegexAssertion, ctx: AssertionContext) -> AssertionOutcome:
    text = ctx.output or ""
    match = compile_pattern(spec.pattern, spec.ignore_case).search(text)
    if match is None:
        return AssertionOutcome(True, f"/{spec.pattern}/ matched nowhere in the reply")
    return AssertionOutcome(
        False,
        f"/{spec.pattern}/ matched {json.dumps(match.group(0))} at position {match.start()}: "
        f"{excerpt(text, match.start(), match.end())}",
    )
