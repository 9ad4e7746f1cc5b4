"""Run history read from the store: a suite's runs, each case's tally in a run, the
cases whose verdict keeps changing, a case's record run after run.

Everything a diff of two 100,000-case runs needs is read as one row per case (its
repetitions counted by the database, `coalesce(test_id, case_id)` being the case id),
and records are read only for the cases a diff shows in detail, a chunk at a time.
Works the same on Postgres and SQLite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Text, and_, case, cast, func, literal, or_, select
from sqlalchemy.sql.elements import ColumnElement

from agenttest_worker.case_definitions import CaseDefinition, stored_definition
from agenttest_worker.store.sql.db import session_scope
from agenttest_worker.store.sql.models import CaseRow, RunRow

# Ids per IN (...) list: well under SQLite's and Postgres' bound-parameter limits.
CHUNK = 500
FINISHED = ("done",)


@dataclass(frozen=True)
class CaseTally:
    """One case in one run: its repetitions (1 for a case played once) by status."""

    id: str
    played: int
    passed: int
    failed: int
    skipped: int
    # The hash of its definition (case_definitions.py); None: stored before there were.
    definition: str | None = None


def test_id() -> ColumnElement[str]:
    """A conversation's case id: a repetition's `test_id`, else its key."""
    return func.coalesce(CaseRow.test_id, CaseRow.case_id)


def suite_runs(
    url: str,
    suite: str | None,
    *,
    last: int | None = None,
    before: datetime | None = None,
    finished: bool = False,
) -> list[RunRow]:
    """A suite's runs (every run when `suite` is None), newest first: at most `last`,
    created before `before`, only finished ones with `finished`."""
    query = select(RunRow).order_by(RunRow.created_at.desc(), RunRow.id.desc())
    if suite is not None:
        query = query.where(RunRow.suite == suite)
    if before is not None:
        query = query.where(RunRow.created_at < before)
    if finished:
        query = query.where(RunRow.status.in_(FINISHED))
    if last is not None:
        query = query.limit(last)
    with session_scope(url) as session:
        found = list(session.scalars(query))
        session.expunge_all()
        return found


def suite_baseline(url: str, suite: str, before: datetime | None) -> RunRow | None:
    """The run a new run of `suite` (created at `before`; None: now) is compared with:
    its newest promoted finished run (`promote RUN`), else its newest finished run that
    did not fail its gate (a failing run is never the baseline of its own retry)."""
    query = select(RunRow).where(RunRow.suite == suite, RunRow.status.in_(FINISHED))
    if before is not None:
        query = query.where(RunRow.created_at < before)
    promoted = query.where(RunRow.promoted_at.is_not(None)).order_by(
        RunRow.promoted_at.desc(), RunRow.id.desc()
    )
    unfailed = query.where(or_(RunRow.gate.is_(None), RunRow.gate != "failed")).order_by(
        RunRow.created_at.desc(), RunRow.id.desc()
    )
    with session_scope(url) as session:
        found = session.scalars(promoted.limit(1)).first()
        if found is None:
            found = session.scalars(unfailed.limit(1)).first()
        if found is not None:
            session.expunge(found)
        return found


def case_tallies(url: str, run_id: str) -> Iterator[CaseTally]:
    """Every finished case of the run, one row each, in the run's order."""
    tid = test_id()
    counts = [
        func.sum(case((CaseRow.status == status, 1), else_=0)) for status in ("passed", "failed")
    ]
    query = (
        select(
            tid.label("tid"),
            func.count().label("played"),
            *counts,
            func.min(CaseRow.seq).label("first"),
            func.min(CaseRow.definition_hash),
        )
        .where(CaseRow.run_id == run_id, CaseRow.status.is_not(None))
        .group_by(tid)
        .order_by("first")
    )
    with session_scope(url) as session:
        rows = session.execute(query).yield_per(10_000)
        for tid_value, played, passed, failed, _, definition in rows:
            yield CaseTally(
                str(tid_value),
                int(played),
                int(passed or 0),
                int(failed or 0),
                int(played) - int(passed or 0) - int(failed or 0),
                definition,
            )


@dataclass(frozen=True)
class CasePlace:
    """Where a case is written and how long its conversations took in a run (what a
    JUnit testcase carries)."""

    duration_ms: int
    file: str | None
    line: int | None


def case_places(url: str, run_id: str) -> dict[str, CasePlace]:
    """Every finished case of the run: its repetitions' time, its file and line (read
    from the stored documents by the database, one row per case)."""
    tid = test_id()
    duration = CaseRow.result["duration_ms"].as_integer()
    query = (
        select(
            tid,
            func.sum(duration),
            func.min(CaseRow.case["source_file"].as_string()),
            func.min(CaseRow.case["source_line"].as_integer()),
        )
        .where(CaseRow.run_id == run_id, CaseRow.status.is_not(None))
        .group_by(tid)
    )
    with session_scope(url) as session:
        return {
            str(case_id): CasePlace(int(total or 0), file, None if line is None else int(line))
            for case_id, total, file, line in session.execute(query).yield_per(10_000)
        }


