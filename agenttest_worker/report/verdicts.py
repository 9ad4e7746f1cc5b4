"""A repeated case's verdict and the statistics of a run of repeated cases.

A case played K times (`--repeat K`, a case's `repeat`) has K records, one per
repetition. Its verdict follows the run's pass rule:
- `all` (the default: pass^k): every repetition passed;
- `any` (pass@k): at least one did;
- `majority`: more than half did;
- a share such as `0.8`: at least that share did.
Skipped repetitions are not passes; a case whose every repetition was skipped is
skipped. A case whose repetitions did not all end the same way is flaky.

Over a run: the pass rate over repetitions with its 95% Wilson score interval, and the
mean over cases of pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained
on Code": 1 - C(n-c, k) / C(n, k)) and of pass^k (Yao et al. 2024, τ-bench:
C(c, k) / C(n, k)), unbiased estimators when a case's n repetitions exceed k. Both
leave out cases whose every repetition was skipped, and cases with fewer than k
repetitions (the summary says how many).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agenttest_worker.report.common import counted
from agenttest_worker.report.repeat_stopping import stop_reason, wilson_interval
from agenttest_worker.results import CaseResult, CaseStatus

PASS_RULES = ("all", "any", "majority")


def pass_rule_problem(text: str) -> str | None:
    """Why `text` is not a pass rule (all, any, majority, or a share in (0, 1])."""
    if text in PASS_RULES:
        return None
    try:
        share = float(text)
    except ValueError:
        return f"{text!r} is not a pass rule: all, any, majority, or a share such as 0.8"
    if not 0 < share <= 1 or math.isnan(share):
        return f"{text!r}: a share of repetitions is more than 0 and at most 1"
    return None


def passes(rule: str, passed: int, played: int) -> bool:
    """Whether `passed` passes of `played` repetitions make the case pass under `rule`."""
    if rule == "all":
        return passed == played
    if rule == "any":
        return passed >= 1
    if rule == "majority":
        return passed * 2 > played
    # A share: compared in whole numbers of repetitions, so that 0.8 of 5 is 4 exactly.
    return passed >= math.ceil(float(rule) * played - 1e-9)


def verdict(statuses: list[CaseStatus], rule: str) -> CaseStatus:
    """A case's status from its repetitions' statuses."""
    if all(s == "skipped" for s in statuses):
        return "skipped"
    return "passed" if passes(rule, statuses.count("passed"), len(statuses)) else "failed"


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k repetitions drawn from n (c of them passed)
    passed: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """The chance that all of k repetitions drawn from n (c of them passed) passed:
    C(c, k) / C(n, k)."""
    return math.comb(c, k) / math.comb(n, k)


@dataclass
class CaseVerdict:
    """One case over its repetitions."""

    id: str
    name: str | None
    status: CaseStatus
    passed: int
    played: int
    # The K it was asked to be played (a record's `repeats`), None for a case played once.
    repeats: int | None
    flaky: bool
    statuses: list[CaseStatus] = field(default_factory=list)
    # Played with --repeat auto: at most this many repetitions, and why it stopped where
    # it did (repeat_stopping.stop_reason); None for a fixed number of repetitions.
    max_repeat: int | None = None
    stop_reason: str | None = None
    # The target its records played (a record's `agent`): a run of several targets
    # has one verdict per case and target (report/target_columns.py).
    agent: str | None = None

    @property
    def repeated(self) -> bool:
        return self.repeats is not None

    def fraction(self) -> str:
        """ "3/5": repetitions passed of those played."""
        return f"{self.passed}/{self.played}"

    def as_dict(self) -> dict[str, Any]:
        found = {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "passed": self.passed,
            "repeats": self.played,
            "flaky": self.flaky,
        }
        if self.max_repeat is not None:
            found.update(max_repeat=self.max_repeat, stop_reason=self.stop_reason)
        return found

    def stopped(self) -> str:
        """ "decided after 4 of at most 10 repetitions": why an adaptive case stopped."""
        why = {"decided": "decided", "max_repeat": "undecided at --max-repeat"}.get(
            self.stop_reason or "", "stopped with its run"
        )
        return f"{why} after {self.played} of at most {self.max_repeat} repetitions"


def case_verdict(records: list[CaseResult], rule: str) -> CaseVerdict:
    """The verdict of one case from its records (one per repetition, same id)."""
    statuses: list[CaseStatus] = [r.status for r in records]
    first = records[0]
    bound = first.max_repeat
    return CaseVerdict(
        id=first.id,
        name=first.name,
        status=verdict(statuses, rule),
        passed=statuses.count("passed"),
        played=len(statuses),
        repeats=first.repeats,
        flaky=len(set(statuses)) > 1,
        statuses=statuses,
        max_repeat=bound,
        stop_reason=None if bound is None else stop_reason(rule, bound, statuses),
        agent=first.agent,
    )


def settled_lines(lines: Iterable[str], rule: str) -> Iterator[str]:
    """JSONL lines with each case played with --repeat auto settled: its records'
    `repeats` say how many repetitions it took, and `stop_reason` why (a record is
    stored as its repetition ends, before either is known). Other lines pass as they
    are, unparsed."""
    group: list[CaseResult] = []
    for line in lines:
        record = CaseResult.model_validate_json(line) if '"max_repeat":' in line else None
        if record is not None and record.max_repeat is None:
            record = None  # the text is in a reply, not the field
        if group and (record is None or not same_case(record, group[0])):
            yield from _settled(group, rule)
            group = []
        if record is None:
            yield line
        else:
            group.append(record)
    yield from _settled(group, rule)


def _settled(group: list[CaseResult], rule: str) -> Iterator[str]:
    if not group:
        return
    found = case_verdict(group, rule)
    # In order: a case's later repetitions are stored beside its first ones.
    for record in sorted(group, key=lambda r: r.repeat or 0):
        changed = {"repeats": found.played, "stop_reason": found.stop_reason}
        yield record.model_copy(update=changed).to_json_line()


def grouped(records: Iterable[CaseResult]) -> Iterator[list[CaseResult]]:
    """The records of each case together, in order: a run stores a case's repetitions
    one after the other, so a case is the run of consecutive records with its id (and
    its target: a run of several targets stores each target's records of a case one
    after the other, and each is a verdict of its own)."""
    group: list[CaseResult] = []
    for record in records:
        if group and not same_case(record, group[0]):
            yield group
            group = []
        group.append(record)
    if group:
        yield group


def same_case(record: CaseResult, other: CaseResult) -> bool:
    """Whether two records are of one case played against one target."""
    return record.id == other.id and record.agent == other.agent


@dataclass(frozen=True)
class RepeatStats:
    """What a run of repeated cases says beyond its per-case verdicts."""

    rule: str
    k: int | None  # --pass-k; None: each case's own number of repetitions
    repetitions: int
    passed: int
    failed: int
    skipped: int
    pass_rate: float
    interval: tuple[float, float]
    pass_at_k: float | None
    pass_hat_k: float | None
    estimated_cases: int  # the cases the two means are over
    too_few: int  # cases left out for having fewer than k repetitions
    flaky: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "pass_rule": self.rule,
            "k": self.k,
            "repetitions": self.repetitions,
            "passed": self.passed,
            "failed": self.failed,
            "skipped": self.skipped,
            "pass_rate": round(self.pass_rate, 4),
            "pass_rate_ci95": [round(self.interval[0], 4), round(self.interval[1], 4)],
            "pass_at_k": None if self.pass_at_k is None else round(self.pass_at_k, 4),
            "pass_hat_k": None if self.pass_hat_k is None else round(self.pass_hat_k, 4),
            "estimated_cases": self.estimated_cases,
            "cases_with_fewer_than_k": self.too_few,
            "flaky": self.flaky,
        }

    def lines(self) -> list[str]:
        """The console summary's lines (the flaky ids are listed by the caller, escaped)."""
        low, high = self.interval
        lines = [
            f"Repetitions: {self.repetitions} ({self.passed} passed, {self.failed} failed, "
            f"{self.skipped} skipped); pass rule: {self.rule}",
            f"Pass rate: {self.pass_rate:.1%} (95% CI {low:.1%}–{high:.1%})",
        ]
        if self.pass_at_k is not None and self.pass_hat_k is not None:
            k = f"k={self.k}" if self.k is not None else "k=repetitions"
            lines.append(
                f"pass@k: {self.pass_at_k:.3f}   pass^k: {self.pass_hat_k:.3f} "
                f"({k}, mean over {counted(self.estimated_cases, 'case')})"
            )
        if self.too_few:
            lines.append(
                f"({counted(self.too_few, 'case')} with fewer than k={self.k} repetitions left out)"
            )
        return lines


