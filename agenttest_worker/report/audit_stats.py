"""A judge audit's statistics: how often judges change their minds on the same
transcript, and how often they agree with people.

An audit asks every agent assertion of a stored run again N times on the same
conversation. Each judged verdict (a case, a turn, an assertion of that turn: a
`Spot`) then has N+1 verdicts, the stored one first. Over them:

- an item *flips* when its verdicts are not all the same; the *flip rate* of a
  criterion (or a judge) is the share of its items that flipped;
- the *agreement* is the share of all its verdicts that agree with their own item's
  majority (a tie counts half of them as agreeing);
- a criterion (or judge) is *unstable* when its flip rate is above
  `UNSTABLE_FLIP_RATE`; the spots that flipped are kept, to be shown.

Per criterion the verdict is the assertion's (its votes' majority); per judge it is
each of the judge's votes, so a judge asked 3 times per assertion that splits 2 to 1
flips even where the assertion's majority never changes. A failed judge call gave no
verdict and is left out.

Against people: a label is a person's pass or fail for one spot, kept with the
verdict the judge had given there. Per criterion (the assertion's verdict) and per
judge (the judge's own stored verdict at that spot, its votes' majority), the raw
agreement is the share of labels that match, and Cohen's kappa is that agreement
corrected for what two raters who each said pass as often as these did would reach by
chance: (observed - expected) / (1 - expected), 1 for perfect agreement, 0 for no
better than chance, below 0 for worse. When both always gave the same single answer
the expected agreement is 1 and kappa is undefined (None).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agenttest_worker.report.common import describe_assertion
from agenttest_worker.report.judges import voted_verdict
from agenttest_worker.results import AssertionResult, TurnResult

# A criterion or judge whose verdicts changed on more than this share of its items.
UNSTABLE_FLIP_RATE = 0.1
# The final assertions of a conversation are at this turn number.
FINAL_TURN = 0


@dataclass(frozen=True, order=True)
class Spot:
    """Where a judged verdict is: a conversation of the run, a turn (FINAL_TURN for
    its final assertions) and the assertion's position among that turn's (from 1)."""

    case_id: str
    turn: int
    position: int

    def shown(self) -> str:
        where = "final" if self.turn == FINAL_TURN else f"turn {self.turn}"
        return f"{self.case_id} {where}" + (f" #{self.position}" if self.position > 1 else "")

    def document(self) -> dict[str, Any]:
        return {"case_id": self.case_id, "turn": self.turn, "position": self.position}


@dataclass
class Judged:
    """One asking of one agent assertion: its criterion, its verdict, and each judge's
    verdicts (one per vote that did not fail)."""

    criterion: str
    verdict: bool | None
    by_judge: dict[str, list[bool]]


def judge_of(assertion: AssertionResult, default_judge: str | None) -> str:
    """The judge an assertion asked once, named as a panel's votes name it."""
    use = (assertion.model_extra or {}).get("use")
    if isinstance(use, list) and len(use) == 1:
        use = use[0]
    if isinstance(use, str) and use:
        return use if ":" in use else f"agents:{use}"
    if not default_judge:
        return "(default judge)"
    return f"agents:{default_judge.removeprefix('agents:')}"


def judged_at(assertion: AssertionResult, default_judge: str | None) -> Judged:
    """What one asking of an agent assertion decided."""
    criterion = describe_assertion(assertion)
    if assertion.votes:
        by_judge: dict[str, list[bool]] = {}
        for vote in assertion.votes:
            if vote.error is None:
                by_judge.setdefault(vote.judge, []).append(vote.passed)
        answered = any(by_judge.values())
        return Judged(criterion, voted_verdict(assertion) if answered else None, by_judge)
    if assertion.error is not None:
        return Judged(criterion, None, {})
    return Judged(
        criterion, assertion.passed, {judge_of(assertion, default_judge): [assertion.passed]}
    )


def judged_spots(
    case_id: str,
    turns: Sequence[TurnResult],
    finals: Sequence[AssertionResult],
    default_judge: str | None,
) -> dict[Spot, Judged]:
    """Every agent assertion of one conversation, by spot (turns that failed are not
    judged: they have no reply)."""
    found: dict[Spot, Judged] = {}
    places = [(t.turn, t.assertions) for t in turns if t.error is None]
    for turn, assertions in [*places, (FINAL_TURN, list(finals))]:
        for position, assertion in enumerate(assertions, start=1):
            if assertion.type == "agent":
                found[Spot(case_id, turn, position)] = judged_at(assertion, default_judge)
    return found


def _majority_count(verdicts: Sequence[bool]) -> float:
    passes = sum(verdicts)
    fails = len(verdicts) - passes
    return len(verdicts) / 2 if passes == fails else float(max(passes, fails))


