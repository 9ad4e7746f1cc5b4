"""Why cases failed, over a run: the causes only a run's records together can tell, and
the summaries by cause every report shows.

A record's own cause (`agent`, `judge`, `simulator`, `infrastructure`, `input`) is
decided when it is built (engine/attribution.py). Two more are decided here:
- `flake`: a failed repetition (the target's failure, `agent`) of a case another
  repetition of which passed in the same run (`flake_cause`);
- `judge`, for a criterion an audit of the judges found unstable: `audited_cause` takes
  the set of unstable criteria (the text of each `criteria`), and a failed case every
  failing assertion of which is a judge's on one of them is the judge's doing. Nothing
  in a run builds that set yet: an audit of the judges hands it in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agenttest_worker.engine.attribution import failed_assertions
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


def criterion(assertion: AssertionResult) -> str | None:
    """The criterion a judge's assertion checks (its `options.metadata.criteria`)."""
    if assertion.type != "agent":
        return None
    options: Any = (assertion.model_extra or {}).get("options")
    metadata = options.get("metadata") if isinstance(options, dict) else None
    found = metadata.get("criteria") if isinstance(metadata, dict) else None
    return found if isinstance(found, str) else None


def audited_cause(record: CaseResult, unstable: frozenset[str]) -> Cause | None:
    """The record's cause given the criteria an audit of the judges found unstable:
    `judge` when every failed assertion is a judge's on one of them (a flake stays a
    flake, and an infrastructure or input failure stays one)."""
    if record.status != "failed" or record.cause not in ("agent", "judge") or not unstable:
        return record.cause
    failed = failed_assertions(record)
    if failed and all(criterion(a) in unstable for a in failed):
        return "judge"
    return record.cause


def in_order(counts: Mapping[Any, int]) -> dict[str, int]:
    """Counts by cause in CAUSES' order (only the causes that occur)."""
    return {c: counts[c] for c in CAUSES if counts.get(c)}


def causes_line(counts: Mapping[str, int]) -> str:
    """E.g. "3 agent, 1 infrastructure, 2 flake" ("" when nothing failed)."""
    return ", ".join(f"{n} {cause}" for cause, n in counts.items() if n)
