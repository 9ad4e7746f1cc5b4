"""What every reporter renders: the results of one run plus what the header shows."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, overload

from agenttest_worker.observe.received_spans import AgentSpan
from agenttest_worker.report.causes import in_order, read_cause
from agenttest_worker.report.judges import JudgeAgreement, JudgeTally, judges_json
from agenttest_worker.report.usage_tally import UsageTally
from agenttest_worker.report.verdicts import CaseVerdict, RepeatStats, VerdictTally
from agenttest_worker.results import (
    DEADLINE_PASSED,
    RESULT_VERSION,
    CaseResult,
    Cause,
    RoleUsage,
    UsageRole,
)

DEFAULT_TITLE = "Agent Test (Multi-Turn)"
# How the skip reason of a case its run stopped before it started begins
# (driver/step.py: --fail-fast, cancellations; driver/budget_counting.py: budgets).
NOT_RUN = "not run: "


def was_not_run(case: CaseResult) -> bool:
    """Whether its run stopped before the case played a turn (a JUnit <error>)."""
    reason = case.skip_reason or ""
    return case.status == "skipped" and not case.total_turns and reason.startswith(NOT_RUN)


@dataclass(frozen=True)
class Budget:
    """A run's --max-tokens/--max-cost and what the run used of them: turns already
    running when a budget ran out still finish, so a run may end past its budget
    (by at most those turns, store/reservations.py), and the summary says by how much."""

    max_tokens: int | None
    max_cost: float | None
    tokens: int
    cost: float

    def line(self) -> str:
        """E.g. "45 of 40 tokens used (5 over: turns already running when it ran out)"."""
        parts = []
        if self.max_tokens is not None:
            parts.append(
                _used(f"{self.tokens:,}", f"{self.max_tokens:,}", "tokens", self.tokens_over)
            )
        if self.max_cost is not None:
            over = f"{self.cost_over:.4f}" if self.cost_over else ""
            parts.append(_used(f"{self.cost:.4f}", f"{self.max_cost:g}", "cost", over))
        return "; ".join(parts)

    @property
    def tokens_over(self) -> int:
        return max(self.tokens - self.max_tokens, 0) if self.max_tokens is not None else 0

    @property
    def cost_over(self) -> float:
        return max(self.cost - self.max_cost, 0.0) if self.max_cost is not None else 0.0

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if self.max_tokens is not None:
            found.update(
                max_tokens=self.max_tokens, tokens_used=self.tokens, tokens_over=self.tokens_over
            )
        if self.max_cost is not None:
            found.update(
                max_cost=self.max_cost, cost_used=self.cost, cost_over=round(self.cost_over, 6)
            )
        return found


def _used(used: str, limit: str, unit: str, over: object) -> str:
    said = f"{used} of {limit} {unit} used"
    if over:
        return f"{said} ({over} over: turns already running when it ran out)"
    return said


@dataclass(frozen=True)
class Summary:
    """Counts over a run's results, as the console "Summary" section shows them.

    `total`, `passed`, `failed` and `skipped` count cases by their verdict: a case
    played K times counts once (report/verdicts.py); turns count every repetition's."""

    total: int
    passed: int
    failed: int
    skipped: int
    total_turns: int
    avg_turns: float
    duration_s: float
    # Skipped cases that never played a turn because the run stopped first (--fail-fast,
    # a budget, a cancellation), and the first one's reason ("not run: " left off).
    not_run: int = 0
    not_run_reason: str | None = None
    # Cases its --deadline ended (failed with results.DEADLINE_PASSED).
    deadline_cut: int = 0
    # The run's budget and its use, when it had one (--max-tokens, --max-cost).
    budget: Budget | None = None
    # Repetitions, pass rate, pass@k and pass^k, flaky cases: when some case repeated.
    repeats: RepeatStats | None = None
    # Each judge asked more than once (votes, panels): its agreement with the verdicts.
    judges: dict[str, JudgeAgreement] = field(default_factory=dict)
    # Calls, tokens and cost by role: the records' and the run's own (its generators).
    usage: dict[UsageRole, RoleUsage] = field(default_factory=dict)
    # Failed or skipped conversations by cause (report/causes.py), when any.
    causes: dict[str, int] = field(default_factory=dict)

    @property
    def run_failed(self) -> bool:
        """Whether the run exits 1: a case's verdict failed, or the run stopped before
        every case was tested."""
        return bool(self.failed or self.stopped)

    @property
    def stopped(self) -> str | None:
        """Why the run stopped before every case was tested as written (a budget, a
        cancellation, --fail-fast, its deadline), or None when it did not."""
        if self.not_run:
            return f"{self.not_run} not run: {self.not_run_reason}"
        if self.deadline_cut:
            return f"{self.deadline_cut} ended by the run's deadline"
        return None

    def as_dict(self) -> dict[str, Any]:
        counts = asdict(self)
        if not self.not_run:  # (the spec's summary, unchanged when every case ran)
            del counts["not_run"], counts["not_run_reason"]
        if not self.deadline_cut:
            del counts["deadline_cut"]
        # (The usage by role is the JSON report's own `usage_by_role`, beside the summary.)
        del counts["budget"], counts["repeats"], counts["judges"], counts["usage"]
        if not self.causes:
            del counts["causes"]
        if self.budget is not None:
            counts["budget"] = self.budget.as_dict()
        if self.repeats is not None:
            counts["repeats"] = self.repeats.as_dict()
        if self.judges:
            counts["judges"] = judges_json(self.judges)
        return counts


