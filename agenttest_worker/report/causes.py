"""Why cases failed, over a run: the causes only a run's records together can tell, and
the summaries by cause every report shows.

A record's own cause (`agent`, `judge`, `simulator`, `infrastructure`, `input`) is
decided when it is built (engine/attribution.py). Two more are decided here:
- `flake`: a failed repetition (the target's failure, `agent`) of a case another
  repetition of which passed in the same run (`flake_cause`);
- `judge`, for a criterion an audit of the judges found unstable: `audited_cause` takes
  the set of unstable criteria the run's newest audit named (`audit-judges`,
  store.unstable_criteria), and a failed case every failing assertion of which is a
  judge's on one of them is the judge's doing. It wins over `flake`: a judge that
  changes its mind on the same transcript explains why repetitions disagree better than
  the target does.
Neither is stored: each is applied as a run's records are read for a report, the viewer
or a diff, so an audit made after the run changes what they show.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agenttest_worker.engine.attribution import failed_assertions
from agenttest_worker.report.common import describe_assertion
from agenttest_worker.results import CAUSES, AssertionResult, CaseResult, Cause

# The causes a failure that passed in another repetition is a flake over (None: a
# record stored before causes were).
FLAKES: tuple[Cause | None, ...] = ("agent", None)


def flake_cause(record: CaseResult, passed_elsewhere: bool) -> Cause | None:
    """The record's cause once it is known whether the case passed in another
    repetition: the target's failure (`agent`) where it passed elsewhere is a flake.
    A more particular cause stays (the infrastructure, the judge's split votes, the
    simulator, the input): that is what to look at, passed elsewhere or not."""
    if record.status == "failed" and passed_elsewhere and record.cause in FLAKES:
        return "flake"
    return record.cause


# The causes an unstable criterion takes over: the target's failure, and a flake (the
# judge flipping is why the repetitions disagreed). An infrastructure, simulator or
# input failure stays one.
AUDITABLE: tuple[Cause | None, ...] = ("agent", "flake", "judge")


def criterion(assertion: AssertionResult) -> str | None:
    """The criterion a judge's assertion checks, named as an audit of the judges names
    it (report/audit_stats.py: the assertion as the console describes it, e.g.
    `agent: is polite`)."""
    return describe_assertion(assertion) if assertion.type == "agent" else None


def audited_cause(record: CaseResult, unstable: frozenset[str]) -> Cause | None:
    """The record's cause given the criteria an audit of the judges found unstable:
    `judge` when every failed assertion is a judge's on one of them."""
    if record.status != "failed" or record.cause not in AUDITABLE or not unstable:
        return record.cause
    failed = failed_assertions(record)
    if failed and all(criterion(a) in unstable for a in failed):
        return "judge"
    return record.cause


def read_cause(
    record: CaseResult, passed_elsewhere: bool, unstable: frozenset[str]
) -> Cause | None:
    """The cause a report shows for a stored record: a flake where the case passed in
    another repetition, then the judge's where the run's newest audit found the
    criteria it failed on unstable (which wins)."""
    record.cause = flake_cause(record, passed_elsewhere)
    return audited_cause(record, unstable)


def in_order(counts: Mapping[Any, int]) -> dict[str, int]:
    """Counts by cause in CAUSES' order (only the causes that occur)."""
    return {c: counts[c] for c in CAUSES if counts.get(c)}


def causes_line(counts: Mapping[str, int]) -> str:
    """E.g. "3 agent, 1 infrastructure, 2 flake" ("" when nothing failed)."""
    return ", ".join(f"{n} {cause}" for cause, n in counts.items() if n)