class VerdictTally:
    """Per-case verdicts and the repeat statistics, from records read one at a time."""

    def __init__(self, rule: str = "all", k: int | None = None, *, keep_once: bool = True) -> None:
        """`keep_once`: keep the verdict of a case played once in `cases` too (the
        statistics of repeated cases count those beside them); without it, a run of a
        million cases played once keeps only their counts."""
        self.rule = rule
        self.k = k
        self.keep_once = keep_once
        self.repeated = False
        self.cases: list[CaseVerdict] = []
        self.count = 0
        self._counts: dict[CaseStatus, int] = {"passed": 0, "failed": 0, "skipped": 0}
        self._group: list[CaseResult] = []

    def add(self, record: CaseResult) -> CaseVerdict | None:
        """Add a record; returns the verdict of the case it closed, if it closed one."""
        closed = None
        if self._group and not same_case(record, self._group[0]):
            closed = self._close()
        self._group.append(record)
        if record.repeats is not None:
            self.repeated = True
        return closed

    def add_group(self, records: list[CaseResult]) -> CaseVerdict:
        """Add a whole case's records at once (a reporter that groups them itself,
        `grouped`); returns its verdict."""
        if self._group:
            self._close()
        self._group = list(records)
        self.repeated = self.repeated or any(r.repeats is not None for r in records)
        return self._close()

    @property
    def open(self) -> bool:
        """Whether a case's records are still being added (not yet closed)."""
        return bool(self._group)

    def finish(self) -> CaseVerdict | None:
        return self._close() if self._group else None

    def _close(self) -> CaseVerdict:
        found = case_verdict(self._group, self.rule)
        # Only the statuses are kept: a run's records are not held, only its verdicts.
        if self.keep_once or found.repeated:
            self.cases.append(found)
        self.count += 1
        self._counts[found.status] += 1
        self._group = []
        return found

    def counts(self) -> dict[CaseStatus, int]:
        return dict(self._counts)

    def stats(self) -> RepeatStats | None:
        """The repeat statistics, or None when no case was repeated."""
        if not self.repeated:
            return None
        played = [c for c in self.cases if c.status != "skipped"]
        repetitions = sum(c.played for c in played)
        passed = sum(c.passed for c in played)
        failed = sum(c.statuses.count("failed") for c in played)
        estimable = [c for c in played if c.played >= (self.k or c.played)]
        at_k = [pass_at_k(c.played, c.passed, self.k or c.played) for c in estimable]
        hat_k = [pass_hat_k(c.played, c.passed, self.k or c.played) for c in estimable]
        return RepeatStats(
            rule=self.rule,
            k=self.k,
            repetitions=repetitions,
            passed=passed,
            failed=failed,
            skipped=repetitions - passed - failed,
            pass_rate=passed / repetitions if repetitions else 0.0,
            interval=wilson_interval(passed, repetitions),
            pass_at_k=sum(at_k) / len(at_k) if at_k else None,
            pass_hat_k=sum(hat_k) / len(hat_k) if hat_k else None,
            estimated_cases=len(estimable),
            too_few=len(played) - len(estimable),
            flaky=[c.id for c in self.cases if c.flaky],
        )