# How every record `model_dump_json` writes begins (its first field is the version).
_AS_SAVED = f'{{"version":{RESULT_VERSION},"id":'
_DECODER = json.JSONDecoder()
# What the store writes for a NUL (U+FFFD as an escape, which the model never writes).
_STORED_NUL = "\\ufffd"


class StoredResults(Sequence[CaseResult]):
    """A run's case records kept as their stored JSON text, parsed as they are read.

    The aggregator of a run of tens of thousands of cases held every record as an
    object, an order of magnitude larger than its text (benchmarks/aggregate.py); a
    million records' texts alone are hundreds of megabytes. So the texts are not held
    either: each pass over the records reads them again from where they are stored
    (`texts()`, in the run's order), and parsing a record again per report costs less
    than keeping it.
    """

    # Records parsed lately, by index: the aggregator renders its stored reports side by
    # side (store/sql/report_copy.py), so each record parsed for one is reused by the next
    # instead of parsed again (parsing was the JSONL report's largest cost).
    _RECENT = 64

    def __init__(
        self,
        texts: Callable[[], Iterable[str]],
        count: int,
        flaky: frozenset[str] = frozenset(),
        unstable: frozenset[str] = frozenset(),
    ) -> None:
        self._texts = texts
        self._count = count
        # Repeated cases some repetition of which passed and another failed: their failed
        # repetitions' cause is a flake (report/causes.py), whatever was stored.
        self._flaky = flaky
        # The criteria the run's newest audit of its judges found unstable: a failure
        # resting on them is the judge's (report/causes.py), whatever was stored.
        self._unstable = unstable
        self._recent: OrderedDict[int, CaseResult] = OrderedDict()

    @classmethod
    def held(
        cls,
        texts: list[str],
        flaky: frozenset[str] = frozenset(),
        unstable: frozenset[str] = frozenset(),
    ) -> StoredResults:
        """Records whose texts are in memory already."""
        return cls(lambda: texts, len(texts), flaky, unstable)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> CaseResult: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[CaseResult]: ...

    def __getitem__(self, index: int | slice) -> CaseResult | Sequence[CaseResult]:
        # (Reporters read the records in order; a single one is looked for by a pass.)
        if isinstance(index, slice):
            return StoredResults.held(list(self._texts())[index], self._flaky, self._unstable)
        position = range(self._count)[index]  # (IndexError as a list's)
        for at, text in enumerate(self._texts()):
            if at == position:
                return self._parsed(at, text)
        raise IndexError(index)

    def __iter__(self) -> Iterator[CaseResult]:
        for index, text in enumerate(self._texts()):
            yield self._parsed(index, text)

    def json_lines(self) -> Iterator[str]:
        """Each record as `CaseResult.to_json_line` writes it, in order.

        A record stored as that line already (what a step saves: `model_dump_json`,
        whose own output it parses back to) is given as it is: parsing and writing it
        again was a tenth of aggregating a large run. Any other text (a SQL store on
        SQLite writes its records through the JSON column, spaced) is parsed and
        written anew, and so is one holding the escape `\\ufffd`: the model writes
        U+FFFD as the character, so that escape is where the store replaced a NUL
        (store/storable.py), or a reply's own backslash text; either way the parsed
        record is what the other reports show."""
        for index, text in enumerate(self._texts()):
            if text.startswith(_AS_SAVED) and _STORED_NUL not in text and not self._reread(text):
                yield text
            else:
                yield self._parsed(index, text).to_json_line()

    def _reread(self, text: str) -> bool:
        """Whether a record stored as its line is written anew: a repetition of a flaky
        case, whose cause may be a flake now (its id read alone, not the record), or any
        record of an audited run with unstable criteria (which of them rest on those
        criteria takes the record to tell)."""
        if self._unstable:
            return True
        if not self._flaky:
            return False
        found, _ = _DECODER.raw_decode(text, len(_AS_SAVED))
        return found in self._flaky

    def _parsed(self, index: int, text: str) -> CaseResult:
        # (Reporters read records and never change them, so one object serves them all.)
        record = self._recent.get(index)
        if record is None:
            record = CaseResult.model_validate_json(text)
            if (self._flaky and record.id in self._flaky) or self._unstable:
                record.cause = read_cause(record, record.id in self._flaky, self._unstable)
            self._recent[index] = record
            if len(self._recent) > self._RECENT:
                self._recent.popitem(last=False)
        return record


