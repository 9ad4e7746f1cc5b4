"""What a case is, as a hash: its normalized definition, and each of its assertions.

Run history compares a case's verdict in two runs only while the case is the same: a
case whose definition changed between them is `changed`, not a regression or a fix,
and its assertions are matched by their own hashes, never by position. The hashes are
taken of the normalized record (`Case.to_run_record`), so that a JSONL case and the
YAML test written the same way hash alike, without what names or places a case and
does not change how it is played or checked.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

# Fields that name, describe or place a case, or say which of its repetitions a
# conversation is: renaming a case or moving it in its file changes none of its plays.
_NOT_DEFINITION = frozenset(
    {
        "id",
        "name",
        "description",
        "tags",
        "source_file",
        "source_line",
        "repeat",
        "repetition",
        "max_repeat",
    }
)
# Hex digits kept of each SHA-256: enough that two definitions of one case id never meet.
DIGITS = 20


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGITS]


@dataclass(frozen=True)
class CaseDefinition:
    """A case's hash, and its assertions' hashes: per turn (by position in the case's
    turns), and its final assertions'."""

    hash: str
    turns: list[list[str]]
    final: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"turns": self.turns, "final": self.final}

    def of_turn(self, turn: int) -> list[str] | None:
        """The hashes of turn `turn`'s assertions (1-based), None past the static turns."""
        return self.turns[turn - 1] if 0 < turn <= len(self.turns) else None


def case_definition(record: dict[str, Any]) -> CaseDefinition:
    """The hashes of a case's normalized record (what a run stores of it)."""
    defining = {k: v for k, v in record.items() if k not in _NOT_DEFINITION}
    turns = [[_digest(a) for a in turn.get("assertions", [])] for turn in record.get("turns", [])]
    final = [_digest(a) for a in record.get("final_assertions", [])]
    return CaseDefinition(_digest(defining), turns, final)


def stored_definition(case_hash: str | None, assertions: Any) -> CaseDefinition | None:
    """A definition as the store keeps it (the hash, and `as_dict`'s document); None for
    a case stored before definitions were."""
    if case_hash is None or not isinstance(assertions, dict):
        return None
    turns = assertions.get("turns") or []
    return CaseDefinition(case_hash, [list(t) for t in turns], list(assertions.get("final") or []))
