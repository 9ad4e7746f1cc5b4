"""Golden conversations: a passing case's conversation kept as a reviewable file, and
the turn-by-turn comparison of a new conversation with it.

A golden file holds what the target did, turn by turn: the input it was sent, its reply
and its tool calls (name and arguments; call ids are the agent's own and change from
run to run, so they are left out). It is written as deterministic JSON (sorted keys,
indent 2) so that a change to it reviews as a small diff. The `golden` assertion
(assertions/golden.py) decides with `compare`; the reports show `compare`'s rows.

Where the file lives (docs/DESIGN.md): beside its case file, in the folder named after
the case file plus `.golden` (`tests/expense.jsonl` → `tests/expense.jsonl.golden/`),
one file per case named by `golden_name` from the case id.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agenttest_worker.json_values import json_equal
from agenttest_worker.results import CaseResult, TurnResult

GOLDEN_VERSION = 1
GOLDEN_SUFFIX = ".golden"
# A file name stays well under the 255 bytes file systems allow.
_MAX_NAME = 150
# What a case id keeps as it is in its file name; everything else is %XX (its UTF-8
# bytes), the dot included, so that no name is ".", "..", hidden, or a path.
_KEPT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")

GoldenMatch = Literal["exact", "tools", "judge"]

# What json.dumps(ensure_ascii=False) leaves raw and a terminal showing the file (`cat`,
# `git diff`) would obey: DEL, the C1 controls and the bidirectional marks, overrides and
# isolates. Written \uXXXX: the JSON reads back the same, the rest stays readable.
_RAW_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class GoldenCall(BaseModel):
    """A tool call as the golden file keeps it: its tool and its arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    args: Any = Field(default_factory=dict)


class GoldenTurn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str | None = None
    reply: str | None = None
    tool_calls: list[GoldenCall] = Field(default_factory=list)


class GoldenConversation(BaseModel):
    """The contents of one golden file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = GOLDEN_VERSION
    id: str
    turns: list[GoldenTurn] = Field(default_factory=list)

    def to_json(self) -> str:
        """The file's text: sorted keys, indent 2, a newline at the end."""
        data = self.model_dump(mode="json")
        text = json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False)
        return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text) + "\n"


def played_turns(turns: Iterable[TurnResult]) -> list[GoldenTurn]:
    """The turns the target was sent (a turn skipped for want of input was not)."""
    return [
        GoldenTurn(
            input=t.input,
            reply=t.output,
            tool_calls=[GoldenCall(name=c.name, args=c.args) for c in t.tool_calls],
        )
        for t in turns
        if t.input is not None
    ]


def conversation_of(case: CaseResult) -> GoldenConversation:
    return GoldenConversation(id=case.id, turns=played_turns(case.turns))


def golden_name(case_id: str) -> str:
    """The file name of a case's golden conversation: letters, digits, `_` and `-` as
    they are, every other character as `%XX` of its UTF-8 bytes (so `../x` is
    `%2E%2E%2Fx.json`); a name that would be longer than 150 characters is cut and
    ends in 16 hex digits of the id's SHA-256, so that it stays one of its own."""
    encoded = "".join(
        ch if ch in _KEPT else "".join(f"%{b:02X}" for b in ch.encode("utf-8")) for ch in case_id
    )
    if len(encoded) > _MAX_NAME:
        digest = hashlib.sha256(case_id.encode("utf-8")).hexdigest()[:16]
        encoded = f"{encoded[: _MAX_NAME - 17]}-{digest}"
    return f"{encoded}.json"


def golden_folder(case_file: str) -> Path:
    return Path(case_file + GOLDEN_SUFFIX)


def golden_path(case_file: str, case_id: str) -> Path:
    return golden_folder(case_file) / golden_name(case_id)


# -- comparing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnDiff:
    """One turn of the comparison: the golden turn and the new one (None where one of
    them has no such turn), and what differs between them."""

    turn: int
    golden: GoldenTurn | None
    new: GoldenTurn | None
    reply_differs: bool
    tools_differ: bool

    @property
    def differs(self) -> bool:
        return self.reply_differs or self.tools_differ


def same_calls(a: Sequence[GoldenCall], b: Sequence[GoldenCall], *, args: bool) -> bool:
    if [c.name for c in a] != [c.name for c in b]:
        return False
    return not args or all(json_equal(x.args, y.args) for x, y in zip(a, b, strict=True))


def compare(
    golden: Sequence[GoldenTurn], new: Sequence[GoldenTurn], *, args: bool
) -> list[TurnDiff]:
    """The two conversations side by side, turn by turn (`args`: tool call arguments
    compared, not only names)."""
    rows = []
    for index in range(max(len(golden), len(new))):
        old = golden[index] if index < len(golden) else None
        now = new[index] if index < len(new) else None
        if old is None or now is None:
            rows.append(TurnDiff(index + 1, old, now, True, True))
            continue
        rows.append(
            TurnDiff(
                index + 1,
                old,
                now,
                reply_differs=(old.reply or "") != (now.reply or ""),
                tools_differ=not same_calls(old.tool_calls, now.tool_calls, args=args),
            )
        )
    return rows


def describe_calls(calls: Sequence[GoldenCall], *, args: bool = True) -> str:
    """The calls as a reason quotes them (`args`: with their arguments)."""
    if not calls:
        return "no tool calls"
    return ", ".join(
        f"{c.name}({json.dumps(c.args, sort_keys=True, default=str)})"
        if args and c.args not in ({}, None)
        else c.name
        for c in calls
    )