def _verdict(rule: str, played: Any, passed: Any, skipped: Any) -> ColumnElement[str]:
    """The verdict under `rule` in SQL, as report/verdicts.py decides it in Python."""
    passes: ColumnElement[bool]
    if rule == "all":
        passes = passed == played
    elif rule == "any":
        passes = passed >= 1
    elif rule == "majority":
        passes = passed * 2 > played
    else:
        # At least the share, in whole repetitions: passed >= ceil(share * played).
        passes = passed * 1_000_000 >= played * round(float(rule) * 1_000_000) - 1
    return case(
        (skipped == played, literal("skipped")),
        (passes, literal("passed")),
        else_=literal("failed"),
    )


def changing_cases(url: str, run_ids: Sequence[str], rule: str, *, changes: int = 2) -> set[str]:
    """The cases whose verdict changed from one run to the next at least `changes`
    times over these runs (taken in the order of their creation)."""
    if len(run_ids) < 2:
        return set()
    tid = test_id()
    played = func.count()
    passed = func.sum(case((CaseRow.status == "passed", 1), else_=0))
    skipped = func.sum(case((CaseRow.status == "skipped", 1), else_=0))
    per_run = (
        select(
            tid.label("tid"),
            RunRow.created_at.label("at"),
            RunRow.id.label("run"),
            _verdict(rule, played, passed, skipped).label("verdict"),
        )
        .join(RunRow, RunRow.id == CaseRow.run_id)
        .where(CaseRow.run_id.in_(list(run_ids)), CaseRow.status.is_not(None))
        .group_by(tid, RunRow.created_at, RunRow.id)
        .subquery()
    )
    previous = (
        func.lag(per_run.c.verdict)
        .over(partition_by=per_run.c.tid, order_by=(per_run.c.at, per_run.c.run))
        .label("previous")
    )
    paired = select(per_run.c.tid, per_run.c.verdict, previous).subquery()
    query = (
        select(paired.c.tid)
        .where(paired.c.previous.is_not(None), paired.c.previous != paired.c.verdict)
        .group_by(paired.c.tid)
        .having(func.count() >= changes)
    )
    with session_scope(url) as session:
        return {str(row) for row in session.scalars(query)}


