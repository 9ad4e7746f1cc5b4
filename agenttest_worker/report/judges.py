"""Each judge's agreement with the panel over a run.

An agent assertion asked more than once (`votes`, or a panel of judges in `use`)
records every vote and decides by their majority (a tie as its `tie` says:
assertions/agent.py). Over a run, a judge that often votes against the verdicts it
takes part in is noise, or judges differently from the rest of the panel: per judge,
the votes it was asked, how many agreed with their assertion's verdict, and how many
calls failed (a failed call agrees with nothing: it gave no verdict).

The verdict compared with is the votes' own (the majority, or the tie rule), not the
assertion's `passed`: an assertion that `min_agreement` or `min_score` failed still had
the verdict its votes gave. Assertions asked once carry no votes and are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agenttest_worker.results import AssertionResult, CaseResult


@dataclass
class JudgeAgreement:
    """One judge's votes over a run."""

    judge: str
    votes: int = 0
    agreeing: int = 0
    errors: int = 0

    @property
    def rate(self) -> float:
        """The share of its votes that agreed with the verdict (0 when never asked)."""
        return self.agreeing / self.votes if self.votes else 0.0


class JudgeTally:
    """Each judge's votes and agreement, from case records added one at a time (the
    summary's tally reads a run's records once, and this with it)."""

    def __init__(self) -> None:
        self.found: dict[str, JudgeAgreement] = {}

    def add(self, case: CaseResult) -> None:
        for assertion in _assertions(case):
            votes = assertion.votes or []
            if not votes:
                continue
            verdict = voted_verdict(assertion)
            for vote in votes:
                judge = self.found.setdefault(vote.judge, JudgeAgreement(vote.judge))
                judge.votes += 1
                if vote.error is not None:
                    judge.errors += 1
                elif vote.passed == verdict:
                    judge.agreeing += 1

    def agreement(self) -> dict[str, JudgeAgreement]:
        return dict(sorted(self.found.items()))


def judge_agreement(cases: Iterable[CaseResult]) -> dict[str, JudgeAgreement]:
    """Per judge (by name, sorted), its votes and agreement over these case records,
    which are read once (a stream of a large run's records will do)."""
    tally = JudgeTally()
    for case in cases:
        tally.add(case)
    return tally.agreement()


def voted_verdict(assertion: AssertionResult) -> bool:
    """What the assertion's votes decided: their majority; a tie passes only under
    `tie: pass` (kept on the record as the assertion wrote it)."""
    votes = assertion.votes or []
    passes = sum(1 for v in votes if v.passed)
    if passes * 2 == len(votes):
        return (assertion.model_extra or {}).get("tie") == "pass"
    return passes * 2 > len(votes)


def judges_line(agreement: Mapping[str, JudgeAgreement]) -> str | None:
    """One console line, e.g. "Judges: agents:a 95% agreement (38/40 votes), agents:b
    70% (28/40)"; None when no assertion was asked more than once."""
    if not agreement:
        return None
    parts = []
    for index, judge in enumerate(agreement.values()):
        label, unit = (" agreement", " votes") if index == 0 else ("", "")
        failed = f", {judge.errors} failed" if judge.errors else ""
        parts.append(
            f"{judge.judge} {judge.rate:.0%}{label} ({judge.agreeing}/{judge.votes}{unit}{failed})"
        )
    return "Judges: " + ", ".join(parts)


def judges_json(agreement: Mapping[str, JudgeAgreement]) -> dict[str, dict[str, Any]]:
    """For JSON reports: {judge: {"votes", "agreeing", "errors", "agreement"}}, the
    agreement a share from 0 to 1 (4 decimals)."""
    return {
        name: {
            "votes": judge.votes,
            "agreeing": judge.agreeing,
            "errors": judge.errors,
            "agreement": round(judge.rate, 4),
        }
        for name, judge in agreement.items()
    }


def _assertions(case: CaseResult) -> Iterator[AssertionResult]:
    for turn in case.turns:
        yield from turn.assertions
    yield from case.final_assertions