@dataclass
class RunReport:
    """One run's results and the context a reporter needs around them.

    `total_cases` is how many cases the input expanded to; it can exceed
    `len(results)` when a run is reported before it finishes or stopped early
    (--fail-fast), so the header and the summary may differ on purpose.
    """

    results: Sequence[CaseResult]
    agent: str | None
    input_label: str
    total_cases: int
    duration_s: float
    verbose: bool = False
    run_id: str | None = None
    title: str = DEFAULT_TITLE
    # case id -> simulator name, for the "(simulator: NAME)" case header
    simulators: dict[str, str] = field(default_factory=dict)
    color: bool = False
    # The console shows only failed and skipped cases (--only-failures); the summary
    # still counts every case.
    only_failures: bool = False
    budget: Budget | None = None
    # What the run used outside any conversation (generating its cases, a reporter
    # agent), by role: added to the records' usage_by_role in the summary.
    run_usage: dict[UsageRole, RoleUsage] = field(default_factory=dict)
    # How a repeated case's repetitions make its verdict (--pass-rule: all, any,
    # majority, or a share such as 0.8) and the k of pass@k and pass^k (--pass-k).
    pass_rule: str = "all"
    pass_k: int | None = None
    # The cases the run's `total_cases` conversations play, when some case repeats.
    distinct_cases: int | None = None
    # Whether a tally keeps the verdict of each case played once (VerdictTally
    # keep_once): a stored run none of whose cases repeats keeps their counts only.
    keep_once: bool = True
    # --repeat auto: cases took as many repetitions as they needed (no fixed K).
    repeat_auto: bool = False
    # The summary a reporter counted as it read every record (console, json): the exit
    # code and the reporter agent take it instead of parsing the records a second time. A report's
    # records and duration are not changed once it is rendered.
    counted: Summary | None = field(default=None, repr=False, compare=False)
    # The spans agents sent of the run's conversations, by trace id (the HTML report
    # draws each turn's as a waterfall): read from the store where it is at hand.
    agent_spans: dict[str, list[AgentSpan]] = field(default_factory=dict, repr=False)
    # What changed since the run's baseline (--baseline), as the `diff` command's JSON
    # (RunDiff.as_dict): the HTML report shows it; None: the run had no baseline.
    baseline_diff: dict[str, Any] | None = None

    def tally(self) -> Tally:
        """A tally under this run's pass rule, for a reporter that reads the records."""
        return Tally(self.pass_rule, self.pass_k, self.run_usage, keep_once=self.keep_once)

    def summary(self) -> Summary:
        if self.counted is not None:
            return self.counted
        # One pass: the results may be parsed as they are read (StoredResults).
        tally = self.tally()
        for case in self.results:
            tally.add(case)
        return tally.summary(self.duration_s, self.budget)


class Tally:
    """Counts a run's results one by one, for a reporter that writes its summary after
    the cases it has just read (so that it reads them once). Records come in the run's
    order, a repeated case's repetitions one after the other."""

    def __init__(
        self,
        rule: str = "all",
        k: int | None = None,
        run_usage: dict[UsageRole, RoleUsage] | None = None,
        *,
        keep_once: bool = True,
    ) -> None:
        self.records = self.total_turns = self.not_run = self.deadline_cut = 0
        self.verdicts = VerdictTally(rule, k, keep_once=keep_once)
        self.judges = JudgeTally()
        self.usage = UsageTally(run_usage)
        self.not_run_reason: str | None = None
        self.causes: dict[Cause, int] = {}

    @property
    def total(self) -> int:
        """Cases (a repeated one once) added so far, counting the one still open."""
        return self.verdicts.count + (1 if self.verdicts.open else 0)

    def add(self, case: CaseResult) -> None:
        self.verdicts.add(case)
        self._count(case)

    def add_case(self, records: list[CaseResult]) -> CaseVerdict:
        """Add one case's records (its repetitions, `verdicts.grouped`); its verdict."""
        for record in records:
            self._count(record)
        return self.verdicts.add_group(records)

    def _count(self, case: CaseResult) -> None:
        self.records += 1
        self.total_turns += case.total_turns
        self.judges.add(case)
        self.usage.add(case)
        if case.status != "passed" and case.cause is not None:
            self.causes[case.cause] = self.causes.get(case.cause, 0) + 1
        reason = case.skip_reason or ""
        if was_not_run(case):
            self.not_run += 1
            self.not_run_reason = self.not_run_reason or reason.removeprefix(NOT_RUN)
        elif case.error == DEADLINE_PASSED:
            self.deadline_cut += 1

    def summary(self, duration_s: float, budget: Budget | None = None) -> Summary:
        self.verdicts.finish()
        counts = self.verdicts.counts()
        return Summary(
            total=self.verdicts.count,
            passed=counts["passed"],
            failed=counts["failed"],
            skipped=counts["skipped"],
            total_turns=self.total_turns,
            # Per conversation played: a repeated case's repetitions each count.
            avg_turns=round(self.total_turns / self.records, 2) if self.records else 0.0,
            duration_s=duration_s,
            not_run=self.not_run,
            not_run_reason=self.not_run_reason,
            deadline_cut=self.deadline_cut,
            budget=budget,
            repeats=self.verdicts.stats(),
            judges=self.judges.agreement(),
            usage=self.usage.usage,
            causes=dict(in_order(self.causes)),
        )