@dataclass
class Stability:
    """A criterion's or a judge's verdicts over the audit."""

    name: str
    items: int = 0
    flipped: int = 0
    verdicts: int = 0
    agreeing: float = 0.0
    flips: list[Spot] = field(default_factory=list)
    # Askings that gave no verdict: every judge call of it failed.
    unanswered: int = 0

    def add(self, spot: Spot, verdicts: Sequence[bool], unanswered: int = 0) -> None:
        self.unanswered += unanswered
        if not verdicts:
            return
        self.items += 1
        self.verdicts += len(verdicts)
        self.agreeing += _majority_count(verdicts)
        if len(set(verdicts)) > 1:
            self.flipped += 1
            self.flips.append(spot)

    @property
    def flip_rate(self) -> float:
        return self.flipped / self.items if self.items else 0.0

    @property
    def agreement(self) -> float:
        return self.agreeing / self.verdicts if self.verdicts else 1.0

    @property
    def unstable(self) -> bool:
        return self.flip_rate > UNSTABLE_FLIP_RATE

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "items": self.items,
            "flipped": self.flipped,
            "flip_rate": round(self.flip_rate, 4),
            "verdicts": self.verdicts,
            "agreement": round(self.agreement, 4),
            "unstable": self.unstable,
            "unanswered": self.unanswered,
            "flips": [s.document() for s in sorted(self.flips)],
        }


def cohen_kappa(pairs: Sequence[tuple[bool, bool]]) -> float | None:
    """Cohen's kappa of two raters' pass/fail over the same items (None: undefined,
    when chance alone gives full agreement, or there are no items)."""
    n = len(pairs)
    if not n:
        return None
    observed = sum(1 for a, b in pairs if a == b) / n
    first = sum(1 for a, _ in pairs if a) / n
    second = sum(1 for _, b in pairs if b) / n
    expected = first * second + (1 - first) * (1 - second)
    if expected >= 1:
        return None
    return (observed - expected) / (1 - expected)


@dataclass(frozen=True)
class Label:
    """A person's pass or fail for one spot, beside the verdict the judge had given."""

    spot: Spot
    criterion: str
    judge_verdict: bool
    label: bool


@dataclass
class PeopleAgreement:
    """A criterion's or a judge's verdicts against people's labels."""

    name: str
    pairs: list[tuple[bool, bool]] = field(default_factory=list)

    @property
    def raw(self) -> float | None:
        if not self.pairs:
            return None
        return sum(1 for a, b in self.pairs if a == b) / len(self.pairs)

    @property
    def kappa(self) -> float | None:
        return cohen_kappa(self.pairs)

    def document(self) -> dict[str, Any]:
        raw, kappa = self.raw, self.kappa
        return {
            "name": self.name,
            "labels": len(self.pairs),
            "agreement": None if raw is None else round(raw, 4),
            "kappa": None if kappa is None else round(kappa, 4),
        }


@dataclass
class Audit:
    """The audit of one run: its N+1 askings of every judged verdict, and labels."""

    run_id: str
    times: int
    criteria: dict[str, Stability] = field(default_factory=dict)
    judges: dict[str, Stability] = field(default_factory=dict)
    people_criteria: dict[str, PeopleAgreement] = field(default_factory=dict)
    people_judges: dict[str, PeopleAgreement] = field(default_factory=dict)
    items: int = 0

    def unstable(self) -> list[Stability]:
        return [c for c in self.criteria.values() if c.unstable]

    def document(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "times": self.times,
            "items": self.items,
            "unstable_above": UNSTABLE_FLIP_RATE,
            "criteria": [c.document() for c in self.criteria.values()],
            "judges": [j.document() for j in self.judges.values()],
            "unstable": [c.document() for c in self.unstable()],
            "people": {
                "criteria": [p.document() for p in self.people_criteria.values()],
                "judges": [p.document() for p in self.people_judges.values()],
            },
        }


def audit(
    run_id: str,
    askings: Sequence[dict[Spot, Judged]],
    labels: Iterable[Label] = (),
) -> Audit:
    """The audit from every asking of the run's judged verdicts, the stored one first."""
    found = Audit(run_id, times=max(0, len(askings) - 1))
    stored = askings[0] if askings else {}
    for spot in sorted(stored):
        asked = [a[spot] for a in askings if spot in a]
        criterion = stored[spot].criterion
        verdicts = [j.verdict for j in asked if j.verdict is not None]
        if verdicts:
            found.items += 1
        found.criteria.setdefault(criterion, Stability(criterion)).add(
            spot, verdicts, len(askings) - len(verdicts)
        )
        judges = sorted({name for j in asked for name in j.by_judge})
        for judge in judges:
            votes = [v for j in asked for v in j.by_judge.get(judge, [])]
            found.judges.setdefault(judge, Stability(judge)).add(spot, votes)
    found.judges = dict(sorted(found.judges.items()))
    for label in labels:
        pair = (label.judge_verdict, label.label)
        people = found.people_criteria.setdefault(label.criterion, PeopleAgreement(label.criterion))
        people.pairs.append(pair)
        for judge, votes in (stored[label.spot].by_judge if label.spot in stored else {}).items():
            passes = sum(votes)
            if votes and passes * 2 != len(votes):  # a judge split evenly gave no verdict
                agreement = found.people_judges.setdefault(judge, PeopleAgreement(judge))
                agreement.pairs.append((passes * 2 > len(votes), label.label))
    found.people_judges = dict(sorted(found.people_judges.items()))
    return found