def results_of(url: str, run_id: str, ids: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(case id, record JSON text) of these cases' conversations in the run, a chunk of
    ids at a time, each case's repetitions in order."""
    wanted = list(dict.fromkeys(ids))
    tid = test_id()
    for start in range(0, len(wanted), CHUNK):
        chunk = wanted[start : start + CHUNK]
        query = (
            select(tid, cast(CaseRow.result, Text))
            .where(
                CaseRow.run_id == run_id,
                CaseRow.result.is_not(None),
                or_(CaseRow.case_id.in_(chunk), CaseRow.test_id.in_(chunk)),
            )
            .order_by(CaseRow.seq)
        )
        with session_scope(url) as session:
            for case_id, text in session.execute(query):
                yield str(case_id), str(text)


def definitions_of(url: str, run_id: str, ids: Iterable[str]) -> dict[str, CaseDefinition]:
    """The definitions (case_definitions.py) of these cases in the run, by case id; a
    case stored before definitions were is left out."""
    wanted = list(dict.fromkeys(ids))
    tid = test_id()
    found: dict[str, CaseDefinition] = {}
    for start in range(0, len(wanted), CHUNK):
        chunk = wanted[start : start + CHUNK]
        query = select(tid, CaseRow.definition_hash, CaseRow.assertion_hashes).where(
            CaseRow.run_id == run_id,
            or_(CaseRow.case_id.in_(chunk), CaseRow.test_id.in_(chunk)),
        )
        with session_scope(url) as session:
            for case_id, case_hash, assertions in session.execute(query):
                definition = stored_definition(case_hash, assertions)
                if definition is not None:
                    found.setdefault(str(case_id), definition)
    return found


@dataclass(frozen=True)
class CaseInRun:
    """A case's records in one run, and the hash of its definition there (None: stored
    before there were)."""

    run: RunRow
    records: list[str]
    definition: str | None


def case_runs(url: str, case_id: str, suite: str | None, last: int) -> list[CaseInRun]:
    """The case's records in each of the suite's last `last` finished runs that played
    it (every suite's when `suite` is None), newest first."""
    runs = suite_runs(url, suite, finished=True, last=None if suite is None else last)
    by_id = {run.id: run for run in runs}
    found: dict[str, list[str]] = {}
    definitions: dict[str, str | None] = {}
    for start in range(0, len(runs), CHUNK):
        chunk = [run.id for run in runs[start : start + CHUNK]]
        query = (
            select(CaseRow.run_id, cast(CaseRow.result, Text), CaseRow.definition_hash)
            .where(
                CaseRow.run_id.in_(chunk),
                CaseRow.result.is_not(None),
                or_(
                    and_(CaseRow.case_id == case_id, CaseRow.test_id.is_(None)),
                    CaseRow.test_id == case_id,
                ),
            )
            .order_by(CaseRow.run_id, CaseRow.seq)
        )
        with session_scope(url) as session:
            for run_id, text, definition in session.execute(query):
                found.setdefault(str(run_id), []).append(str(text))
                definitions.setdefault(str(run_id), definition)
    ordered = [CaseInRun(by_id[i], texts, definitions.get(i)) for i, texts in found.items()]
    ordered.sort(key=lambda found: (found.run.created_at, found.run.id), reverse=True)
    return ordered[:last]


@dataclass(frozen=True)
class Pooled:
    """A case's plays over several runs under one definition: passes, failures, runs."""

    passed: int
    failed: int
    runs: int


def pooled_tallies(url: str, run_ids: Sequence[str]) -> dict[str, dict[str | None, Pooled]]:
    """Each case's passes and failures over these runs, by the hash of its definition
    (None: stored before there were), one row per case and definition."""
    if not run_ids:
        return {}
    tid = test_id()
    passed = func.sum(case((CaseRow.status == "passed", 1), else_=0))
    failed = func.sum(case((CaseRow.status == "failed", 1), else_=0))
    query = (
        select(tid, CaseRow.definition_hash, passed, failed, func.count(CaseRow.run_id.distinct()))
        .where(CaseRow.run_id.in_(list(run_ids)), CaseRow.status.is_not(None))
        .group_by(tid, CaseRow.definition_hash)
    )
    found: dict[str, dict[str | None, Pooled]] = {}
    with session_scope(url) as session:
        for case_id, definition, passes, failures, runs in session.execute(query):
            found.setdefault(str(case_id), {})[definition] = Pooled(
                int(passes or 0), int(failures or 0), int(runs)
            )
    return found


def failing_causes(
    url: str, run_id: str, judged: Callable[[str], bool] | None = None
) -> dict[str, int]:
    """The run's failed or skipped conversations by the cause their records give (the
    target's failure in a repetition of a case another repetition of which passed:
    `flake`, as report/causes.py says). Only failed and skipped records are read into
    (one row per case, status and cause), so a run that mostly passed costs little.

    `judged`, given a failed record's stored text, says whether its failure is the
    judge's after all (a criterion an audit found unstable: report/causes.py); the
    texts of the failed records the target's failure or a flake would count are read
    for it."""
    tid = test_id().label("tid")
    # Grouped by their labels: Postgres takes a JSON path bound twice for two columns.
    cause = CaseRow.result["cause"].as_string().label("cause")
    query = (
        select(tid, CaseRow.status, cause, func.count())
        .where(CaseRow.run_id == run_id, CaseRow.status.in_(("failed", "skipped")))
        .group_by("tid", CaseRow.status, "cause")
    )
    repeated_passes = (
        select(CaseRow.test_id)
        .where(CaseRow.run_id == run_id, CaseRow.test_id.is_not(None), CaseRow.status == "passed")
        .distinct()
    )
    with session_scope(url) as session:
        rows = [(str(t), str(st), c, int(n)) for t, st, c, n in session.execute(query)]
        passing = {str(found) for found in session.scalars(repeated_passes)} if rows else set()
    found: dict[str, int] = {}
    for case_id, status, named, count in rows:
        if status == "failed" and case_id in passing and named in ("agent", None):
            named = "flake"
        if named:
            found[named] = found.get(named, 0) + count
    if judged is not None and (found.get("agent") or found.get("flake")):
        for case_id, text in _target_failures(url, run_id):
            if judged(text):
                was = "flake" if case_id in passing else "agent"
                found[was] -= 1
                found["judge"] = found.get("judge", 0) + 1
    return {named: count for named, count in found.items() if count}


def _target_failures(url: str, run_id: str) -> list[tuple[str, str]]:
    """(case id, stored text) of the run's failed records whose cause is the target's."""
    cause = CaseRow.result["cause"].as_string()
    query = select(test_id(), cast(CaseRow.result, Text)).where(
        CaseRow.run_id == run_id, CaseRow.status == "failed", cause == "agent"
    )
    with session_scope(url) as session:
        return [(str(t), str(text)) for t, text in session.execute(query)]
